"""kforge-dash entry point: `streamlit run kforge_dash/app.py` (or `kforge-dash RUNS_ROOT`).

Only navigation lives here; each page renders data prepared by the prep_*.py functions.
"""

import streamlit as st

st.set_page_config(page_title="kforge", page_icon="📈", layout="wide")
page = st.navigation([
    st.Page("views/compare.py", title="Compare runs", url_path="compare", default=True),
    st.Page("views/runs.py", title="Runs table", url_path="runs"),
    st.Page("views/run_detail.py", title="Run detail", url_path="detail"),
])
page.run()
