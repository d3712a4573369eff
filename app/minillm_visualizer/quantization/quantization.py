"""Quantization: weights in fewer bits, what it costs in quality, and what the memory buys."""
import pandas as pd
import streamlit as st

from minillm.labkit.plug import LabPartError
from minillm.quant import PROJECTIONS, SCHEMES
from minillm.quant.codecs import FP8_DTYPE
from minillm.quant.quant_config import LAYER_PROJECTIONS, QuantConfig
from minillm_visualizer.quantization.charts import LEGEND, budget_chart, parted_text, sensitivity_heatmap
from minillm_visualizer.quantization.run import (
    engine_config,
    first_difference,
    greedy,
    kv_fit,
    measure,
    model_config,
    quant_config,
    reference,
    sensitivity,
    sensitivity_cells,
    window_shape,
)
from minillm_visualizer.shared.engines import app_models, build_engine
from minillm_visualizer.shared.learner_parts import QUANT_LAB, default_folder, describe, failure, learner_components
from minillm_visualizer.shared.sizing import cost_note, is_real, knob_defaults, resize, sequence_bound
from minillm_visualizer.shared.style import MIB

SCHEME_NAMES = {"int8": "int8 (one scale per row)", "int4": "int4 (groups of inputs)", "fp8": "fp8 (e4m3)"}
DEFAULTS = {"scheme": "int4", "group_size": 64, "projections": list(LAYER_PROJECTIONS), "budget_mib": 32.0,
            "block_size": 16, "prompt": "def read_config(path):", "max_tokens": 48}
REAL = {"budget_mib": 768.0, "max_tokens": 24}  # a real model: 540 MiB of fp32 weights, two engines to generate

st.title("Quantization")
st.markdown("Decoding reads every weight once per step, so smaller weights mean less memory to hold and less to "
            "read. Weight-only quantization stores each matrix in 8 or 4 bits with a float scale per row or per "
            "group, and rebuilds it in every forward. Pick a scheme and the matrices it applies to: the page "
            "measures what it costs in quality against the full-precision model, and what the saved memory buys.")
st.caption(f":material/menu_book: Taught in **lab {QUANT_LAB}, quantization**: `labs/lab06_quantization.ipynb` "
           "(open the labs with `make lab`). The engine's side is in `minillm/quant/`: the codecs (`codecs.py`), "
           "the quantized linear layer (`linear.py`), the policy (`config.py`), quality (`eval.py`) and "
           "sensitivity (`sensitivity.py`).")

models = app_models()
knob_defaults("quant", DEFAULTS, REAL, models)
schemes = [s for s in SCHEMES if s != "fp8" or FP8_DTYPE is not None]
c = st.columns([1, 2.4, 1.2])
model = c[0].selectbox("Model", models, key="k_quant_model", on_change=resize("quant", DEFAULTS, REAL),
                       help="A real model is scored on a shorter text, on a press.")
cfg = model_config(model)
scheme = c[1].radio("Scheme", schemes, format_func=SCHEME_NAMES.get, key="k_quant_scheme", horizontal=True,
                    help="int8: symmetric, one scale per output row. int4: 16 levels between each group's min and "
                         "max, with its own scale and zero point. fp8: 8-bit floats (e4m3), one scale per row.")
group_size = int(c[2].number_input(
    "Group size (int4)", 1, 4096, step=32, key="k_quant_group_size", disabled=scheme != "int4",
    help=f"How many consecutive inputs of a row share one scale and zero point: smaller groups follow the weights "
         f"more closely and cost more scales. The usual sizes are 32, 64 and 128. A group must be whole, so the "
         f"size must divide each chosen matrix's input size ({cfg.hidden_size} for most, {cfg.intermediate_size} "
         f"for down_proj in {model})."))
layer_ids = list(range(cfg.num_hidden_layers))
if "k_quant_layers" not in st.session_state or any(i not in layer_ids for i in st.session_state["k_quant_layers"]):
    st.session_state["k_quant_layers"] = layer_ids  # the first visit, or another model with fewer layers
p = st.columns([1, 2])
layers = p[0].multiselect("Decoder layers", layer_ids, key="k_quant_layers", format_func=lambda i: f"layer {i}",
                          help=f"{model} has {len(layer_ids)} decoder layers; those left out stay in full precision.")
projections = p[1].multiselect("Projections", list(PROJECTIONS), key="k_quant_projections",
                               format_func=lambda n: n.removesuffix("_proj"),
                               help="The matrices of each chosen layer: attention's q, k, v and o, the MLP's gate, "
                                    "up and down. lm_head is the output matrix (shared with the embedding in "
                                    f"{model}; the embedding itself, a lookup, stays in full precision).")
st.session_state.setdefault("k_mine_folder", default_folder())
mine_cols = st.columns([1.4, 2])
mine = mine_cols[0].toggle(f"Run with my lab {QUANT_LAB} notebook", key="k_quant_mine",
                           help="Generate (below) quantizes with your codecs and multiplies with your int4 linear "
                                f"layer, read from your lab {QUANT_LAB} notebook at each press, and scores your "
                                "quantized model (fp8 has no exercise: it stays minillm's). The figures above it "
                                "and the heatmap use minillm's own.")
if mine:
    mine_cols[1].text_input("Notebook folder", key="k_mine_folder",
                            help="The folder of your lab notebooks (labNN_*.ipynb); the one the sidebar's "
                                 "switch on the run pages reads.")

windows, window_tokens = window_shape(model)


def scored_now(model: str, config: QuantConfig) -> bool:
    """The bundled models are scored as the knobs change (a blink each); a real model on a press, since a
    quantized copy of it and its forwards on the held-out windows take seconds."""
    if not is_real(model):
        return True
    st.caption(":material/timer: " + cost_note(model, f"Scoring a configuration quantizes a copy of the model and "
               f"runs it on {windows} windows of {window_tokens} tokens, beside the full model's (scored once): "
               f"seconds. Each configuration is scored once, then kept."))
    done = st.session_state.setdefault("quant_scored", set())
    if (model, config) not in done:
        if not st.button(f"Measure {config.label()}", key="quant_b_measure", type="primary",
                         icon=":material/play_arrow:"):
            st.info(f"Press **Measure {config.label()}** to score it against the full-precision model.")
            return False
        done.add((model, config))
    return True


try:
    config = quant_config(scheme, group_size, layers, projections, len(layer_ids))
    if not scored_now(model, config):
        st.stop()
    ref = reference(model)
    measured = measure(model, config)
except ValueError as exc:
    st.error(f"Cannot quantize: {exc}", icon=":material/error:")
    st.stop()

st.subheader(f"Quality and size: {config.label()}")
q, full, b = measured.quality, measured.full, measured.bytes
m = st.columns(5)
m[0].metric("Perplexity", f"{q.perplexity:.3f}", f"{q.perplexity - full.perplexity:+.3f}", delta_color="inverse",
            help=f"exp of the mean next-token loss on held-out text: lower is better. The full-precision model "
                 f"scores {full.perplexity:.3f}; the arrow is the change.")
m[1].metric("KL from full precision", f"{q.kl:.2e}",
            help="How far each next-token distribution moved, in nats, averaged over the positions (0: not at all). "
                 "It sees changes the perplexity averages away.")
m[2].metric("Top-1 agreement", f"{q.top1:.1%}",
            help="The share of positions where both models put the same token first.")
m[3].metric("Quantized matrices", f"{b['quantized'] / MIB:.2f} MiB",
            f"{b['quantized_fp32'] / b['quantized']:.1f}x smaller" if b["quantized"] else None, delta_color="green",
            delta_arrow="off",
            help=f"Codes, scales and zero points of the matrices quantized, against the same matrices in fp32 "
                 f"({b['quantized_fp32'] / MIB:.2f} MiB).")
m[4].metric("Whole model", f"{b['total'] / MIB:.2f} MiB",
            f"{measured.full_bytes['total'] / b['total']:.2f}x smaller", delta_color="green", delta_arrow="off",
            help=f"Every weight as stored: the matrices, the embedding and the norms; "
                 f"{measured.full_bytes['total'] / MIB:.2f} MiB in full precision (fp32).")
spread = f"{min(q.kl_per_window):.1e} to {max(q.kl_per_window):.1e}"
unseen = (f"from the bundled models' held-out text (Python's standard library, which {model} may have read in its "
          f"training)" if is_real(model) else "from text the model never trained on")
st.caption(f"Measured on {windows} held-out windows of {window_tokens} tokens ({q.tokens:,} next-token predictions) "
           f"{unseen}. The KL of each window ranges {spread}: differences between "
           f"configurations smaller than that spread are noise.")

st.subheader("What the memory buys: room for the KV cache")
st.caption("A server holds the weights and a pool of KV blocks in the same memory. Whatever the weights free up "
           "becomes KV blocks: more tokens of context, more sequences in a batch. Each block holds the keys and "
           "values of its tokens in every layer.")
g = st.columns([1, 1, 4])
budget = float(g[0].number_input("Memory budget (MiB)", 1.0, 65536.0, step=4.0, key="k_quant_budget_mib"))
block_size = int(g[1].number_input("Block size (tokens)", 1, 256, key="k_quant_block_size"))
dtype = engine_config(model, None).torch_dtype
fits = {"full precision (fp32)": kv_fit(cfg, measured.full_bytes["total"], int(budget * MIB), block_size, dtype),
        config.label(): kv_fit(cfg, b["total"], int(budget * MIB), block_size, dtype)}
g[2].plotly_chart(budget_chart(fits, int(budget * MIB)), key="quant_budget")
full_fit, quant_fit = fits.values()
st.caption(f"One block of {block_size} tokens is {full_fit['block_bytes'] / 1024:.0f} KiB in {model}. In "
           f"{budget:g} MiB, the full-precision model leaves room for {full_fit['blocks']:,} blocks "
           f"({full_fit['tokens']:,} tokens, {full_fit['full_contexts']} sequences of the full "
           f"{cfg.max_position_embeddings}-token context); quantized, {quant_fit['blocks']:,} blocks "
           f"({quant_fit['tokens']:,} tokens, {quant_fit['full_contexts']} full-context sequences).")

st.subheader("The same prompt, greedy, side by side")
st.caption("Both engines take the most likely token at every step. They agree as long as quantization never changes "
           "which token is on top; once one token differs, the two texts go their own ways.")
t = st.columns([3, 1])
prompt = t[0].text_area("Prompt", key="k_quant_prompt", height=80)
max_tokens = int(t[1].number_input("Tokens to generate", 1, 400, key="k_quant_max_tokens"))
if t[1].button("Generate", key="quant_b_generate", type="primary", icon=":material/play_arrow:"):
    st.session_state.pop("quant_generation", None)
    st.session_state.pop("quant_generation_error", None)
    try:
        # The learner's notebook is read at each press: an edit is picked up by the next one.
        parts = learner_components(st.session_state["k_mine_folder"], [QUANT_LAB]) if mine else None
        tokens = sequence_bound(prompt, max_tokens)
        plain, _ = greedy(build_engine, engine_config(model, None, tokens=tokens), prompt, max_tokens)
        quantized, qmodel = greedy(build_engine, engine_config(model, config, parts, tokens), prompt, max_tokens)
        yours = ref.compare(qmodel) if parts else None
        whose = f"your {describe(parts)}" if parts else "minillm's own codecs"
        st.session_state["quant_generation"] = (plain, quantized, yours, prompt, f"{config.label()}, {whose}")
    except (ValueError, FileNotFoundError) as exc:
        st.session_state["quant_generation_error"] = f"Cannot generate: {exc}"
    except LabPartError as exc:
        st.session_state["quant_generation_error"] = f"Cannot run with your lab notebook: {failure(exc)}"
    except Exception as exc:  # the learner's code may raise anything: the page must stay up
        if not mine:
            raise
        st.session_state["quant_generation_error"] = f"Cannot run with your lab notebook: {failure(exc)}"
if st.session_state.get("quant_generation_error"):
    st.error(st.session_state["quant_generation_error"], icon=":material/error:")
if "quant_generation" in st.session_state:
    plain, quantized, yours, shown_prompt, note = st.session_state["quant_generation"]
    first = first_difference(plain.token_ids, quantized.token_ids)
    same = len(plain.token_ids) if first is None else first
    st.caption(f"Last run: {note}. The two agree on the first {same} of {len(plain.token_ids)} tokens"
               + ("." if first is None else f"; they part at token {first + 1}."))
    st.html(f'<div style="font-size:0.8rem;color:#495057">{LEGEND}</div>')
    left, right = st.columns(2)
    for col, name, gen in ((left, "Full precision (fp32)", plain), (right, f"Quantized: {note}", quantized)):
        col.markdown(f"**{name}** · {gen.ms_per_token:.1f} ms per token")
        col.html(parted_text(shown_prompt, gen.pieces, first))
    if yours is not None:
        st.info(f"Your quantized model on the held-out windows: perplexity {yours.perplexity:.3f}, KL {yours.kl:.2e}, "
                f"top-1 {yours.top1:.1%} (minillm's own: {q.perplexity:.3f}, {q.kl:.2e}, {q.top1:.1%}).")
    st.caption("Time per token is wall time on this machine. Here the weights are rebuilt from their codes in "
               "every forward in plain PyTorch, so the quantized engine is not faster on a CPU; a fused kernel "
               "(lab 07) reads the small codes and dequantizes in registers, which is where the speed comes from.")
else:
    st.info("Press **Generate** to continue the prompt with both engines.")

st.subheader("Which matrices are sensitive?")
base = QuantConfig(scheme, group_size=group_size)
cells = sensitivity_cells(len(layer_ids))
st.caption(f"Each cell quantizes one matrix of one layer alone with {base.label()}, everything else in full "
           f"precision, and measures the KL from the full model on the same held-out windows; darker is more "
           f"sensitive. Quantizing several matrices does not simply add their cells up: errors can also cancel.")
done = st.session_state.setdefault("quant_heatmaps", {})
key = (model, base)
# Each cell is a quantized copy scored on the windows: a blink on a bundled model, ~4 s on SmolLM2-135M (2-core CPU).
cost = "about a quarter of an hour on a 2-core CPU" if is_real(model) else "tens of seconds"
if st.button(f"Measure the sensitivity ({cells} cells: {cost})", key="quant_b_heatmap",
             icon=":material/grid_on:"):
    st.session_state.pop("quant_heatmap_error", None)
    try:
        with st.spinner(f"Quantizing and scoring {cells} matrices one at a time..."):
            done[key] = sensitivity(model, base)
    except ValueError as exc:
        st.session_state["quant_heatmap_error"] = f"Cannot measure the sensitivity: {exc}"
if st.session_state.get("quant_heatmap_error"):
    st.error(st.session_state["quant_heatmap_error"], icon=":material/error:")
if key in done:
    rows = done[key]
    st.plotly_chart(sensitivity_heatmap(rows, base.label()), key="quant_heatmap")
    table = pd.DataFrame(rows).sort_values("kl", ascending=False)
    st.download_button("Download the cells (CSV)", table.to_csv(index=False), "quant_sensitivity.csv", "text/csv",
                       key="quant_dl_heatmap", on_click="ignore")
else:
    st.info(f"Press the button to measure every cell for {base.label()} (computed once, then kept).")
