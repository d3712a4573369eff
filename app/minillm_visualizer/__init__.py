"""The visualizer's pages, one folder each: <page>/<page>.py is the script st.navigation runs (its name is
the page's URL), and that page's runs and charts sit beside it. shared/ holds what several pages use: the
engine run and its knobs, the step cursor, the shared weights, the learner's parts, the block map, the
roofline, the common look.

Not installed: Streamlit puts app/ (the folder of streamlit_app.py) on sys.path, and tests/app/conftest.py
does the same, so the app and its tests import these very files.
"""
