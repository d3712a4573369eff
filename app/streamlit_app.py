"""The Inference Engineering Lab visualizer: `make app`, or `streamlit run app/streamlit_app.py`.

The engine runs live on the bundled model; each page draws one side of it from the same run.
"""
import streamlit as st

from visualizer.controls import keep_knobs, knobs

# An emoji favicon: Streamlit draws it inline, whereas a :material/...: favicon is an SVG it fetches from
# fonts.gstatic.com (the icons inside the pages come from the font it bundles), and the app stays offline.
st.set_page_config(page_title="minillm visualizer", page_icon="\N{HIGH VOLTAGE SIGN}", layout="wide")

RUN_PAGES = [
    st.Page("views/live.py", title="Live engine", icon=":material/bolt:", default=True),
    st.Page("views/timeline.py", title="Scheduler timeline", icon=":material/view_timeline:"),
    st.Page("views/memory.py", title="Paged memory explorer", icon=":material/grid_view:"),
]
page = st.navigation({"The engine, live": RUN_PAGES,
                      "Techniques": [st.Page("views/speculative.py", title="Speculative decoding",
                                             icon=":material/fast_forward:"),
                                     st.Page("views/quantization.py", title="Quantization",
                                             icon=":material/compress:"),
                                     st.Page("views/kernels.py", title="Kernels", icon=":material/grid_on:")],
                      "In production": [st.Page("views/serving.py", title="Serving", icon=":material/dns:"),
                                        st.Page("views/cluster.py", title="Cluster", icon=":material/hub:")],
                      "Models of performance": [st.Page("views/roofline.py", title="Roofline",
                                                        icon=":material/show_chart:")]})
keep_knobs()
if page.title in [p.title for p in RUN_PAGES]:
    knobs()
page.run()
