"""Speculative decoding: a cheap proposer guesses k tokens, the target checks them all in one forward."""
import time

import pandas as pd
import streamlit as st

from minillm_visualizer.shared.engines import app_models, build_engine
from minillm_visualizer.shared.learner_parts import SPEC_LAB, default_folder, describe, failure, learner_components
from minillm_visualizer.shared.sizing import cost_note, is_real, knob_defaults, resize
from minillm_visualizer.speculative.charts import (
    LEGEND,
    acceptance_chart,
    compare_chart,
    marked_text,
    tokens_per_forward_chart,
)
from minillm_visualizer.speculative.run import (
    PROMPTS,
    PROPOSERS,
    SWEEP_KS,
    SpecRun,
    chosen_prompts,
    compare,
    draft_choices,
    engine_config,
    label,
    pooled_alpha,
    proposer_problem,
    run_prompts,
    sweep,
    tokens_needed,
)

REDRAW_S = 0.15  # while a run streams, redraw at most this often
DEFAULTS = {"method": "ngram", "k": 4, "temperature": 0.0, "max_tokens": 40,
            "prompts": ["fibonacci", "stack", "edit: rename a function"], "own": "", "ks": SWEEP_KS}
# A real model: two prompts, shorter outputs, three values of k (a run of seconds on a 2-core CPU).
REAL = {"max_tokens": 24, "prompts": ["fibonacci", "edit: rename a function"], "ks": [1, 2, 4]}

st.title("Speculative decoding")
st.markdown("A cheap proposer guesses the next k tokens and the target model checks all of them in one forward: "
            "it keeps the guesses up to the first it disagrees with, then adds one token of its own. Decoding "
            "reads all of the target's weights for every forward, so when the guesses are good, several tokens "
            "come out of one read. Verification keeps the output the target's own: the same tokens when greedy, "
            "the same distribution when sampling.")
st.caption(":material/menu_book: Taught in **lab 05, speculative decoding**: `labs/lab05_speculative.ipynb` (open the "
           "labs with `make lab`). The engine's side is in `minillm/speculative/`: the proposers (`ngram.py`, "
           "`draft.py`, `heads.py`), verification (`verify.py`) and the theory (`theory.py`).")

models = app_models()
knob_defaults("spec", DEFAULTS, REAL, models)
c = st.columns([1, 2.2, 1, 1, 1.3, 1])
model = c[0].selectbox("Target model", models, key="k_spec_model", on_change=resize("spec", DEFAULTS, REAL),
                       help="A real model starts on fewer prompts and shorter outputs.")
drafts = draft_choices(model, models)
if st.session_state.get("k_spec_draft") not in drafts:
    st.session_state["k_spec_draft"] = "pico" if "pico" in drafts else (drafts[0] if drafts else None)
# Only the proposers that can run for this model are offered; the others are named, with the reason.
missing = {m: proposer_problem(m, model, drafts[0] if drafts else None) for m in PROPOSERS}
offered = [m for m, why in missing.items() if not why]
if st.session_state.get("k_spec_method") not in offered:
    st.session_state["k_spec_method"] = offered[0]
method = c[1].radio("Proposer", offered, format_func=PROPOSERS.get, key="k_spec_method", horizontal=True)
draft = c[2].selectbox("Draft model", drafts, key="k_spec_draft", disabled=method != "draft",
                       help="A smaller model with the target's tokenizer, with its own paged KV cache; or the "
                            "target's own weights quantized (self: int4 layers, an int8 LM head), which reads a "
                            "fraction of the bytes per forward and takes the target's K/V of the prompt.")
k = int(c[3].number_input("k (proposals per step)", 0, 16, key="k_spec_k"))
temperature = float(c[4].slider("Temperature", 0.0, 1.5, step=0.1, key="k_spec_temperature",
                                help="0 is greedy: a proposal is kept when it is the target's own argmax. Above 0 "
                                     "a proposal x is kept with probability min(1, p(x) / q(x))."))
max_tokens = int(c[5].number_input("Max tokens per prompt", 1, 200, key="k_spec_max_tokens"))
p = st.columns([2, 3])
names = p[0].multiselect("Prompts", list(PROMPTS), key="k_spec_prompts",
                         help="Code to continue, and an edit whose answer repeats much of its prompt.")
own = p[1].text_area("Your own prompt (optional)", key="k_spec_own", height=80)
problem = proposer_problem(method, model, draft)
for m, why in missing.items():
    if why:
        st.info(f"**{PROPOSERS[m]}** is not offered for {model}: {why}", icon=":material/info:")
if is_real(model):
    st.caption(":material/timer: " + cost_note(model, f"Run prefills {len(names) + bool(own.strip())} prompts, "
               f"then makes at most {max_tokens} target forwards (fewer as proposals are accepted): seconds. The "
               f"sweep makes one such run per k, the comparison one per proposer."))
st.session_state.setdefault("k_mine_folder", default_folder())
mine_cols = st.columns([1.4, 2])
mine = mine_cols[0].toggle("Run with my lab 05 notebook", key="k_spec_mine",
                           help="Run (below) verifies with your `verify` (Exercise 5.3) and, with prompt lookup, "
                                "proposes with your `propose_ngram` (5.4), read from your notebook at each Run. The "
                                "k sweep and the comparison use minillm's own.")
if mine:
    mine_cols[1].text_input("Notebook folder", key="k_mine_folder",
                            help="The folder of your lab notebooks (labNN_*.ipynb); the one the sidebar's "
                                 "switch on the run pages reads.")


def show_run(run: SpecRun) -> None:
    s = run.stats
    m = st.columns(5)
    m[0].metric("Target forwards", run.steps)
    m[1].metric("Tokens out", run.output_tokens)
    m[2].metric("Acceptance rate", f"{s.acceptance_rate:.0%}" if s.reached else "-",
                help="alpha: of the proposals the target checked (it stops at the first it rejects), the share "
                     "it kept.")
    m[3].metric("Tokens per target forward", f"{s.tokens_per_forward:.2f}" if s.verifications else "-",
                help="Per sequence and verifying step: the accepted proposals plus the target's own token.")
    m[4].metric("Tokens/s", f"{run.tokens_per_second:.0f}")
    st.html(f'<div style="font-size:0.8rem;color:#495057">{LEGEND}</div>')
    cols = st.columns(2)
    for i, (name, prompt) in enumerate(run.prompts.items()):
        segments = run.segments[name]
        verified = [x for x in segments if x.verified]
        checked = sum(len(x.accepted) + (x.rejected is not None) for x in verified)
        with cols[i % 2]:
            st.caption(f"**{name}** · {sum(len(x.accepted) + len(x.own) for x in segments)} tokens in "
                       f"{len(segments)} steps · {sum(len(x.accepted) for x in verified)} of {checked} proposals "
                       f"checked were accepted")
            st.html(marked_text(prompt, segments, run.pieces))


def streaming(view):
    """on_step for run_prompts: redraw the run into `view` as it grows, at most every REDRAW_S."""
    last = [0.0]

    def on_step(run: SpecRun) -> None:
        if time.perf_counter() - last[0] >= REDRAW_S:
            last[0] = time.perf_counter()
            with view.container():
                show_run(run)
    return on_step


def settings_note(what: str, ks: list[int] | None = None) -> str:
    shown = f"k = {', '.join(map(str, ks))}" if ks else f"k = {k}"
    return (f"{what} {model}, {shown}, temperature {temperature:g}, {max_tokens} tokens per prompt, "
            f"prompts: {', '.join(chosen_prompts(names, own))}")


st.subheader("Each step's proposals")
st.caption("The chosen prompts run together through the engine (continuous batching, paged KV cache); "
           "every step, each sequence gets up to k proposals and the target verifies them in that step's forward. "
           "Hover over the text to see each step.")
run_clicked = st.button("Run", key="spec_b_run", type="primary", icon=":material/play_arrow:")
message, view = st.empty(), st.empty()
if run_clicked:
    st.session_state.pop("spec_result", None)
    try:
        prompts = chosen_prompts(names, own)
        # The learner's notebook is read at each Run: an edit is picked up by the next one.
        parts = learner_components(st.session_state["k_mine_folder"], [SPEC_LAB]) if mine else None
        config = engine_config(model, method, k, draft, len(prompts), parts, tokens_needed(prompts, max_tokens, k))
        result = run_prompts(build_engine, config, prompts, max_tokens, temperature, on_step=streaming(view))
        whose = f"; your {describe(parts)}" if parts else ""
        st.session_state["spec_result"] = (result, settings_note(f"{label(method, draft)} for") + whose)
        st.session_state.pop("spec_error", None)
    except (ValueError, FileNotFoundError) as exc:
        st.session_state["spec_error"] = f"Cannot run: {exc}"
    except Exception as exc:  # the learner's code may raise anything: the page must stay up
        if not mine:
            raise
        st.session_state["spec_error"] = f"Cannot run with your lab notebook: {failure(exc)}"
if st.session_state.get("spec_error"):
    message.error(st.session_state["spec_error"], icon=":material/error:")
if "spec_result" in st.session_state:
    result, note = st.session_state["spec_result"]
    with view.container():
        st.caption(f"Last run: {note}.")
        show_run(result)
else:
    view.info("Press **Run** to watch each step's proposals being verified.")

st.subheader("Acceptance and tokens per target forward against k")
st.caption("Short runs of the chosen proposer on the same prompts, one per k. With acceptance rate alpha, "
           "theory (Leviathan et al. 2023) expects (1 - alpha^(k+1)) / (1 - alpha) tokens per target forward, "
           "if every proposal were accepted independently with the same chance; measured points below the line "
           "show that later proposals are accepted less often than the first.")
sweep_cols = st.columns([3, 1])
ks = sweep_cols[0].multiselect("k values", list(range(1, 17)), key="k_spec_ks")
if sweep_cols[1].button("Run the k sweep", key="spec_b_sweep", icon=":material/query_stats:"):
    st.session_state.pop("spec_sweep", None)
    try:
        if problem:
            raise ValueError(problem)
        if not ks:
            raise ValueError("no k is chosen: pick at least one")
        prompts = chosen_prompts(names, own)
        with st.spinner(f"Running {len(prompts)} prompts at {len(ks)} values of k..."):
            rows, skipped = sweep(build_engine, model, method, draft, ks, prompts, max_tokens, temperature)
        st.session_state["spec_sweep"] = (rows, skipped, settings_note(f"{label(method, draft)} for", ks))
        st.session_state.pop("spec_sweep_error", None)
    except (ValueError, FileNotFoundError) as exc:
        st.session_state["spec_sweep_error"] = f"Cannot run the sweep: {exc}"
if st.session_state.get("spec_sweep_error"):
    st.error(st.session_state["spec_sweep_error"], icon=":material/error:")
if "spec_sweep" in st.session_state:
    rows, skipped, note = st.session_state["spec_sweep"]
    for reason in skipped:
        st.warning(f"Skipped {reason}")
    if rows:
        alpha = pooled_alpha(rows)
        st.caption(f"Sweep: {note}. The theory line uses the acceptance rate over all of them, alpha = {alpha:.2f}.")
        left, right = st.columns(2)
        left.plotly_chart(tokens_per_forward_chart(rows, alpha), key="spec_tpf")
        right.plotly_chart(acceptance_chart(rows, alpha), key="spec_alpha")
        table = pd.DataFrame(rows).round(3)
        st.dataframe(table, hide_index=True)
        st.download_button("Download the sweep (CSV)", table.to_csv(index=False), "spec_sweep.csv", "text/csv",
                           key="spec_dl_sweep", on_click="ignore")

st.subheader("The proposers side by side")
st.caption("Every proposer, and as drafts every model here that shares the target's tokenizer and the target's own "
           "weights quantized, on the same prompts at "
           "the same k, beside the engine without speculation. Tokens/s is wall time on this machine, one run each: "
           "a draft model's own forwards and the verification of rejected guesses cost time, so more tokens per "
           "forward is not always more tokens per second.")
if st.button("Compare the proposers", key="spec_b_compare", icon=":material/compare_arrows:"):
    st.session_state.pop("spec_compare", None)
    try:
        prompts = chosen_prompts(names, own)
        with st.spinner("Running each proposer on the same prompts..."):
            variants = [("ngram", None), *[("draft", d) for d in drafts], ("heads", None)]
            rows = compare(build_engine, model, variants, k, prompts, max_tokens, temperature)
        st.session_state["spec_compare"] = (rows, settings_note("Target"))
        st.session_state.pop("spec_compare_error", None)
    except (ValueError, FileNotFoundError) as exc:
        st.session_state["spec_compare_error"] = f"Cannot compare: {exc}"
if st.session_state.get("spec_compare_error"):
    st.error(st.session_state["spec_compare_error"], icon=":material/error:")
if "spec_compare" in st.session_state:
    rows, note = st.session_state["spec_compare"]
    st.caption(f"{note}.")
    left, right = st.columns(2)
    left.plotly_chart(compare_chart(rows), key="spec_compare_chart")
    table = pd.DataFrame(rows)[["proposer", "speedup", "tokens/s", "tokens per forward", "acceptance rate",
                                "target forwards"]]
    number = st.column_config.NumberColumn
    right.dataframe(table, hide_index=True, column_config={
        "speedup": number(format="%.2fx", help="Tokens/s over tokens/s without speculation"),
        "tokens/s": number(format="%.0f"),
        "tokens per forward": number("tokens/forward", format="%.2f"),
        "acceptance rate": number("alpha", format="%.2f", help="The acceptance rate"),
        "target forwards": number("forwards", help="Target forwards (engine steps)")})
    for row in rows:
        if row.get("note"):
            right.info(f"{row['proposer']}: {row['note']}")
