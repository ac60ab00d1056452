"""kforge-dash entry point: `streamlit run kforge_dash/browse/app.py` (or `kforge-dash RUNS_ROOT`).

Only navigation lives here; each page renders data prepared by the plain functions of browse/.
Every page has its own URL (/compare, /runs, /detail, /hosts) that works when typed; the root URL is a
hidden page that moves on to /compare with the same query parameters (Streamlit serves its
default page only at "/", so /compare could not be the default page and a typed URL at once).
"""

import streamlit as st

st.set_page_config(page_title="kforge", page_icon="📈", layout="wide")
COMPARE = st.Page("views/compare.py", title="Compare runs", url_path="compare")


def _home() -> None:
    st.switch_page(COMPARE, query_params={k: st.query_params.get_all(k) for k in st.query_params})


page = st.navigation([
    st.Page(_home, title="kforge", url_path="home", default=True, visibility="hidden"),
    COMPARE,
    st.Page("views/runs.py", title="Runs table", url_path="runs"),
    st.Page("views/run_detail.py", title="Run detail", url_path="detail"),
    st.Page("views/hosts.py", title="Hosts", url_path="hosts"),
])
page.run()
