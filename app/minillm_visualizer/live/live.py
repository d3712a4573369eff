"""Live engine: token streams, the KV block map, memory, and latency as the engine steps."""
import pandas as pd
import streamlit as st

from minillm_visualizer.live.charts import itl_chart, memory_gauge, throughput_chart, ttft_chart
from minillm_visualizer.shared.block_map import block_map, request_colors
from minillm_visualizer.shared.controls import intro, live, run_controls
from minillm_visualizer.shared.engine_run import EngineRun

st.title("Live engine")
intro("Requests stream through the engine as you watch: each one's text grows, its KV blocks fill the pool, "
      "and time to first token, inter-token latency and throughput are measured per step. Change the knobs "
      "on the left and run again to see what the KV cache and the scheduler do to memory and latency.",
      "04", "batching & scheduling")
st.caption(":material/menu_book: Each step's forward pass (RMSNorm, RoPE, grouped-query attention, SwiGLU) is the one "
           "you write in **lab 01, a transformer from scratch**: `labs/lab01_transformer.ipynb`.")
st.caption(":material/menu_book: TTFT, TPOT and the KV cache these requests decode with are built in **lab 02, "
           "generation & the KV cache**: `labs/lab02_generation.ipynb` (solution: `solutions/lab02_generation.py`).")
run_controls()


def request_table(run: EngineRun, records, samples) -> pd.DataFrame:
    states = records[-1].states if records and run.active else {}
    rows = []
    for key, s in samples.items():
        ttft = s.token_times[0] - s.arrival if s.token_times else None
        gaps = [b - a for a, b in zip(s.token_times, s.token_times[1:])]
        rows.append({"request": key,
                     "state": s.finish_reason and f"done ({s.finish_reason})" or states.get(key, "arriving"),
                     "prompt tokens": s.prompt_tokens, "output tokens": len(s.token_times),
                     "TTFT ms": None if ttft is None else round(1000 * ttft, 1),
                     "mean ITL ms": round(1000 * sum(gaps) / len(gaps), 2) if gaps else None, "text": s.text})
    return pd.DataFrame(rows)


def render(run: EngineRun) -> None:
    records, samples = run.snapshot()
    kv = (records[-1].event.kv if run.active and records
          else (run.final_kv or (records[-1].event.kv if records else None)))
    tokens = sum(r.event.output_tokens for r in records)
    last = records[-1].event if records else None
    m = st.columns(7)
    m[0].metric("Steps", len(records))
    m[1].metric("Tokens out", tokens)
    m[2].metric("Running / waiting", f"{last.running} / {last.waiting}" if last and run.active else "0 / 0")
    m[3].metric("KV used", f"{kv.used_bytes / 2**20:.2f} MiB" if kv else "-")
    m[4].metric("Fragmentation", f"{kv.fragmentation:.0%}" if kv else "-", help="Slots in used blocks holding no token")
    m[5].metric("Prefix hit rate", f"{kv.prefix_hit_rate:.0%}" if kv else "-")
    m[6].metric("Preemptions", records[-1].event.num_preemptions if records else 0)
    if kv is not None:
        colors = request_colors([s.request_id for s in samples.values()])
        left, right = st.columns([3, 2])
        left.plotly_chart(block_map(kv, colors), key="block_map")
        left.caption("Grey: free · light blue: cached (a finished prompt's blocks, reusable until evicted) · "
                     "black **S**: shared by several sequences · each request has its own colour."
                     + (" The run is over: every block is back in the pool." if run.final_kv is not None
                        and run.final_kv.used_blocks == 0 else ""))
        right.plotly_chart(memory_gauge(kv), key="memory_gauge")
    c = st.columns(3)
    c[0].plotly_chart(ttft_chart(samples), key="ttft")
    c[1].plotly_chart(itl_chart(samples, run.start_time), key="itl")
    c[2].plotly_chart(throughput_chart(records, run.start_time), key="throughput")
    table = request_table(run, records, samples)
    running = [k for k, s in samples.items() if s.text and s.finish_reason is None]
    done = [k for k, s in samples.items() if s.text and s.finish_reason is not None]
    streaming = (running + done[::-1])[:6]  # the texts still growing first, then the latest finished
    if streaming:
        st.subheader("Streams")
        cols = st.columns(3)
        for i, key in enumerate(streaming):
            cols[i % 3].code(samples[key].text[-400:] or " ", language="python", wrap_lines=True)
            cols[i % 3].caption(f"{key}: {len(samples[key].token_times)} tokens")
    st.subheader("Requests")
    st.dataframe(table, hide_index=True, height=260)
    st.download_button("Download the requests (CSV)", table.to_csv(index=False), "requests.csv", "text/csv",
                       key="dl_requests", on_click="ignore")


live(render)
