"""Paged memory explorer: block tables, prefix sharing, and what paging saves over contiguous caches."""
import pandas as pd
import streamlit as st

from minillm.cache.pool import block_bytes
from minillm_visualizer.memory.charts import pool_over_time, waste_chart, waste_rows, workload_of
from minillm_visualizer.shared.block_map import block_map, request_colors
from minillm_visualizer.shared.controls import intro, live, run_controls
from minillm_visualizer.shared.cursor import step_cursor
from minillm_visualizer.shared.engine_run import EngineRun

st.title("Paged memory explorer")
intro("Every sequence reaches its tokens through a block table, a list of block ids in the shared pool; blocks "
      "of a common prompt prefix are shared, and finished prompts stay cached for the next request. At the "
      "bottom, the same requests replayed through a contiguous allocator show the memory paging saves.",
      "03", "paged KV cache & prefix caching")
run_controls()


def block_tables(record, samples) -> pd.DataFrame:
    """Each running sample's block table at this step, and which of its blocks are shared."""
    owner = record.event.kv.block_owner
    end = record.event.start + record.event.duration
    rows = []
    for key, table in record.tables.items():
        s = samples[key]
        tokens = s.prompt_tokens + sum(t <= end for t in s.token_times)
        shared = [b for b in table if b < len(owner) and owner[b] == "shared"]
        rows.append({"sequence": key, "state": record.states.get(key), "tokens": tokens, "blocks": len(table),
                     "shared blocks": len(shared), "block table": " ".join(map(str, table))})
    return pd.DataFrame(rows, columns=["sequence", "state", "tokens", "blocks", "shared blocks", "block table"])


def sharing(record) -> pd.DataFrame:
    users: dict[int, list[str]] = {}
    for key, table in record.tables.items():
        for b in table:
            users.setdefault(b, []).append(key)
    return pd.DataFrame([{"block": b, "shared by": ", ".join(keys)} for b, keys in sorted(users.items())
                         if len(keys) > 1], columns=["block", "shared by"])


def render(run: EngineRun) -> None:
    records, samples = run.snapshot()
    if not records:
        st.info("No step has run yet.")
        return
    busiest = max(range(len(records)), key=lambda j: records[j].event.kv.used_blocks)
    i = step_cursor(records, "memory_cursor", run.active, rest=busiest)
    if not run.active and st.session_state["memory_cursor_follow"]:
        st.caption("The run is over: the cursor rests on the step that held the most blocks.")
    record = records[i]
    kv = record.event.kv
    if kv.kind == "contiguous":
        st.warning("This run used the contiguous KV cache: each sequence holds one max-length reservation, "
                   "so there are no block tables to show. Choose the paged layout and run again.")
    colors = request_colors([s.request_id for s in samples.values()])
    left, right = st.columns([3, 2])
    left.plotly_chart(block_map(kv, colors), key="mem_block_map")
    with right:
        m = st.columns(3)
        m[0].metric("Used blocks", f"{kv.used_blocks} / {kv.total_blocks}")
        m[1].metric("Shared", sum(o == "shared" for o in kv.block_owner))
        m[2].metric("Cached", kv.cached_blocks)
        m = st.columns(3)
        m[0].metric("Fragmentation", f"{kv.fragmentation:.0%}")
        m[1].metric("Prefix hit rate", f"{kv.prefix_hit_rate:.0%}")
        m[2].metric("Block size", kv.block_size)
        shared = sharing(record)
        st.caption("Blocks shared by several sequences at this step")
        st.dataframe(shared, hide_index=True, height=150)
    tables = block_tables(record, samples)
    st.subheader(f"Block tables at step {record.event.step}")
    st.dataframe(tables, hide_index=True)
    st.download_button("Download the block tables (CSV)", tables.to_csv(index=False), "block_tables.csv",
                       "text/csv", key="dl_tables", on_click="ignore")
    st.plotly_chart(pool_over_time(records, record.event.step), key="pool")
    st.subheader("Contiguous vs paged, for these requests")
    workload = workload_of(samples)
    if not workload:
        st.info("The comparison appears once requests have produced tokens.")
        return
    config = run.engine.config
    if kv.kind == "paged":
        pool_tokens = kv.total_blocks * kv.block_size
    else:  # the pool the same KV budget would have made
        pool_tokens = config.cache.kv_cache_memory // block_bytes(run.engine.model_config, 1, run.engine.dtype)
    rows = waste_rows(workload, config.cache.block_size, pool_tokens, run.engine.max_model_len)
    st.caption(f"An allocator replay of this run's {len(workload)} requests (their prompt and output lengths; no "
               f"model runs), with the same pool of {pool_tokens:,} token slots. Waste is the share of reserved "
               f"slots holding no token, time-weighted; requests at once is measured while requests are queued.")
    left, right = st.columns([3, 2])
    left.plotly_chart(waste_chart(rows), key="waste")
    table = pd.DataFrame(rows)
    right.dataframe(table, hide_index=True)
    right.download_button("Download the comparison (CSV)", table.to_csv(index=False), "contiguous_vs_paged.csv",
                          "text/csv", key="dl_waste", on_click="ignore")


live(render)
