"""The Inference Engineering Lab visualizer: `make app`, or `streamlit run app/streamlit_app.py`.

The engine runs live on the real model when it is installed (else the bundled one); each run page draws one side
of it from the same run, and the Chat page holds a conversation with it. Each page is a folder of
minillm_visualizer/ (the page's script, its runs and charts), imported from this script's folder, which Streamlit
puts on sys.path.
"""
# Every run imports pandas in full before a page starts: Streamlit runs a page in a new thread as soon as the user
# leaves the last one, whose thread may still be importing pandas (a page's first chart or table pulls it in), and
# plotly reads pandas from sys.modules without waiting for that import to finish. A CI run's Kernels page died of
# "partially initialized module 'pandas' has no attribute 'Series'" so; an import statement waits for the module.
import pandas  # noqa: F401
import streamlit as st

from minillm_visualizer.shared.controls import keep_knobs, knobs

# An emoji favicon: Streamlit draws it inline, whereas a :material/...: favicon is an SVG it fetches from
# fonts.gstatic.com (the icons inside the pages come from the font it bundles), and the app stays offline.
st.set_page_config(page_title="minillm visualizer", page_icon="\N{HIGH VOLTAGE SIGN}", layout="wide")


def page(name: str, title: str, icon: str, default: bool = False) -> st.Page:
    """The page minillm_visualizer/<name>/<name>.py: Streamlit names its URL /<name> after the file, and so
    does AppTest.switch_page before the first run."""
    return st.Page(f"minillm_visualizer/{name}/{name}.py", title=title, icon=icon, default=default)


RUN_PAGES = [
    page("live", "Live engine", ":material/bolt:", default=True),
    page("timeline", "Scheduler timeline", ":material/view_timeline:"),
    page("memory", "Paged memory explorer", ":material/grid_view:"),
]
current = st.navigation({"The engine, live": [*RUN_PAGES, page("chat", "Chat", ":material/chat:")],
                         "Techniques": [page("speculative", "Speculative decoding", ":material/fast_forward:"),
                                        page("quantization", "Quantization", ":material/compress:"),
                                        page("kernels", "Kernels", ":material/grid_on:")],
                         "In production": [page("serving", "Serving", ":material/dns:"),
                                           page("cluster", "Cluster", ":material/hub:")],
                         "Models of performance": [page("roofline", "Roofline", ":material/show_chart:")]})
keep_knobs()
if current.title in [p.title for p in RUN_PAGES]:
    knobs()
current.run()
