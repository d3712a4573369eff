"""The Inference Engineering Lab visualizer: `make app`, or `streamlit run app/streamlit_app.py`.

The engine runs live on the bundled model; each page draws one side of it from the same run.
"""
import sys
from pathlib import Path

import streamlit as st

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `visualizer` sits beside this file

from visualizer.controls import keep_knobs, knobs  # noqa: E402

st.set_page_config(page_title="minillm visualizer", page_icon=":material/memory:", layout="wide")

RUN_PAGES = [
    st.Page("views/live.py", title="Live engine", icon=":material/bolt:", default=True),
    st.Page("views/timeline.py", title="Scheduler timeline", icon=":material/view_timeline:"),
    st.Page("views/memory.py", title="Paged memory explorer", icon=":material/grid_view:"),
]
page = st.navigation({"The engine, live": RUN_PAGES,
                      "Models of performance": [st.Page("views/roofline.py", title="Roofline", icon=":material/show_chart:")]})
keep_knobs()
if page.title in [p.title for p in RUN_PAGES]:
    knobs()
page.run()
