"""The Quantization page: quality and bytes of the chosen configuration against full precision, the KV blocks a
memory budget holds, the same prompt greedy side by side, the sensitivity heatmap, and messages instead of
tracebacks for a choice that cannot be quantized or a lab notebook that cannot run."""
from pathlib import Path

import pytest
import torch
from app_pages import APP, errors, figures

from minillm import LLM, SamplingParams
from minillm.cache.pool import block_bytes
from minillm.experiments.quant_quality import Reference, heldout_windows
from minillm.experiments.quant_sensitivity import measure
from minillm.labkit.notebook import learner_copy, read_source, to_json
from minillm.labkit.plug import PARTS
from minillm.models.registry import resolve_model_path
from minillm.quant import QuantConfig, QuantizedLinear
from minillm_visualizer.quantization.charts import FIRST_DIFFERENT, parted_text
from minillm_visualizer.quantization.run import WINDOW_TOKENS, WINDOWS, first_difference

ROOT = Path(__file__).resolve().parents[2]
MIB = 2**20
LAB06_SOURCES = sorted((ROOT / "solutions").glob("lab06_*.py"))
LAB06_READY = (any(exercise.startswith("6.") for exercise, _ in PARTS.values())
               and any((ROOT / "solutions").glob("lab06_*.ipynb")))


@pytest.fixture
def quant():
    """The page alone (no other page is drawn first), on tiny, with its defaults (int4, groups of 64, everything)."""
    from streamlit.testing.v1 import AppTest
    at = AppTest.from_file(str(APP), default_timeout=180)
    at.switch_page("minillm_visualizer/quantization/quantization.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


@pytest.fixture(scope="module")
def tiny():
    """The oracle: tiny loaded apart from the page, and its log-probabilities on the same held-out windows."""
    model = LLM("tiny").model
    return model, Reference(model, heldout_windows(resolve_model_path("tiny"), count=WINDOWS, seq_len=WINDOW_TOKENS))


def press(at, key: str):
    at.button(key=key).click().run()
    assert not at.exception, [e.value for e in at.exception]


def metrics(at) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def fp32_and_int8_bytes(model: torch.nn.Module, layers: list[int]) -> tuple[int, int]:
    """The chosen layers' matrices: bytes in fp32, and as int8 (one byte a weight, a float32 scale a row)."""
    linears = [m for i in layers for m in model.model.layers[i].modules() if isinstance(m, torch.nn.Linear)]
    return sum(4 * m.weight.numel() for m in linears), sum(m.weight.numel() + 4 * m.out_features for m in linears)


def test_the_default_page_measures_int4_against_full_precision(quant, tiny):
    assert quant.title[0].value == "Quantization" and not errors(quant)
    assert quant.subheader[0].value == "Quality and size: int4-g64"
    full, ref = tiny
    expected = measure(full, ref, QuantConfig("int4", group_size=64))
    shown = metrics(quant)
    assert shown["Perplexity"] == f"{expected.perplexity:.3f}"
    assert shown["KL from full precision"] == f"{expected.kl:.2e}"
    assert shown["Top-1 agreement"] == f"{expected.top1:.1%}"
    assert expected.kl > 0 and expected.top1 < 1 and expected.perplexity > ref.quality.perplexity
    quantized = sum(m.weight_bytes() for m in LLM("tiny", quantization=QuantConfig("int4")).model.modules()
                    if isinstance(m, QuantizedLinear))
    assert shown["Quantized matrices"] == f"{quantized / MIB:.2f} MiB"
    assert any(f"{WINDOWS} held-out windows of {WINDOW_TOKENS} tokens" in c.value for c in quant.caption)
    assert any("Press **Generate**" in i.value for i in quant.info) and any("Press the button" in i.value
                                                                          for i in quant.info)


def test_smaller_weights_leave_room_for_more_kv_blocks_in_the_budget(quant, tiny):
    quant.number_input(key="k_quant_budget_mib").set_value(24.0).run()
    bars = {t["name"]: t for t in figures(quant)["Weights and KV blocks in one memory budget"]["data"]}
    full, _ = tiny
    per_block = block_bytes(full.config, 16, torch.float32)
    weights = [w * MIB for w in bars["weights"]["customdata"]]
    blocks = [int(text.split()[0].replace(",", "")) for text in bars["KV blocks"]["text"]]
    assert blocks == [max(0, 24 * MIB - round(w)) // per_block for w in weights]
    assert weights[0] == pytest.approx(sum(p.numel() * 4 for p in full.parameters()), rel=1e-6)
    assert blocks[1] > 4 * blocks[0], "int4 weights free room for several times the KV blocks"
    quant.number_input(key="k_quant_budget_mib").set_value(8.0).run()
    blocks = figures(quant)["Weights and KV blocks in one memory budget"]["data"][1]["text"]
    assert blocks[0] == "0 blocks" and blocks[1] != "0 blocks", "fp32 tiny does not fit 8 MiB; int4 tiny does"


def test_changing_model_scheme_and_layers_measures_only_those_layers(quant):
    quant.selectbox(key="k_quant_model").set_value("pico").run()
    assert quant.multiselect(key="k_quant_layers").value == [0, 1, 2, 3], "tiny's six layers give way to pico's four"
    quant.radio(key="k_quant_scheme").set_value("int8").run()
    quant.multiselect(key="k_quant_layers").set_value([0, 1]).run()
    assert not quant.exception and not errors(quant)
    assert quant.subheader[0].value == "Quality and size: int8 layers 0,1"
    fp32, int8 = fp32_and_int8_bytes(LLM("pico").model, [0, 1])
    shown = metrics(quant)
    assert shown["Quantized matrices"] == f"{int8 / MIB:.2f} MiB"
    assert next(m for m in quant.metric if m.label == "Quantized matrices").delta == f"{fp32 / int8:.1f}x smaller"
    assert float(shown["KL from full precision"]) < 1e-3, "int8 on two layers barely moves the distributions"


def test_the_same_prompt_side_by_side_marks_where_the_texts_part(quant):
    press(quant, "quant_b_generate")
    assert not errors(quant)
    plain, quantized, yours, _, note = quant.session_state["quant_generation"]
    assert yours is None and note == "int4-g64, minillm's own codecs"
    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    prompt = "def read_config(path):"
    assert plain.token_ids == LLM("tiny").generate(prompt, params)[0].token_ids
    assert quantized.token_ids == LLM("tiny", quantization=QuantConfig("int4")).generate(prompt, params)[0].token_ids
    first = first_difference(plain.token_ids, quantized.token_ids)
    boxes = [h.value for h in quant.html if h.value.startswith("<div style=\"font-family")]
    assert len(boxes) == 2
    for box in boxes:
        assert box.count(f'<span style="{FIRST_DIFFERENT}">') == (first is not None)
    same = len(plain.token_ids) if first is None else first
    assert any(c.value.startswith(f"Last run: int4-g64, minillm's own codecs. The two agree on the first {same} of 48")
               for c in quant.caption)


def test_the_heatmap_is_measured_on_demand_and_kept(quant, tiny):
    assert "Sensitivity: each matrix quantized alone (int4-g64)" not in figures(quant)
    press(quant, "quant_b_heatmap")
    heatmap = figures(quant)["Sensitivity: each matrix quantized alone (int4-g64)"]["data"][0]
    assert heatmap["y"] == [f"layer {i}" for i in range(6)]
    assert heatmap["x"] == ["q", "k", "v", "o", "gate", "up", "down"]
    full, ref = tiny
    down = measure(full, ref, QuantConfig("int4", layers=(5,), projections=("down_proj",)))
    assert heatmap["customdata"][5][6][0] == pytest.approx(down.kl, rel=1e-4)
    quant.number_input(key="k_quant_budget_mib").set_value(40.0).run()  # any redraw keeps the heatmap
    assert "Sensitivity: each matrix quantized alone (int4-g64)" in figures(quant)


@pytest.mark.parametrize(("change", "message"), [
    ({"k_quant_group_size": 96}, "Cannot quantize: cannot quantize q_proj/k_proj/v_proj (256 inputs): group_size 96 "
                                 "does not divide the input dimension 256"),
    ({"k_quant_projections": []}, "Cannot quantize: projections must be a non-empty list"),
    ({"k_quant_layers": []}, "Cannot quantize: no decoder layer is chosen and lm_head is not among the projections"),
])
def test_a_choice_that_cannot_be_quantized_gets_a_message(quant, change, message):
    for key, value in change.items():
        widget = quant.number_input(key=key) if key == "k_quant_group_size" else quant.multiselect(key=key)
        widget.set_value(value).run()
    assert not quant.exception
    assert any(e.startswith(message) for e in errors(quant)), errors(quant)
    assert not figures(quant), "nothing is drawn for a configuration that does not exist"


def test_a_group_size_the_heatmap_cannot_use_is_said_at_the_button(quant):
    """Groups of 96 divide down_proj's 768 inputs, so that alone is measured, but not the 256 of every other matrix."""
    quant.multiselect(key="k_quant_projections").set_value(["down_proj"]).run()
    quant.number_input(key="k_quant_group_size").set_value(96).run()
    assert quant.subheader[0].value == "Quality and size: int4-g96 (down)" and not errors(quant)
    press(quant, "quant_b_heatmap")
    assert any(e.startswith("Cannot measure the sensitivity: cannot quantize q_proj") for e in errors(quant))


def test_first_difference_and_the_marked_token():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2
    html = parted_text("a < b", ["x", "\n", "<y>"], first=1)
    assert "a &lt; b" in html and "<y>" not in html
    assert f'<span style="{FIRST_DIFFERENT}">\u21b5\n</span>' in html, "a newline that differs is seen"
    assert parted_text("p", ["x", "y"], first=None).count("<span") == 1, "identical texts: only the prompt is styled"


@pytest.mark.parametrize("notebook", ["solutions", "stubs"])
def test_generate_with_my_lab_06_notebook_uses_my_parts_or_says_why_not(quant, tmp_path, notebook):
    """The solutions stand in for a finished notebook, a freshly generated learner copy for an untouched one.
    Until lab 06 builds engine parts (minillm.labkit.plug.PARTS), the switch says so, and nothing breaks."""
    folder = ROOT / "solutions"
    if notebook == "stubs":
        if not LAB06_READY:
            pytest.skip("lab 06 has no solution notebook with engine parts yet")
        source, folder = LAB06_SOURCES[0], tmp_path
        (tmp_path / f"{source.stem}.ipynb").write_text(to_json(learner_copy(read_source(source), source.stem)))
    quant.toggle(key="k_quant_mine").set_value(True).run()
    quant.text_input(key="k_mine_folder").set_value(str(folder)).run()
    press(quant, "quant_b_generate")
    if not LAB06_READY:
        assert "quant_generation" not in quant.session_state
        assert any(e.startswith("Cannot") and "06" in e for e in errors(quant)), errors(quant)
    elif notebook == "solutions":
        _, _, yours, _, note = quant.session_state["quant_generation"]
        assert not errors(quant) and "your exercises 6." in note and "lab06_" in note
        shown = float(metrics(quant)["KL from full precision"])
        assert yours.kl == pytest.approx(shown, rel=0.05), "the solutions quantize as minillm does"
        assert any(i.value.startswith("Your quantized model on the held-out windows") for i in quant.info)
    else:
        assert "quant_generation" not in quant.session_state
        message = errors(quant)[0]
        assert message.startswith("Cannot run with your lab notebook: Exercise 6.") and "not implemented" in message, \
            message
