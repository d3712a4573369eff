"""Roofline: where prefill and decode sit against the hardware's compute and bandwidth limits."""
import json

import pandas as pd
import streamlit as st

from minillm import EngineConfig
from minillm.arith import cdiv
from minillm.models.registry import bundled_models
from minillm.perf import (
    PROFILES,
    bound,
    decode_cost,
    dtype_bytes,
    kv_bytes_per_token,
    measure_engine,
    measure_machine,
    model_shape,
    param_count,
    predicted_time,
    prefill_cost,
)
from minillm.perf.shapes import shape_names
from minillm_visualizer.shared.controls import intro
from minillm_visualizer.shared.engines import build_engine
from minillm_visualizer.shared.roofline_chart import roofline_chart

THIS_MACHINE = "This machine (measured)"
DECODE_STEPS = 16

st.title("Roofline")
intro("A model step does a number of FLOPs and moves a number of bytes, and the hardware's peak compute and "
      "memory bandwidth bound how fast it can go: prefill (many tokens per weight read) sits right, under the "
      "compute roof, while decode (one token per sequence per weight read) sits left, under the bandwidth slope. "
      "Pick hardware, model, batch and context to place both, and measure the engine on this machine beside "
      "the prediction.", "00", "roofline & the memory wall")


@st.cache_resource(show_spinner="Measuring this machine's bandwidth and FLOP/s (about a second)...")
def this_machine():
    return measure_machine()


c = st.columns(5)
hw_name = c[0].selectbox("Hardware", [THIS_MACHINE, *PROFILES], key="roof_hw")
model = c[1].selectbox("Model", shape_names(), key="roof_model")
dtype = c[2].selectbox("Weights and KV dtype", ["float32", "bfloat16", "float16", "int8"], key="roof_dtype")
batch = c[3].number_input("Batch (sequences)", 0, 4096, 8, key="roof_batch")
context = c[4].number_input("Context (tokens)", 0, 131072, 128, key="roof_context")

hw = this_machine() if hw_name == THIS_MACHINE else PROFILES[hw_name]
cfg = model_shape(model)
problems = []
if batch < 1 or context < 1:
    problems.append(f"batch and context must be at least 1 (got batch {batch}, context {context})")
if context > cfg.max_position_embeddings:
    problems.append(f"{model} reads at most {cfg.max_position_embeddings:,} tokens of context; got {context:,}")
if problems:
    for p in problems:
        st.error(f"Cannot place the operations: {p}.")
    st.stop()

costs = {"prefill": prefill_cost(cfg, batch, context, dtype), "decode": decode_cost(cfg, batch, context, dtype)}
rows, points = [], []
for phase, cost in costs.items():
    seconds = predicted_time(hw, cost, dtype)
    rows.append({"operation": f"{phase} (predicted)", "FLOPs": cost.flops, "bytes": cost.bytes,
                 "FLOP/byte": round(cost.intensity, 2), "bound": bound(hw, cost, dtype),
                 "time ms": round(1000 * seconds, 4), "tokens/s": round(cost.tokens / seconds, 1)})
    points.append({"name": f"{phase}, predicted", "intensity": cost.intensity, "flops": cost.flops / seconds,
                   "kind": "predicted"})

measured = st.session_state.get("roof_measured")
can_measure = model in bundled_models()
engine_dtype = str(EngineConfig().torch_dtype).removeprefix("torch.")
if measured and measured["key"] == (model, batch, context):
    if hw_name == THIS_MACHINE and dtype == engine_dtype:
        decode_measured = decode_cost(cfg, batch, round(measured["decode_context"]), dtype)
        for phase, seconds, cost in (("prefill", measured["prefill_s"], costs["prefill"]),
                                     ("decode", measured["decode_s"], decode_measured)):
            predicted = predicted_time(hw, cost, dtype)
            rows.append({"operation": f"{phase} (measured, engine)", "FLOPs": cost.flops, "bytes": cost.bytes,
                         "FLOP/byte": round(cost.intensity, 2), "bound": f"{predicted / seconds:.0%} of the roof",
                         "time ms": round(1000 * seconds, 4), "tokens/s": round(cost.tokens / seconds, 1)})
            points.append({"name": f"{phase}, measured", "intensity": cost.intensity, "flops": cost.flops / seconds,
                           "kind": "measured"})
    else:
        st.info(f"The engine was measured on this machine in {engine_dtype}: choose '{THIS_MACHINE}' and "
                f"{engine_dtype} to see the measured points beside the prediction.")

st.plotly_chart(roofline_chart(hw, dtype, points), key="roofline")
table = pd.DataFrame(rows)
st.dataframe(table, hide_index=True)
d = st.columns(2)
d[0].download_button("Download (CSV)", table.to_csv(index=False), "roofline.csv", "text/csv", key="dl_roof_csv",
                     on_click="ignore")
d[1].download_button("Download (JSON)", json.dumps({"hardware": hw.name, "model": model, "dtype": dtype,
                                                    "batch": batch, "context": context, "rows": rows}, indent=1),
                     "roofline.json", "application/json", key="dl_roof_json", on_click="ignore")

total = param_count(cfg) * dtype_bytes(dtype) + batch * context * kv_bytes_per_token(cfg, dtype)
note = (f"{model}: {param_count(cfg) / 1e6:,.1f} M weights in the linear layers; "
        f"weights + KV cache = {total / 1e9:.3g} GB")
if total > hw.memory_bytes:
    st.warning(f"{note}, more than the {hw.memory_bytes / 1e9:.3g} GB of one {hw.name}: it would be split over "
               f"{cdiv(total, hw.memory_bytes):.0f} of them.")
else:
    st.caption(f"{note}, within the {hw.memory_bytes / 1e9:.3g} GB of {hw.name}.")
st.caption(f"Figures: {hw.source}. {hw.notes}")

st.subheader("Measure the engine here")
if not can_measure:
    st.caption(f"{model} is a shape only (no weights here): the engine can be measured on the bundled models "
               f"({', '.join(bundled_models())}).")
elif batch * context > 16384 or context + DECODE_STEPS + 1 > cfg.max_position_embeddings:
    st.warning(f"Measuring {batch} x {context} tokens is too much for this page: keep batch x context within "
               f"16,384 tokens and context within {cfg.max_position_embeddings - DECODE_STEPS - 1} for {model}.")
elif st.button(f"Measure {model}: prefill {batch} x {context} tokens, then {DECODE_STEPS} decode steps",
               key="b_measure", icon=":material/timer:"):
    blocks = batch * (cdiv(context + DECODE_STEPS + 1, 16) + 1)
    engine = build_engine(EngineConfig.from_knobs(model, max_num_seqs=batch, max_num_batched_tokens=batch * context,
                                                  enable_chunked_prefill=False, enable_prefix_caching=False,
                                                  num_kv_blocks=blocks))
    with st.spinner("Running the engine..."):
        result = measure_engine(engine, batch, context, DECODE_STEPS)
    st.session_state["roof_measured"] = {**result, "key": (model, batch, context)}
    st.rerun()
