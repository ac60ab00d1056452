"""Compare runs: overlay metrics of the selected runs. Render only; data comes from prep_*."""

import streamlit as st

from kforge_dash.browse import downloads as prep_export
from kforge_dash.browse import figures as prep_figures
from kforge_dash.browse import runs as prep_runs
from kforge_dash.browse import series as prep_series
from kforge_dash.browse.views import common

st.title("Compare runs")
root = common.runs_root()
runs = common.load_runs(root)
common.ingest_panel(root, runs)
ingested = {r.name: r for r in runs if r.ingested}
if not ingested:
    st.info(f"No ingested runs under {root} yet.")
    st.stop()
colours = prep_runs.run_colours([r.name for r in runs])

with st.sidebar:
    query = st.text_input("Search runs by name or tag", key="query")
    all_tags = sorted({t for r in ingested.values() for t in r.tags})
    tags = st.multiselect("Only runs tagged", all_tags, key="tags") if all_tags else []
matching = [r.name for r in prep_runs.filter_runs(list(ingested.values()), query=query, tags=tags)]
options = prep_runs.selectable(matching, st.session_state.get("runs", []), list(ingested))
# bind: the selection lives in the URL (?runs=a&runs=b); names that are not runs here are dropped.
selected = st.multiselect("Runs", options, key="runs", bind="query-params", placeholder="Pick runs to compare")
if not selected:
    st.info(f"{len(matching)} run(s) match. Pick runs to compare.")
    st.stop()
sources = [ingested[n].source() for n in selected]

try:
    metrics_all = prep_series.available_metrics([prep_series.steps_schema(s.steps_path) for s in sources])
except ValueError as e:  # a damaged steps.parquet: say which, keep the app up
    st.error(str(e))
    st.stop()
c1, c2, c3, c4 = st.columns([5, 2, 3, 1])
# Every view setting lives in the URL too, so a link reproduces exactly what is on screen.
metrics = c1.multiselect("Metrics", metrics_all, key="metrics", bind="query-params",
                         default=[m for m in prep_series.DEFAULT_CHARTS if m in metrics_all])
x_axis = c2.selectbox("x axis", prep_series.X_AXES, key="x_axis", bind="query-params")
smoothing = c3.slider("Smoothing (EMA weight, before downsampling)", 0.0, 0.99, 0.6, 0.01, key="smoothing",
                      bind="query-params")
log_y = c4.toggle("log y", key="log_y", bind="query-params")

data = common.compare_data(sources, metrics, x_axis=x_axis, smoothing=smoothing)
if data.notes:
    st.caption(" · ".join(data.notes))
if data.nonfinite_lines():
    st.warning("Non-finite values (marked on the charts):\n" + "\n".join(f"- {x}" for x in data.nonfinite_lines()))
st.caption(f"Drawing {data.points():,} of {data.points_total():,} points (MinMaxLTTB keeps every local extreme). "
           "◆ restart · ★ spike (a finding) · × NaN · ▲/▼ ±inf")

cols = st.columns(2)
for i, metric in enumerate(data.drawn_metrics()):
    fig = prep_figures.metric_figure(data, metric, colours, log_y=log_y)
    cols[i % 2].plotly_chart(fig, key=f"chart-{metric}", config={"displaylogo": False})

d1, d2, _ = st.columns([1, 1, 4])
d1.download_button("Download CSV", lambda: prep_export.to_csv_bytes(prep_export.selected_series(sources, metrics)),
                   file_name="kforge-series.csv", mime="text/csv", key="dl_csv")
d2.download_button("Download Parquet",
                   lambda: prep_export.to_parquet_bytes(prep_export.selected_series(sources, metrics)),
                   file_name="kforge-series.parquet", mime="application/octet-stream", key="dl_parquet")
