"""The page furniture every run page shares: the knobs in the sidebar, the run buttons, and the
live refresh that redraws a view at least four times a second while the engine runs."""
from pathlib import Path

import streamlit as st
import torch

from minillm import EngineConfig
from minillm.cache.pool import block_bytes
from minillm.models.model_config import ModelConfig
from minillm.models.registry import resolve_model_path
from minillm_visualizer.shared.engine_run import EngineRun
from minillm_visualizer.shared.engines import app_models, build_engine
from minillm_visualizer.shared.learner_parts import describe, failure, learner_components, notebook_switch
from minillm_visualizer.shared.settings import DEFAULTS, default_kv_mib, engine_config, request_specs

REFRESH_S = 0.25
# Every lab notebook, by number: a page's intro names the lab that teaches what it shows.
LABS = {p.stem[3:5]: f"labs/{p.stem}.ipynb"
        for p in sorted((Path(__file__).resolve().parents[3] / "solutions").glob("lab[0-9][0-9]_*.py"))}


def intro(text: str, lab: str, topic: str) -> None:
    """Two sentences on what the page shows, and the lab that teaches it."""
    st.markdown(text)
    st.caption(f":material/menu_book: Taught in **lab {lab}, {topic}**: `{LABS[lab]}` (open the labs with `make lab`).")


def keep_knobs() -> None:
    """Knob values survive visiting a page that does not show them (Streamlit forgets the state of
    widgets it did not draw; state we assign ourselves it keeps)."""
    for key in [k for k in st.session_state if k.startswith("k_")]:
        st.session_state[key] = st.session_state[key]
    if "k_model" not in st.session_state:
        model = app_models()[0]
        st.session_state["k_model"] = model
        st.session_state.setdefault("k_kv_mib", default_kv_mib(model))
    for name, value in DEFAULTS.items():
        st.session_state.setdefault(f"k_{name}", value)


def _model_changed() -> None:
    """Another model: the KV budget follows it, to the same number of blocks (settings.default_kv_mib)."""
    st.session_state["k_kv_mib"] = default_kv_mib(st.session_state["k_model"])


def knobs() -> dict:
    """The run settings in the sidebar; -> their values by name."""
    sb = st.sidebar
    sb.header("Run settings")
    sb.caption("They apply when you press **Run**.")
    notebook_switch()
    sb.selectbox("Model", app_models(), key="k_model", on_change=_model_changed,
                 help="The KV budget follows the model: the same number of blocks for each.")
    with sb.expander("Requests", expanded=True):
        st.radio("Requests", ["Seeded workload", "My prompts"], key="k_source", horizontal=True,
                 label_visibility="collapsed")
        if st.session_state["k_source"] == "My prompts":
            st.text_area("Prompts, one per line", key="k_prompts", height=110)
            st.number_input("Max tokens per prompt", 1, 400, key="k_max_tokens")
        else:
            st.number_input("Requests", 0, 200, key="k_n_requests")
            st.number_input("Arrival rate (requests/s, 0 = all at once)", 0.0, 1000.0, step=2.0, key="k_rate")
            st.number_input("Shared prefix (tokens)", 0, 128, key="k_shared_prefix",
                            help="Every prompt opens with the same tokens, like a system prompt.")
            st.number_input("Workload seed", 0, 2**31, key="k_workload_seed")
        st.number_input("Samples per request (n)", 1, 8, key="k_n_samples", help="They share the prompt's blocks.")
        st.slider("Temperature", 0.0, 2.0, step=0.1, key="k_temperature")
        st.slider("Top-p", 0.05, 1.0, step=0.05, key="k_top_p")
    with sb.expander("KV cache", expanded=True):
        st.radio("Layout", ["paged", "contiguous"], key="k_kv_cache", horizontal=True)
        st.radio("Attention backend", ["torch", "triton"], key="k_attention_backend", horizontal=True,
                 help="triton: the Triton kernels read K/V in place in the paged pool (the Kernels page shows them).")
        if st.session_state["k_attention_backend"] == "triton" and not torch.cuda.is_available():
            st.caption("No GPU: the Triton kernels run in Triton's interpreter, same tokens, much slower.")
        st.number_input("Block size (tokens)", 0, 256, key="k_block_size")
        st.number_input("KV budget (MiB)", 0.0, 4096.0, step=0.5, format="%.2f", key="k_kv_mib")
        st.checkbox("Prefix caching", key="k_prefix_caching")
        _pool_caption()
    with sb.expander("Scheduler", expanded=True):
        st.radio("Policy", ["continuous", "static", "sequential"], key="k_scheduler", horizontal=True)
        st.number_input("Max batch (sequences)", 0, 256, key="k_max_num_seqs")
        st.number_input("Token budget per step (chunk size)", 0, 8192, step=64, key="k_max_batched_tokens")
        st.checkbox("Chunked prefill", key="k_chunked_prefill")
    sb.slider("Slow motion (ms between steps)", 0, 500, step=10, key="k_pace_ms",
              help="Idle time after each step, to watch it happen. Latencies include it.")
    return knob_values()


def knob_values() -> dict:
    return {name: st.session_state[f"k_{name}"] for name in {**DEFAULTS, "model": None}}


def _pool_caption() -> None:
    try:
        cfg = ModelConfig.from_file(resolve_model_path(st.session_state["k_model"]) / "config.json")
        per_block = block_bytes(cfg, max(1, int(st.session_state["k_block_size"])), EngineConfig().torch_dtype)
    except (ValueError, FileNotFoundError):
        return
    blocks = int(st.session_state["k_kv_mib"] * 2**20) // per_block
    st.caption(f"= {blocks} blocks of {per_block / 1024:.0f} KiB for this model")


def current_run() -> EngineRun | None:
    return st.session_state.get("run")


def start_run() -> None:
    """Build an engine with the knobs' settings and start it (a button callback: it runs before
    the page is drawn, so the page draws the new run's buttons and view)."""
    values = knob_values()
    stop_run()
    st.session_state.pop("run_error", None)
    try:
        # The learner's notebooks are read here, at each Run: an edit is picked up by the next one.
        components = learner_components(values["mine_folder"], values["mine_labs"]) if values["mine"] else None
        engine = build_engine(engine_config(values, components))
        specs = request_specs(values, engine.tokenizer, engine.max_model_len)
        run = EngineRun(engine, specs, pace=values["pace_ms"] / 1000)
    except (ValueError, FileNotFoundError) as exc:
        st.session_state["run_error"] = f"Cannot run: {exc}"
        return
    except Exception as exc:  # the learner's code may raise anything: the page must stay up
        if not values["mine"]:
            raise
        st.session_state["run_error"] = f"Cannot run with your lab notebook: {failure(exc)}"
        return
    if not run.samples and not run.pending:
        run.stop()
        st.session_state["run_error"] = "Cannot run: the engine refused every request: " + run.rejected[0]
        return
    st.session_state["run"] = run


def stop_run() -> None:
    run = current_run()
    if run is not None and run.active:
        run.stop()


def run_controls() -> None:
    """Run / Pause / Step / Resume / Stop, the run's status, and any message for the learner."""
    run = current_run()
    active, paused = run is not None and run.active, run is not None and run.status == "paused"
    cols = st.columns([1.2, 1, 1, 1, 1, 4])
    cols[0].button("Run", type="primary", key="b_run", icon=":material/play_arrow:", on_click=start_run)
    cols[1].button("Pause", key="b_pause", icon=":material/pause:", disabled=not active or paused,
                   on_click=lambda: run.pause())
    cols[2].button("Step", key="b_step", icon=":material/skip_next:", disabled=not paused,
                   on_click=lambda: run.step_once())
    cols[3].button("Resume", key="b_resume", icon=":material/resume:", disabled=not paused,
                   on_click=lambda: run.resume())
    cols[4].button("Stop", key="b_stop", icon=":material/stop:", disabled=not active, on_click=stop_run)
    if st.session_state.get("run_error"):
        st.error(st.session_state["run_error"], icon=":material/error:")
    whose_parts(run)


def whose_parts(run: EngineRun | None) -> None:
    """Say when the engine on the page runs the learner's parts, and what the next Run will use."""
    parts = run.engine.config.components if run is not None else None
    switch = st.session_state.get("k_mine", False)
    if parts is not None and parts.replaced():
        st.markdown(f":violet-badge[:material/school: Your parts] This run's engine runs your {describe(parts)}; "
                    "every other part is minillm's own.")
        if not switch:
            st.caption("**Run with my lab notebook** is off: the next Run uses minillm's own parts.")
    elif switch:
        st.caption(":material/school: **Run with my lab notebook** is on: press **Run** to run the engine with "
                   "your parts.")


def status_line(run: EngineRun) -> None:
    if run.error and run.engine.config.components.replaced():
        st.error(f"Your part failed in the engine: {failure(run.exception)}", icon=":material/error:")
        freed = run.final_kv is not None and run.final_kv.used_blocks == 0
        st.caption("Fix it in your notebook and press **Run** again (the notebook is read at each Run), or turn "
                   "off **Run with my lab notebook** to run minillm's own parts. "
                   + ("The run's blocks were all given back." if freed else
                      "Not every block could be given back; the next Run starts with a fresh pool."))
    elif run.error:
        st.error(f"The engine failed: {run.error}")
    for message in run.rejected[:5]:
        st.warning(f"Request refused by the engine: {message}")
    note = {"running": "running", "paused": "paused: press Step or Resume", "finished": "finished",
            "stopped": "stopped: unfinished requests aborted, their blocks freed", "failed": "failed"}
    st.caption(f"Run {note[run.status]} · {len(run.samples)} samples admitted, {run.pending} still to arrive")


def live(render) -> None:
    """Draw render(run) in a fragment that redraws itself every REFRESH_S while the run is active;
    when the run ends, one full rerun turns the polling off (and updates the buttons)."""
    run = current_run()
    every = REFRESH_S if run is not None and run.active else None

    @st.fragment(run_every=every)
    def view() -> None:
        now = current_run()
        if now is None:
            st.info("Press **Run** to start the engine with the settings on the left.")
            return
        status_line(now)
        render(now)
        if every is not None and not now.active:
            st.rerun()

    view()
