"""Compare runs: overlay metrics of the selected runs. Render only; data comes from prep_*."""

import streamlit as st

from kforge_dash import prep_export, prep_figures, prep_runs, prep_series
from kforge_dash.pages import common

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
# Keep already-selected runs selectable while a search hides them, so the selection survives.
chosen_before = [n for n in st.session_state.get("runs", []) if n in ingested]
options = matching + [n for n in chosen_before if n not in matching]
selected = st.multiselect("Runs", options, key="runs", bind="query-params",
                          placeholder="Pick runs to compare")
if not selected:
    st.info(f"{len(matching)} run(s) match. Pick runs to compare.")
    st.stop()
sel_runs = [ingested[n] for n in selected]

schemas = [prep_series.steps_schema(r.file("steps.parquet")) for r in sel_runs]
metrics_all = prep_series.available_metrics(schemas)
default_metrics = [m for m in ("loss", "grad_norm", "lr", "tokens_per_sec", "mfu", "step_time_s", "mem_peak_bytes")
                   if m in metrics_all]
c1, c2, c3, c4 = st.columns([5, 2, 3, 1])
metrics = c1.multiselect("Metrics", metrics_all, default=default_metrics, key="metrics")
x_axis = c2.selectbox("x axis", prep_series.X_AXES, key="x_axis")
smoothing = c3.slider("Smoothing (EMA weight, before downsampling)", 0.0, 0.99, 0.6, 0.01, key="smoothing")
log_y = c4.toggle("log y", key="log_y")

data = common.compare_data(sel_runs, metrics, x_axis=x_axis, smoothing=smoothing)
if data.notes:
    st.caption(" · ".join(data.notes))
nonfinite = [f"- {m.run}: {m.metric} is {m.kind} at {len(m.step)} step(s), first at step {m.step[0]}"
             for m in data.markers if m.kind != "restart"]
if nonfinite:
    st.warning("Non-finite values (marked on the charts):\n" + "\n".join(nonfinite))
n_total = sum(s.n_total for s in data.series)
st.caption(f"Drawing {data.points():,} of {n_total:,} points (MinMaxLTTB keeps every local extreme). "
           "◆ restart · × NaN · ▲/▼ ±inf")

drawn = [m for m in metrics if any(s.metric == m for s in data.series)]
cols = st.columns(2)
for i, metric in enumerate(drawn):
    fig = prep_figures.metric_figure(data, metric, colours, log_y=log_y)
    cols[i % 2].plotly_chart(fig, key=f"chart-{metric}", config={"displaylogo": False})

sources = [prep_series.RunSource(r.name, r.file("steps.parquet"), r.summary) for r in sel_runs]
d1, d2, _ = st.columns([1, 1, 4])
d1.download_button("Download CSV", lambda: prep_export.to_csv_bytes(prep_export.selected_series(sources, metrics)),
                   file_name="kforge-series.csv", mime="text/csv", key="dl_csv")
d2.download_button("Download Parquet",
                   lambda: prep_export.to_parquet_bytes(prep_export.selected_series(sources, metrics)),
                   file_name="kforge-series.parquet", mime="application/octet-stream", key="dl_parquet")
