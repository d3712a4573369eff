"""What the visualizer's tests share besides fixtures: the app's script, and reading a page under AppTest (its
figures, its errors, a run pressed to its end). A module of its own, not conftest.py: two folders' conftest.py
imported by one pytest process shadow each other's name."""
import json
from pathlib import Path

APP = Path(__file__).resolve().parents[2] / "app" / "streamlit_app.py"


def run_to_end(at, timeout: float = 60):
    """Press Run, wait for the engine to finish, redraw; -> the EngineRun."""
    at.button(key="b_run").click().run()
    assert not at.exception, [e.value for e in at.exception]
    run = at.session_state["run"]
    assert run.wait(timeout), "the run did not finish in time"
    assert run.status == "finished", f"the run ended {run.status}: {run.error}"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return run


def figures(at) -> dict[str, dict]:
    """The page's Plotly figures by title: {"data": [...traces], "layout": {...}}."""
    out = {}
    for chart in at.get("plotly_chart"):
        spec = json.loads(chart.proto.spec)
        out[spec["layout"]["title"]["text"]] = spec
    return out


def errors(at) -> list[str]:
    return [e.value for e in at.error]
