"""Compare runs: overlay metrics of the selected runs (or groups of them). Render only; data comes from browse/.

Layout: every control lives in the sidebar; the main area holds the title, one legend
for the page (pills in the runs' own colours that show or hide a run on every chart), a one-line
note on non-finite values when there are any, and then the charts, so at 1400x1000 the first chart
is wholly on the first screen. Everything else the page says comes after the charts.
"""

import time

import streamlit as st

from kforge_dash import text
from kforge_dash.browse import columns as prep_columns
from kforge_dash.browse import downloads as prep_downloads
from kforge_dash.browse import figures as prep_figures
from kforge_dash.browse import groups as prep_groups
from kforge_dash.browse import overlap as prep_overlap
from kforge_dash.browse import preview as prep_preview
from kforge_dash.browse import runs as prep_runs
from kforge_dash.browse import series as prep_series
from kforge_dash.browse import zoom as prep_zoom
from kforge_dash.browse.views import chart, common
from kforge_dash.text import md_text

LANDING_RUNS = 8  # the landing page opens with the most recent runs selected, up to this many
STEP_KEYS = {"step_from": "From step", "step_to": "To step"}

st.title("Compare runs")
root = common.runs_root()
runs = common.load_runs(root)
panel = st.container()  # filled once the sidebar says which runs the page follows live
ingested = {r.name: r for r in runs if r.ingested}
if not ingested:
    with panel:
        common.ingest_panel(root, runs)
    st.info(md_text(prep_runs.no_runs_message(root, runs)))
    st.stop()
preloading = common.preload_pending()  # this run is the session's first page

# The From/To steps are bound to the URL here, not by Streamlit: its own binding turns a typed
# ?step_to=inf or a 400-digit step into an OverflowError inside the widget. A session's first run
# reads them (clamped, or dropped with a note); every run writes them back.
url_notes = dict(st.session_state.get("_url_notes", {}))  # kept for the session, shown until the input changes
for key in STEP_KEYS:
    if key not in st.session_state:
        raw = st.query_params.get(key)
        p = prep_zoom.step_param(key, raw) if raw not in (None, "") else prep_zoom.StepParam(None)
        st.session_state[key] = p.value
        if p.note is not None:
            url_notes[key] = (p.note, p.value)
st.session_state["_url_notes"] = url_notes

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
    st.info(f"{text.counted(len(matching), 'run')} {text.agrees(len(matching), 'matches', 'match')}. "
            "Pick runs to compare in the sidebar.")
    st.stop()

sources = common.sources(ingested, selected)
if not sources:
    st.stop()
metrics_all = common.stop_on_error(
    lambda: prep_series.available_metrics([prep_series.steps_schema(s.steps_path) for s in sources]))
summaries = [s.summary for s in sources]


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


with st.sidebar:
    # Every view setting lives in the URL too, so a link reproduces exactly what is on screen.
    # The default charts are the usual ones that some selected run has a value of.
    metrics = st.multiselect("Metrics", metrics_all, key="metrics", bind="query-params",
                             default=prep_columns.default_metrics(metrics_all, common.metrics_with_values(sources)))
    x_axis = st.selectbox("x axis", prep_series.X_AXES, key="x_axis", bind="query-params")
    smoothing = st.slider("Smoothing (EMA weight per step)", 0.0, 0.99, 0.6, 0.01,
                          key="smoothing", bind="query-params",
                          help="Applied before downsampling. A series logged every k steps is smoothed with weight^k "
                               f"per point; one of fewer than {prep_series.MIN_SMOOTH_POINTS} points is not smoothed.")
    log_y = st.toggle("log y", key="log_y", bind="query-params")
    _take_box(x_axis)
    z1, z2 = st.columns(2)
    first = z1.number_input(STEP_KEYS["step_from"], value=None, step=1, key="step_from",
                            min_value=-prep_zoom.MAX_STEP, max_value=prep_zoom.MAX_STEP)
    last = z2.number_input(STEP_KEYS["step_to"], value=None, step=1, key="step_to",
                           min_value=-prep_zoom.MAX_STEP, max_value=prep_zoom.MAX_STEP)
    for key, value in (("step_from", first), ("step_to", last)):
        if value is None:
            st.query_params.pop(key, None)
        else:
            st.query_params[key] = str(value)
    st.button("Whole run", key="zoom_reset", on_click=_reset_zoom, help="Drag across a chart to zoom into steps.")
    group_kind = st.selectbox("Group runs by", ("none", *prep_groups.GROUP_KINDS), key="group_by", bind="query-params")
    group_by, band = None, prep_groups.BANDS[0]
    if group_kind == "hparam":
        keys = prep_groups.hparam_keys(summaries)
        if keys:  # opens on a key whose values differ between the selected runs
            default_key = prep_groups.default_hparam_key(summaries)
            group_by = prep_groups.GroupBy("hparam", st.selectbox("hparam", keys, key="group_key",
                                                                  index=keys.index(default_key)))
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
# Selected runs being written now: the live refresh below appends their new parts, so the panel does not
# flag them as out of date (the badge names them instead).
followed = {n for n in selected if live and common.active([ingested[n]])}
with panel:
    common.ingest_panel(root, runs, followed=followed)

zoom = prep_zoom.zoom_from_inputs(first, last)
grouped = group_by is not None
# A first page draws static previews of its charts while plotly.js loads. Loading plotly.js earlier
# (the preload) held them back: first preview 1.78 -> 1.54 s on sample_runs, 2.57 -> 1.72 s at
# 8 x 1M steps without it (benchmarks/bench_dash_phases.py, medians of 3, load 5-9). So only a grouped
# first page, which has no previews, preloads it.
preload = common.plotly_preload(send=grouped)
# One style per run (per group when grouped), the same on every chart and page: runs claim them oldest first.
if grouped:
    members = prep_groups.group_runs(sources, group_by)
    styles = prep_runs.run_styles(list(members))
else:
    members = {s.name: [s.name] for s in sources}
    styles = {n: s for n, s in prep_runs.run_styles(prep_runs.claim_order(runs)).items() if n in members}
entries = list(members)
# The page's one legend: a pill per run (group) in its colour; a click hides or shows it on every chart.
st.html(common.legend_css([styles[e] for e in entries], pills_key="legend", tags_key=None if grouped else "runs"))
if st.session_state.get("_legend_entries") != entries or "legend" not in st.session_state:
    # A new selection: its new runs are shown, the ones hidden before stay hidden. Back from another page,
    # Streamlit has dropped the pills' state: the runs shown when this page was left (_legend_shown) stay so.
    before = st.session_state["legend"] if "legend" in st.session_state else st.session_state.get("_legend_shown")
    hidden = set(st.session_state.get("_legend_entries") or []) - set(entries if before is None else before)
    st.session_state["legend"] = [e for e in entries if e not in hidden]
    st.session_state["_legend_entries"] = entries
shown = st.pills("Legend", entries, selection_mode="multi", key="legend", label_visibility="collapsed",
                 format_func=lambda e: md_text(f"{e} ({text.counted(len(members[e]), 'run')})" if grouped else e))
st.session_state["_legend_shown"] = shown
for key, (note, value) in url_notes.items():
    if st.session_state.get(key) == value:  # until the input is changed
        st.caption(md_text(note))
shown_sources = [s for s in sources if any(s.name in members[e] for e in shown)]
colours = {n: s.colour for n, s in styles.items()}
dashes = {n: s.dash for n, s in styles.items()}


@st.fragment(run_every=common.LIVE_EVERY_S if live else None)
def charts() -> None:
    head = st.container()  # the one-line note on non-finite values, filled in once every chart is
    if live:
        caught = common.catch_up(root, [ingested[n] for n in selected])
        now = time.strftime("%H:%M:%S")
        appended = f" · appended {text.counted(len(caught), 'run')}" if caught else ""
        following = f": {md_text(', '.join(sorted(followed)))}" if followed else ""
        head.badge(f"● live{following} · checked {now}{appended}", color="red")
    if not shown_sources:
        st.info("Every run is hidden: click a name in the legend to show it.")
        return
    cols = st.columns(2)
    tag = "all" if zoom is None else f"{zoom.first}-{zoom.last}"
    parts, drawn, cells = [], [], []
    previews = preloading and not grouped
    # One metric at a time: the first chart (its preview on a first page) is on screen while the next
    # ones are prepared.
    for metric in metrics:
        if grouped:
            data = common.group_data(shown_sources, [metric], group_by, band=band, x_axis=x_axis, smoothing=smoothing,
                                     step_range=zoom)
        else:
            data = common.compare_data(shown_sources, [metric], x_axis=x_axis, smoothing=smoothing, step_range=zoom)
        parts.append(data)
        if data.drawn_metrics():
            drawn += data.bands if grouped else data.series
            cell = cols[len(cells) % 2].container(key=f"cell-{len(cells)}")
            if previews:
                _preview(cell, data, metric, len(cells))
                cells.append((cell, data, metric))
            else:
                _chart(cell, data, metric, tag=tag)
                cells.append(None)
                if len(cells) == 1 and preloading:
                    # A grouped first page: give the browser the first chart alone (it draws every chart
                    # that has arrived in one go, so with all 7 the first showed with the last).
                    time.sleep(common.FIRST_CHART_HEAD_START_S)
    # A first page's plotly charts go out once every preview has: the first one alone, the rest when
    # plotly.js has had time to load (else they all arrive before it and are drawn in one go).
    for i, (cell, data, metric) in enumerate(c for c in cells if c is not None):
        _chart(cell, data, metric, tag=tag)
        if i == 0:
            time.sleep(common.FIRST_PAGE_HOLD_S)
    st.session_state["_drawn"] = drawn
    if not grouped:
        _nonfinite(head, parts)
    _notes(parts)
    _downloads(shown_sources, metrics)


def _nonfinite(head, parts) -> None:
    """NaN/inf values: one collapsed line above the charts (each listed inside), marked on the charts."""
    lines = [x for p in parts for x in p.nonfinite_lines()]
    if lines:
        with head.expander(f"⚠ Non-finite values in {len(lines)} series (× NaN · ▲/▼ ±inf on the charts)"):
            st.warning("\n".join(f"- {md_text(x)}" for x in lines))


def _notes(parts) -> None:
    """What is drawn and what is not, below the charts."""
    if grouped:
        groups = {b.group for p in parts for b in p.bands}
        st.caption(f"{len(groups)} group(s): mean line, {md_text(band)} band over the group's runs at each step.")
        return
    notes = prep_overlap.chart_notes(parts)
    if notes:
        st.caption(" · ".join(md_text(n) for n in notes))
    st.caption(f"Drawing {sum(p.points() for p in parts):,} of {sum(p.points_total() for p in parts):,} points "
               "(MinMaxLTTB keeps every local extreme). ◆ restart · ★ spike (a finding) · × NaN · ▲/▼ ±inf · "
               "drag across a chart to zoom: the range is re-read at full resolution.")


def _preview(cell, data, metric, n: int) -> None:
    """A session's first page: plotly.js is still loading, so a static SVG of the chart is drawn at
    once, under the plotly chart, which covers it when drawn (views/common.PREVIEW_CSS)."""
    svg = prep_preview.preview_svg(data, metric, colours, dashes, log_y=log_y, scale=1 / prep_figures.GIB
                                   if metric.startswith("mem_") and metric.endswith("_bytes") else 1.0)
    if svg is not None:
        cell.container(key=f"preview-{n}").image(svg)


def _chart(cell, data, metric, *, tag) -> None:
    make = prep_figures.group_figure if grouped else prep_figures.metric_figure
    fig = make(data, metric, colours, log_y=log_y, select_zoom=True, dashes=dashes, legend=False)
    # The key changes with the zoom: the new chart starts without the box that made it.
    drawn = chart.chart(cell, fig, key=f"chart-{metric}-{tag}", name=metric, select=True,
                        config=prep_figures.chart_config(metric, image_format=image_format))
    if drawn.box_x is not None:
        st.session_state["_box"] = drawn.box_x
        st.rerun()  # the whole page: the step inputs live in the sidebar


def _downloads(srcs, metrics) -> None:
    d1, d2, _ = st.columns([1, 1, 4])
    d1.download_button("Download CSV",
                       lambda: prep_downloads.to_csv_bytes(prep_downloads.selected_series(srcs, metrics)),
                       file_name="kforge-series.csv", mime="text/csv", key="dl_csv")
    d2.download_button("Download Parquet",
                       lambda: prep_downloads.to_parquet_bytes(prep_downloads.selected_series(srcs, metrics)),
                       file_name="kforge-series.parquet", mime="application/octet-stream", key="dl_parquet")


charts()
preload.empty()
