"""The step cursor: follow the newest step while the engine runs, or scrub back to any step."""
import streamlit as st

from minillm_visualizer.shared.engine_run import StepRecord


def step_cursor(records: list[StepRecord], key: str, live: bool, rest: int = -1) -> int:
    """A slider over the recorded steps; -> the index of the chosen record. While following, the
    cursor is on the newest step during a run and on records[rest] once the run is over."""
    steps = [r.event.step for r in records]
    follow = st.toggle("Follow the run", value=True, key=f"{key}_follow")
    if follow or st.session_state.get(key) not in steps:
        st.session_state[key] = steps[-1] if live else steps[rest]
    if len(steps) == 1:
        st.caption(f"Step {steps[0]} (the only one so far)")
        return 0
    chosen = st.select_slider("Step", steps, key=key, disabled=follow,
                              help="Turn off following to scrub through the run.")
    return steps.index(chosen)
