"""Compare runs: overlay metrics of the selected runs (or groups of them). Render only; data comes from browse/."""

import time

import streamlit as st

from kforge_dash.browse import downloads as prep_downloads
from kforge_dash.browse import figures as prep_figures
from kforge_dash.browse import groups as prep_groups
from kforge_dash.browse import runs as prep_runs
from kforge_dash.browse import series as prep_series
from kforge_dash.browse import zoom as prep_zoom
from kforge_dash.browse.units import md_text
from kforge_dash.browse.views import common

LANDING_RUNS = 8  # the landing page opens with the most recent runs selected, up to this many

st.title("Compare runs")
root = common.runs_root()
runs = common.load_runs(root)
common.ingest_panel(root, runs)
ingested = {r.name: r for r in runs if r.ingested}
if not ingested:
    st.info(f"No ingested runs under {md_text(root)} yet.")
    st.stop()
preloading = common.preload_pending()  # this run is the session's first page
preload = common.plotly_preload()

with st.sidebar:
    query = st.text_input("Search runs by name or tag", key="query")
    all_tags = sorted({t for r in ingested.values() for t in r.tags})
    tags = st.multiselect("Only runs tagged", all_tags, key="tags") if all_tags else []
matching = [r.name for r in prep_runs.filter_runs(list(ingested.values()), query=query, tags=tags)]
options = prep_runs.selectable(matching, st.session_state.get("runs", []), list(ingested))
recent = [n for n in prep_runs.recent_runs(list(ingested.values()), LANDING_RUNS) if n in options]
# bind: the selection lives in the URL (?runs=a&runs=b); names that are not runs here are dropped.
selected = st.multiselect("Runs", options, default=recent, key="runs", bind="query-params",
                          placeholder="Pick runs to compare")
if not selected:
    preload.empty()
    st.info(f"{len(matching)} run(s) match. Pick runs to compare.")
    st.stop()

with st.sidebar:
    group_kind = st.selectbox("Group runs by", ("none", *prep_groups.GROUP_KINDS), key="group_by", bind="query-params")
    group_by, band = None, prep_groups.BANDS[0]
    if group_kind == "hparam":
        keys = sorted({k for n in selected for k in (ingested[n].summary.get("hparams") or {})})
        if keys:
            group_by = prep_groups.GroupBy("hparam", st.selectbox("hparam", keys, key="group_key"))
    elif group_kind == "name pattern":
        pattern = st.text_input("Name pattern removed (regex)", prep_groups.DEFAULT_PATTERN, key="group_pattern")
        try:
            group_by = prep_groups.GroupBy("name pattern", pattern)
        except ValueError as e:
            st.error(md_text(e))
    elif group_kind == "tag":
        group_by = prep_groups.GroupBy("tag")
    if group_by is not None:
        band = st.radio("Band", prep_groups.BANDS, key="band", horizontal=True, bind="query-params")
    image_format = st.selectbox("Chart image (camera button)", prep_figures.IMAGE_FORMATS, key="image_format",
                                format_func=str.upper)
    live = st.toggle(f"Live: refresh every {common.LIVE_EVERY_S} s", key="live",
                     value=common.active([ingested[n] for n in selected]),
                     help="On by default while a selected run's shards are being written.")


def _take_box(x_axis: str) -> None:
    """A box dragged on a chart (the previous run's) becomes the step range, before the inputs exist."""
    box = st.session_state.pop("_box", None)
    if box is None:
        return
    x0, x1 = box
    if x_axis == "step":
        rng = prep_zoom.step_range_from_steps(x0, x1)
    else:
        rng = prep_zoom.step_range_from_box(st.session_state.get("_drawn", []), x0, x1)
    if rng is not None:
        st.session_state["step_from"], st.session_state["step_to"] = rng.first, rng.last


def _reset_zoom() -> None:
    st.session_state["step_from"] = st.session_state["step_to"] = None


@st.fragment(run_every=common.LIVE_EVERY_S if live else None)
def charts() -> None:
    if live:
        caught = common.catch_up(root, [ingested[n] for n in selected])
        now = time.strftime("%H:%M:%S")
        st.badge(f"● live · checked {now}" + (f" · appended {len(caught)} run(s)" if caught else ""), color="red")
    current = {r.name: r for r in common.load_runs(root) if r.ingested}
    sources = common.sources(current, [n for n in selected if n in current])
    if not sources:
        st.stop()
    metrics_all = common.stop_on_error(
        lambda: prep_series.available_metrics([prep_series.steps_schema(s.steps_path) for s in sources]))
    c1, c2, c3, c4 = st.columns([5, 2, 3, 1])
    # Every view setting lives in the URL too, so a link reproduces exactly what is on screen.
    metrics = c1.multiselect("Metrics", metrics_all, key="metrics", bind="query-params",
                             default=[m for m in prep_series.DEFAULT_CHARTS if m in metrics_all])
    x_axis = c2.selectbox("x axis", prep_series.X_AXES, key="x_axis", bind="query-params")
    smoothing = c3.slider("Smoothing (EMA weight per step, before downsampling)", 0.0, 0.99, 0.6, 0.01,
                          key="smoothing", bind="query-params",
                          help="A series logged every k steps is smoothed with weight^k per point; "
                               f"one of fewer than {prep_series.MIN_SMOOTH_POINTS} points is not smoothed.")
    log_y = c4.toggle("log y", key="log_y", bind="query-params")
    _take_box(x_axis)
    z1, z2, z3 = st.columns([2, 2, 1], vertical_alignment="bottom")
    first = z1.number_input("From step", value=None, step=1, key="step_from", bind="query-params")
    last = z2.number_input("To step", value=None, step=1, key="step_to", bind="query-params")
    z3.button("Whole run", key="zoom_reset", on_click=_reset_zoom)
    zoom = prep_zoom.zoom_from_inputs(first, last)
    grouped = group_by is not None
    if grouped:  # one colour per group, the same on every chart
        colours = prep_runs.run_colours(list(prep_groups.group_runs(sources, group_by)))
    else:
        colours = prep_runs.run_colours(prep_runs.claim_order(runs))
    head = st.container()  # the notes on what is drawn, filled in once every chart is
    cols = st.columns(2)
    tag = "all" if zoom is None else f"{zoom.first}-{zoom.last}"
    parts, drawn, n_charts = [], [], 0
    # One metric at a time: the first chart is on screen while the next ones are prepared.
    for metric in metrics:
        if grouped:
            data = common.group_data(sources, [metric], group_by, band=band, x_axis=x_axis, smoothing=smoothing,
                                     step_range=zoom)
        else:
            data = common.compare_data(sources, [metric], x_axis=x_axis, smoothing=smoothing, step_range=zoom)
        parts.append(data)
        if data.drawn_metrics():
            drawn += data.bands if grouped else data.series
            _chart(cols[n_charts % 2], data, metric, colours, log_y=log_y, grouped=grouped, tag=tag)
            n_charts += 1
            if n_charts == 1 and preloading:
                # A session's first page: give the browser the first chart alone (it draws every chart
                # that has arrived in one go, so with all 7 the first showed with the last).
                time.sleep(common.FIRST_CHART_HEAD_START_S)
    st.session_state["_drawn"] = drawn
    with head:
        _notes(parts, grouped=grouped, band=band)
    _downloads(sources, metrics)


def _notes(parts, *, grouped: bool, band: str) -> None:
    if grouped:
        groups = {b.group for p in parts for b in p.bands}
        st.caption(f"{len(groups)} group(s): mean line, {md_text(band)} band over the group's runs at each step.")
        return
    notes = [n for p in parts for n in p.notes]
    if notes:
        st.caption(" · ".join(md_text(n) for n in notes))
    lines = [x for p in parts for x in p.nonfinite_lines()]
    if lines:
        st.warning("Non-finite values (marked on the charts):\n" + "\n".join(f"- {md_text(x)}" for x in lines))
    st.caption(f"Drawing {sum(p.points() for p in parts):,} of {sum(p.points_total() for p in parts):,} points "
               "(MinMaxLTTB keeps every local extreme). ◆ restart · ★ spike (a finding) · × NaN · ▲/▼ ±inf · "
               "drag across a chart to zoom: the range is re-read at full resolution.")


def _chart(col, data, metric, colours, *, log_y, grouped, tag) -> None:
    make = prep_figures.group_figure if grouped else prep_figures.metric_figure
    fig = make(data, metric, colours, log_y=log_y, select_zoom=True)
    # The key changes with the zoom: the new chart starts without the box that made it.
    ev = col.plotly_chart(fig, key=f"chart-{metric}-{tag}", on_select="rerun", selection_mode="box",
                          config=prep_figures.chart_config(metric, image_format=image_format))
    box = (ev.selection.get("box") or []) if ev else []
    if box and len(box[0].get("x") or []) == 2:
        st.session_state["_box"] = tuple(box[0]["x"])
        st.rerun(scope="fragment")


def _downloads(sources, metrics) -> None:
    d1, d2, _ = st.columns([1, 1, 4])
    d1.download_button("Download CSV",
                       lambda: prep_downloads.to_csv_bytes(prep_downloads.selected_series(sources, metrics)),
                       file_name="kforge-series.csv", mime="text/csv", key="dl_csv")
    d2.download_button("Download Parquet",
                       lambda: prep_downloads.to_parquet_bytes(prep_downloads.selected_series(sources, metrics)),
                       file_name="kforge-series.parquet", mime="application/octet-stream", key="dl_parquet")


charts()
preload.empty()
