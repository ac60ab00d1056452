"""Streamlit glue shared by the pages: the runs root, cached prep calls, the ingest panel, live refresh.

Caching uses st.cache_resource (objects kept in memory as they are), never st.cache_data,
which pickles and unpickles its values. Every name from disk goes through text.md_text before
it reaches Markdown (alerts and captions render Markdown).
"""

from __future__ import annotations

import os
import time

import streamlit as st

from kforge_dash import column_registry as reg
from kforge_dash import text
from kforge_dash.browse import columns as prep_columns
from kforge_dash.browse import groups as prep_groups
from kforge_dash.browse import live as prep_live
from kforge_dash.browse import runs as prep_runs
from kforge_dash.browse import series as prep_series
from kforge_dash.browse.runs import NOT_INGESTED, STALE, RunInfo, RunPathError
from kforge_dash.browse.views import chart
from kforge_dash.text import md_text

# A run whose recorder ended a step this recently (its heartbeat.bin; browse/live.is_live) is being
# written: its pages go live.
LIVE_WINDOW_S = 300
LIVE_EVERY_S = 5


# How long a session's first page holds the other charts back once the first is sent (s): the
# frontend draws every chart that has arrived in one task, so sent together the first showed with
# the last (benchmarks/bench_dash_browser.py).
FIRST_CHART_HEAD_START_S = 0.5
# On a first page with previews, how long the other plotly charts wait after the first one: sent at
# once they arrived before plotly.js and were drawn with it in one go (first interactive chart 6.61 ->
# 5.25 s, python benchmarks/bench_dash_browser.py --sample, medians of 4 at load 6-10).
FIRST_PAGE_HOLD_S = 1.0


def preload_pending() -> bool:
    """True until plotly_preload has run once in this session."""
    return not st.session_state.get("_plotly_preloaded")


def plotly_preload(send: bool = True):
    """An element that only starts loading plotly.js (views/chart.preload), sent before the charts once
    per session (only marked as done when not `send`); returns its slot, which the page empties once its
    charts are sent. Loading it here overlaps that with the widgets' own code
    (benchmarks/bench_dash_browser.py)."""
    slot = st.empty()
    if not st.session_state.get("_plotly_preloaded"):
        st.session_state["_plotly_preloaded"] = True
        if not send:
            return slot
        chart.preload(slot)
    return slot


def _ink(colour: str) -> str:
    """Black or white, whichever reads better on `colour` (a #rrggbb)."""
    r, g, b = (int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return "#000000" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.55 else "#ffffff"


def _swatch(style: prep_runs.RunStyle) -> str:
    """A CSS background drawing a short line in the style's colour (dashed for a dashed style)."""
    if style.dash == "solid":
        return style.colour
    on, off = {"dash": (6, 4), "dot": (2, 3), "dashdot": (6, 3)}.get(style.dash, (4, 4))
    return f"repeating-linear-gradient(90deg, {style.colour} 0 {on}px, transparent {on}px {on + off}px)"


# A chart's static preview (browse/preview.py) takes no room of its own: it lies over the place the
# plotly chart that follows it in the cell has reserved (its height, known before plotly.js is), until that
# chart has drawn its lines; the chart's loading placeholder (a grey skeleton bar) is not shown. So nothing
# below the charts moves when plotly.js arrives (tests/test_browser_landing.py measures it).
_CELL, _PREVIEW = "[class*='st-key-cell-']", "[class*='st-key-preview-']"
PREVIEW_CSS = (f"{_CELL} {{ position: relative; }}\n"
               f"{_CELL} > {_PREVIEW}, {_CELL} > :has({_PREVIEW}) {{ position: absolute; top: 0; left: 0; right: 0; "
               "z-index: 2; }\n"
               f"{_CELL} [data-testid='stSkeleton'] {{ display: none; }}\n"
               f"{_CELL}:has(.js-plotly-plot) {_PREVIEW} {{ display: none; }}")
# The unified hover (one row per run) sits beside its chart, not over the lines it explains: to the right
# of a chart in the left column, to the left of one in the right column, its top at the plot's top (CSS
# transform outranks the transform attribute plotly sets). Where the columns stack (< 640 px) plotly places it.
_COL, _BOX = "[data-testid='stColumn']", f"{_CELL} .hoverlayer .legend"
HOVER_CSS = ("@media (min-width: 640px) {\n"
             f"{_CELL} [data-testid='stElementContainer'], {_CELL} .js-plotly-plot, {_CELL} .main-svg "
             "{ overflow: visible !important; }\n"
             f"{_COL}:has({_CELL}):hover {{ z-index: 5; }}\n"
             f"{_BOX} {{ transform-box: view-box; transform: translate(calc(100% + 6px), 40px) !important; }}\n"
             f"{_COL} + {_COL} {_BOX} {{ transform-box: fill-box; transform: translate(calc(-100% - 6px), 40px) !important; }}\n"
             "}")


def legend_css(styles: list[prep_runs.RunStyle], *, pills_key: str, tags_key: str | None = None) -> str:
    """Colours the legend's pills (st.pills keyed `pills_key`, one per entry in order) and the tags of
    a multiselect (`tags_key`) with each entry's own colour. Only colours and positions go into the
    CSS, never a name from disk."""
    rules = [".stMainBlockContainer { padding-top: 2.5rem; }", PREVIEW_CSS, HOVER_CSS,  # charts higher on the first screen
             f".st-key-{pills_key} button {{ border-width: 2px; background-color: transparent !important; "
             "color: inherit !important; }",
             f".st-key-{pills_key} button[aria-pressed='false'] p {{ opacity: 0.45; text-decoration: line-through; }}"]
    for i, st_ in enumerate(styles, start=1):
        rules.append(f".st-key-{pills_key} button:nth-of-type({i}) {{ border-color: {st_.colour} !important; }}")
        rules.append(f".st-key-{pills_key} button:nth-of-type({i})::before {{ content: ''; display: inline-block; "
                     f"width: 18px; height: 3px; margin-right: 6px; vertical-align: middle; background: {_swatch(st_)}; }}")
    if tags_key is not None:
        rules += tag_rules(styles, tags_key)
    return "<style>\n" + "\n".join(rules) + "\n</style>"


def tag_rules(styles: list[prep_runs.RunStyle], tags_key: str) -> list[str]:
    """CSS rules that colour the i-th tag of the multiselect keyed `tags_key` with styles[i]'s colour; the
    multiselect grows with its tags (Streamlit caps it at ~4 rows and scrolls: the fifth run was cut in half)."""
    return [f".st-key-{tags_key} div {{ max-height: none !important; }}"] + [
        f".st-key-{tags_key} [data-tag-index='{i}'] {{ background-color: {st_.colour} !important; "
        f"color: {_ink(st_.colour)} !important; }}" for i, st_ in enumerate(styles)]


def runs_root():
    root, only = prep_runs.runs_root_from_env(), prep_runs.only_run_from_env()
    st.sidebar.caption(f"Run: {md_text(root / only)}" if only else f"Runs root: {md_text(root)}")
    if not root.is_dir():
        st.error(f"Runs root {md_text(root)} is not a directory. Start the app with kforge\\-dash RUNS\\_ROOT.")
        st.stop()
    return root


@st.cache_resource(ttl=10, show_spinner=False)
def _list_runs(root: str, only: str | None) -> list[RunInfo]:
    return prep_runs.list_runs(root, only=only)


def load_runs(root) -> list[RunInfo]:
    return _list_runs(str(root), prep_runs.only_run_from_env())


def clear_listing() -> None:
    """Forget the cached listing (a page found it disagreeing with the disk)."""
    _list_runs.clear()


def file_stamp(path) -> tuple:
    """Changes whenever a run is re-ingested, so cached preparations are not served stale."""
    try:
        st_ = os.stat(path)
        return (str(path), st_.st_mtime_ns, st_.st_size)
    except OSError:
        return (str(path), None, None)


def sources(runs: dict[str, RunInfo], names: list[str]) -> list[prep_series.RunSource]:
    """The selected runs' sources; a run whose steps.parquet leads outside it is named and left out."""
    out = []
    for n in names:
        try:
            out.append(runs[n].source())
        except RunPathError as e:
            st.error(md_text(e))
    return out


@st.cache_resource(max_entries=64, show_spinner=False)  # one entry per metric
def _compare(_sources, key, metrics, x_axis, smoothing, step_range):
    return prep_series.prepare_compare(list(_sources), list(metrics), x_axis=x_axis, smoothing=smoothing,
                                       step_range=step_range)


@st.cache_resource(max_entries=64, show_spinner=False)
def _groups(_sources, key, metrics, by, band, x_axis, smoothing, step_range):
    return prep_groups.prepare_groups(list(_sources), list(metrics), by, band=band, x_axis=x_axis,
                                      smoothing=smoothing, step_range=step_range)


def registry_columns(frame, formats: dict[str, str] | None = None) -> dict:
    """st.dataframe's column_config for a table whose columns are column-registry names: each header the
    registry's label with its unit, its help as the header's tooltip; a numeric column (of ``frame``, before
    any "—" made it text) right-aligned; ``formats``: a column's number format ("%.1f")."""
    out = {}
    for c in frame.columns:
        entry = reg.lookup(c)
        if c in (formats or {}):
            out[c] = st.column_config.NumberColumn(entry.titled, help=entry.help, format=formats[c])
        else:
            out[c] = st.column_config.Column(entry.titled, help=entry.help,
                                             alignment="right" if frame[c].dtype.is_numeric() else None)
    return out


def stop_on_error(fn, *args):
    """``fn(*args)``; a ValueError (a damaged file named in its message, or a bad setting) is shown
    as an error and stops the page, so the app stays up."""
    try:
        return fn(*args)
    except ValueError as e:  # a damaged file (named in the message) or a bad setting: keep the app up
        st.error(md_text(e))
        st.stop()


@st.cache_resource(max_entries=256, show_spinner=False)
def _with_values(path: str, stamp) -> frozenset:
    return frozenset(prep_columns.metrics_with_values(path))


def metrics_with_values(srcs) -> set[str]:
    """Columns with at least one value in any of the runs (footers only, cached per file)."""
    return set().union(*(stop_on_error(_with_values, str(s.steps_path), file_stamp(s.steps_path)) for s in srcs))


def compare_data(srcs, metrics, *, x_axis: str, smoothing: float, step_range=None):
    """prepare_compare, cached per (runs' files, metrics, x axis, smoothing, zoom): log-y and other
    redraws do not prepare again. A damaged file stops the page with an error naming it."""
    key = tuple(file_stamp(s.steps_path) for s in srcs)
    return stop_on_error(_compare, srcs, key, tuple(metrics), x_axis, smoothing, step_range)


def group_data(srcs, metrics, by, *, band: str, x_axis: str, smoothing: float, step_range=None):
    key = tuple((s.name, file_stamp(s.steps_path)) for s in srcs)
    return stop_on_error(_groups, srcs, key, tuple(metrics), by, band, x_axis, smoothing, step_range)


def _ingest(root, names: list[str]) -> None:
    from kforge_dash.ingest.run import ingest_run

    for name in names:
        try:
            # Through run_dir: a name can only be one of the root's own runs. New part files of a
            # running job are appended. A run that looked stale only by folder times (a temp file
            # come and gone) is skipped as unchanged: its outputs are current, so they are marked
            # so (summary.json touched) instead of redone. No option given: the run's kept options
            # (those given to kforge-ingest earlier: ingest/kept.py), else the defaults.
            res = ingest_run(prep_runs.run_dir(root, name))
            if res.skipped:
                os.utime(os.path.join(res.ingested_dir, "summary.json"))
        except Exception as e:  # show it; the app keeps running
            st.session_state.setdefault("ingest_errors", []).append(f"{name}: {e}")
    _list_runs.clear()


def ingest_panel(root, runs: list[RunInfo], *, followed: set[str] = frozenset()) -> None:
    """Runs never ingested, or with shards newer than their ingest, and a button to ingest them; not
    the ``followed`` ones (the Compare page's live refresh appends their new parts itself)."""
    todo = [r for r in runs if r.status == NOT_INGESTED or (r.status == STALE and r.name not in followed)]
    for err in st.session_state.pop("ingest_errors", []):
        st.error(f"Ingest failed for {md_text(err)}")
    for r in runs:
        if r.error:
            st.error(md_text(r.error))
    if not todo:
        return
    listing = ", ".join(f"{md_text(r.name)} ({r.status})" for r in todo)
    with st.container(border=True):
        st.warning(f"Not shown or out of date until ingested: {listing}")
        st.button(f"Ingest {text.counted(len(todo), 'run')}", key="ingest", on_click=_ingest,
                  args=(root, [r.name for r in todo]))


def _shard_mtime(r: RunInfo) -> float | None:
    try:
        return prep_runs.newest_shard_mtime(r.path)
    except OSError:
        return None


def active(runs: list[RunInfo]) -> bool:
    """Whether any of `runs` is live (browse/live.is_live: a step ended within LIVE_WINDOW_S by a
    recorder not yet closed): the page then refreshes itself."""
    now = time.time()
    return any(prep_live.is_live(r.path, now, LIVE_WINDOW_S) for r in runs)


def catch_up(root, runs: list[RunInfo]) -> list[str]:
    """Live refresh: ingest (append) the runs whose shards changed while the page was open and are
    newer than their ingest; their names. Runs already stale when the page opened stay flagged for
    the ingest button: nothing is ingested that the user did not watch being written."""
    since = st.session_state.setdefault("_live_since", time.time())
    stale = [r.name for r in runs if (_shard_mtime(r) or 0.0) > since and prep_runs.shards_newer(r)]
    if stale:
        _ingest(root, stale)
    return stale
