"""The Speculative decoding page: each step's proposals marked, the k sweep beside the theory, the proposers
compared, and messages instead of tracebacks when a setting or a proposer cannot run."""
from pathlib import Path

import pytest
from app_pages import APP, errors, figures

from minillm import EngineConfig
from minillm.engine.engine import LLMEngine
from minillm.labkit.notebook import learner_copy, read_source, to_json
from minillm.speculative.heads import HEADS_FILE, SpecHeads, save_heads
from minillm.speculative.theory import expected_tokens_per_forward
from minillm_visualizer.shared.style import BOX
from minillm_visualizer.speculative import run as spec_run
from minillm_visualizer.speculative.charts import ACCEPTED, OWN, REJECTED, UNREACHED, marked_text
from minillm_visualizer.speculative.run import Segment, chosen_prompts, engine_config, run_prompts

ROOT = Path(__file__).resolve().parents[2]
FAST = {"k_spec_prompts": ["fibonacci", "edit: rename a function"], "k_spec_max_tokens": 12, "k_spec_ks": [1, 4]}


@pytest.fixture
def spec():
    """The page alone (no other page is drawn first), on tiny, with two prompts and short outputs."""
    from streamlit.testing.v1 import AppTest
    at = AppTest.from_file(str(APP), default_timeout=60)
    for key, value in FAST.items():
        at.session_state[key] = value
    at.switch_page("minillm_visualizer/speculative/speculative.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def press(at, key: str):
    at.button(key=key).click().run()
    assert not at.exception, [e.value for e in at.exception]


def test_the_page_renders_before_any_run(spec):
    assert spec.title[0].value == "Speculative decoding"
    assert any("each step's proposals" in i.value for i in spec.info)
    assert not figures(spec) and not errors(spec)


def test_a_run_with_prompt_lookup_marks_accepted_and_rejected_proposals(spec):
    press(spec, "spec_b_run")
    marked = [h.value for h in spec.html if h.value.startswith(f'<div style="{BOX}">')]
    assert len(marked) == 2, "one marked text per prompt"
    text = "".join(marked)
    assert f'<span style="{ACCEPTED}">' in text and f'<span style="{REJECTED}">' in text
    assert f'<span style="{OWN}">' in text, "the target's own token after each verification is bold"
    result, _ = spec.session_state["spec_result"]
    assert result.output_tokens == 2 * 12 and result.stats.verifications > 0
    metrics = {m.label: m.value for m in spec.metric}
    assert metrics["Tokens out"] == "24" and metrics["Acceptance rate"].endswith("%")


def test_the_marked_tokens_are_the_targets_own_greedy_output():
    """Accepted proposals plus the target's own tokens, step by step, are exactly what the target alone writes."""
    prompts = chosen_prompts(["fibonacci", "edit: rename a function"], "")
    spec = run_prompts(LLMEngine, engine_config("tiny", "ngram", 3, None, 2), prompts, 12, 0.0)
    plain = run_prompts(LLMEngine, engine_config("tiny", None, 3, None, 2), prompts, 12, 0.0)
    for name in prompts:
        tokens = lambda run: [t for s in run.segments[name] for t in s.accepted + s.own]  # noqa: E731
        assert tokens(spec) == tokens(plain), name
    steps = sum(len(segments) for segments in spec.segments.values())
    assert spec.stats.accepted > 0 and steps == 2 * 12 - spec.stats.accepted, "each accepted proposal saves a forward"


def test_the_k_sweep_draws_measured_points_beside_the_theory_line(spec):
    press(spec, "spec_b_sweep")
    table = next(df.value for df in spec.dataframe if df.value.columns[0] == "k")
    assert list(table["k"]) == [1, 4]
    chart = figures(spec)["Tokens per target forward against k"]
    traces = {t["name"].split(",")[0]: t for t in chart["data"]}
    assert list(traces["measured"]["y"]) == pytest.approx(list(table["tokens per forward"]), abs=1e-3)
    alpha = spec_run.pooled_alpha(table.to_dict("records"))
    theory = traces["theory"]
    assert theory["y"] == pytest.approx([expected_tokens_per_forward(alpha, k) for k in theory["x"]], abs=1e-3)
    assert "Acceptance rate against k" in figures(spec)


def test_bad_input_gets_a_message_not_a_traceback(spec):
    spec.number_input(key="k_spec_k").set_value(0).run()
    for button, message in (("spec_b_run", "Cannot run: speculative k must be an integer >= 1, got 0"),
                            ("spec_b_compare", "Cannot compare: speculative k must be an integer >= 1, got 0")):
        press(spec, button)
        assert message in errors(spec), errors(spec)
    spec.number_input(key="k_spec_k").set_value(4).run()
    spec.multiselect(key="k_spec_prompts").set_value([]).run()
    press(spec, "spec_b_run")
    assert any("no prompt is chosen" in e for e in errors(spec)), errors(spec)
    press(spec, "spec_b_sweep")
    assert any(e.startswith("Cannot run the sweep: no prompt is chosen") for e in errors(spec)), errors(spec)


def test_missing_heads_are_not_offered_and_the_page_says_how_to_train_them(spec, monkeypatch, tmp_path):
    spec.radio(key="k_spec_method").set_value("heads").run()
    monkeypatch.setattr(spec_run, "heads_path", lambda model: tmp_path / HEADS_FILE)
    spec.run()
    assert spec.radio(key="k_spec_method").options == ["prompt lookup (n-gram)", "draft model"]
    assert spec.radio(key="k_spec_method").value == "ngram", "a proposer that cannot run gives way to prompt lookup"
    assert any("not offered for tiny" in i.value and "python -m minillm train heads" in i.value for i in spec.info)
    with pytest.raises(ValueError, match="No prediction heads have been trained for tiny"):
        engine_config("tiny", "heads", 4, None, 1)


def test_only_models_with_the_targets_tokenizer_and_its_own_weights_are_offered_as_drafts(spec):
    assert spec.selectbox(key="k_spec_draft").options == ["pico", "pico-distilled", spec_run.SELF_DRAFT]
    assert spec_run.drafts_for("pico", ["tiny", "pico", "pico-distilled"]) == ["tiny", "pico-distilled"]


def test_the_proposers_are_compared_on_the_same_prompts(spec, monkeypatch, tmp_path):
    """Untrained heads (each starts as the identity) stand in for trained ones: the table is the same on
    every machine, whether or not tiny's heads have been trained here."""
    target = LLMEngine(EngineConfig.from_knobs("tiny", num_kv_blocks=4)).model
    save_heads(SpecHeads(target.config.hidden_size, 4), target, tmp_path / HEADS_FILE)
    monkeypatch.setattr(spec_run, "heads_path", lambda model: tmp_path / HEADS_FILE)
    press(spec, "spec_b_compare")
    table = next(df.value for df in spec.dataframe if df.value.columns[0] == "proposer").set_index("proposer")
    assert list(table.index) == ["none (no speculation)", "prompt lookup (n-gram)", "draft model (pico)",
                                 "draft model (pico-distilled)", f"draft model ({spec_run.SELF_DRAFT})",
                                 "prediction heads (MTP)"]
    assert table.loc["none (no speculation)", "speedup"] == 1.0
    assert (table["tokens per forward"].iloc[1:5] > 1).all(), "prompt lookup and the drafts save target forwards"
    assert table.loc[f"draft model ({spec_run.SELF_DRAFT})", "acceptance rate"] > 0.8, "the model, rounded"
    assert table.loc["prediction heads (MTP)", "tokens per forward"] >= 1
    bars = figures(spec)["Tokens/s on the same prompts"]["data"][0]
    assert len(bars["x"]) == 6 and all(y > 0 for y in bars["y"])


@pytest.mark.parametrize("notebook", ["solutions", "stubs"])
def test_a_run_with_my_lab_05_notebook_uses_my_parts_or_names_the_exercise(spec, tmp_path, notebook):
    """The solutions stand in for a finished notebook, a freshly generated learner copy for an untouched one."""
    folder = ROOT / "solutions"
    if notebook == "stubs":
        source, folder = ROOT / "solutions" / "lab05_speculative.py", tmp_path
        (tmp_path / "lab05_speculative.ipynb").write_text(to_json(learner_copy(read_source(source), source.stem)))
    spec.toggle(key="k_spec_mine").set_value(True).run()
    spec.text_input(key="k_mine_folder").set_value(str(folder)).run()
    press(spec, "spec_b_run")
    if notebook == "solutions":
        result, note = spec.session_state["spec_result"]
        assert result.stats.verifications > 0 and not errors(spec)
        assert "your exercises 5.3 `verify`, 5.4 `propose_ngram`, 5.7 `propose_heads`, from" in note
        assert "lab05_speculative" in note
    else:
        assert "spec_result" not in spec.session_state
        message = errors(spec)[0]
        assert message.startswith("Cannot run with your lab notebook: Exercise 5.4") and "not implemented" in message, \
            message


def test_marked_text_orders_and_escapes_each_steps_tokens():
    pieces = {1: "a", 2: "<b>", 3: "c", 4: "\n", 5: "e"}
    html = marked_text("x < y", [Segment(1, own=[5]), Segment(2, accepted=[1, 2], rejected=3, unreached=[4],
                                                                  own=[5], verified=True)], pieces)
    assert "x &lt; y" in html and "<b>" not in html
    order = [html.index(f'<span style="{style}">{text}') for style, text in
             ((ACCEPTED, "a"), (ACCEPTED, "&lt;b&gt;"), (REJECTED, "c"), (UNREACHED, "\u21b5<"), (OWN, "e"))]
    assert order == sorted(order)
    assert 'title="step 2: 2 of 4 proposals accepted"' in html


def test_the_pool_holds_every_prompts_full_context():
    config = engine_config("tiny", "ngram", 8, None, 3)
    assert isinstance(config, EngineConfig)
    assert config.cache.num_kv_blocks * config.cache.block_size >= 3 * 512
