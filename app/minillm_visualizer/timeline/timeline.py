"""Scheduler timeline: what the scheduler gave each request at every step, scrubbable."""
import json
from dataclasses import asdict

import pandas as pd
import streamlit as st

from minillm_visualizer.shared.controls import intro, live, run_controls
from minillm_visualizer.shared.cursor import step_cursor
from minillm_visualizer.shared.engine_run import EngineRun
from minillm_visualizer.timeline.charts import budget_chart, gantt, queue_chart

st.title("Scheduler timeline")
intro("Each row is a request and each column an engine step: blue when the scheduler gave it a prefill chunk, "
      "green for a decode token, yellow when it held its blocks but got no tokens, grey while queued and red "
      "after a preemption. Below, the queues and how much of each step's token budget was used.",
      "04", "batching & scheduling")
run_controls()


def step_log(records) -> list[dict]:
    return [{"step": r.event.step, "duration_ms": round(1000 * r.event.duration, 3), "waiting": r.event.waiting,
             "running": r.event.running, "tokens_sampled": r.event.output_tokens,
             "preempted": r.event.preempted, "preemptions_so_far": r.event.num_preemptions,
             "scheduled": [asdict(w) for w in r.event.scheduled], "states": r.states} for r in records]


def render(run: EngineRun) -> None:
    records, samples = run.snapshot()
    if not records:
        st.info("No step has run yet.")
        return
    i = step_cursor(records, "timeline_cursor", run.active)
    cursor = records[i].event.step
    st.plotly_chart(gantt(records, list(samples), cursor), key="gantt")
    left, right = st.columns(2)
    left.plotly_chart(queue_chart(records, cursor), key="queues")
    right.plotly_chart(budget_chart(records, run.engine.config.scheduler.max_num_batched_tokens, cursor), key="budget")
    event = records[i].event
    st.subheader(f"Step {event.step}: {1000 * event.duration:.1f} ms, {event.running} running, {event.waiting} waiting")
    work = pd.DataFrame([asdict(w) for w in event.scheduled])
    st.dataframe(work, hide_index=True)
    log = step_log(records)
    st.download_button("Download the step log (JSON)", json.dumps(log, indent=1), "steps.json", "application/json",
                       key="dl_steps", on_click="ignore")
    st.download_button("Download this step's work (CSV)", work.to_csv(index=False), f"step_{event.step}.csv",
                       "text/csv", key="dl_step", on_click="ignore")


live(render)
