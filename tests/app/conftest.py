"""Fixtures for the visualizer's tests: the app under Streamlit's AppTest, on the small bundled model."""
import os
import sys

import pytest
import torch
from app_pages import APP

# Streamlit runs the app with the script's folder first on sys.path: that is how the pages import
# minillm_visualizer, which is not installed. The tests do the same, so they import the very files the app runs.
sys.path.insert(0, str(APP.parent))
# The app starts on the real model when it is installed; its tests start on tiny (the browser test's server
# inherits this too). Set MINILLM_APP_MODEL yourself to run them on another model.
os.environ.setdefault("MINILLM_APP_MODEL", "tiny")


@pytest.fixture(autouse=True)
def one_torch_thread():
    """The page's thread and the engine's share two cores: one torch thread each avoids thrashing."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True, scope="module")
def _page_caches_dropped():
    """A page's st.cache_resource and st.cache_data live as long as the process: under AppTest, as long as the
    test worker. They are dropped when each module ends (servers stopped by their on_release), or a worker
    would carry a module's models into the rest of the suite: after the real-model pages, 1.2 GB of SmolLM2."""
    yield
    import streamlit as st
    st.cache_resource.clear()
    st.cache_data.clear()


@pytest.fixture
def app():
    """The app, on `pico`, with a small workload that arrives at once (fast, and the same every run)."""
    from streamlit.testing.v1 import AppTest
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.session_state["k_model"] = "pico"
    at.session_state["k_n_requests"] = 8
    at.session_state["k_rate"] = 0.0
    at.run()
    yield at
    run = at.session_state["run"] if "run" in at.session_state else None
    if run is not None:
        run.stop()
