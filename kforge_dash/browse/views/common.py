"""Streamlit glue shared by the pages: the runs root, cached prep calls, the ingest panel.

Caching uses st.cache_resource (objects kept in memory as they are), never st.cache_data,
which pickles and unpickles its values.
"""

from __future__ import annotations

import os

import streamlit as st

from kforge_dash.browse import runs as prep_runs
from kforge_dash.browse import series as prep_series
from kforge_dash.browse.runs import NOT_INGESTED, STALE, RunInfo


def runs_root():
    root = prep_runs.runs_root_from_env()
    st.sidebar.caption(f"Runs root: `{root}`")
    if not root.is_dir():
        st.error(f"Runs root {root} is not a directory. Start the app with `kforge-dash RUNS_ROOT`.")
        st.stop()
    return root


@st.cache_resource(ttl=10, show_spinner=False)
def _list_runs(root: str) -> list[RunInfo]:
    return prep_runs.list_runs(root)


def load_runs(root) -> list[RunInfo]:
    return _list_runs(str(root))


def fingerprint(path) -> tuple:
    """Changes whenever a run is re-ingested, so cached preparations are not served stale."""
    try:
        st_ = os.stat(path)
        return (str(path), st_.st_mtime_ns, st_.st_size)
    except OSError:
        return (str(path), None, None)


@st.cache_resource(max_entries=8, show_spinner="Preparing series…")
def _compare(_sources, key, metrics, x_axis, smoothing):
    return prep_series.prepare_compare(list(_sources), list(metrics), x_axis=x_axis, smoothing=smoothing)


def compare_data(sources, metrics, *, x_axis: str, smoothing: float):
    """prepare_compare, cached per (runs' files, metrics, x axis, smoothing): log-y and other
    redraws do not prepare again. A damaged file stops the page with an error naming it."""
    key = tuple(fingerprint(s.steps_path) for s in sources)
    try:
        return _compare(sources, key, tuple(metrics), x_axis, smoothing)
    except ValueError as e:
        st.error(str(e))
        st.stop()


def _ingest(root, names: list[str]) -> None:
    from kforge_dash.ingest.run import ingest_run

    for name in names:
        try:
            # Through run_dir: a name can only be one of the root's own runs. New part files of a
            # running job are appended. A run that looked stale only by folder times (a temp file
            # come and gone) is skipped as unchanged: its outputs are current, so they are marked
            # so (summary.json touched) instead of redone.
            res = ingest_run(prep_runs.run_dir(root, name))
            if res.skipped:
                os.utime(os.path.join(res.ingested_dir, "summary.json"))
        except Exception as e:  # show it; the app keeps running
            st.session_state.setdefault("ingest_errors", []).append(f"{name}: {e}")
    _list_runs.clear()
    _compare.clear()


def ingest_panel(root, runs: list[RunInfo]) -> None:
    """Runs never ingested, or with shards newer than their ingest, and a button to ingest them."""
    todo = [r for r in runs if r.status in (NOT_INGESTED, STALE)]
    for err in st.session_state.pop("ingest_errors", []):
        st.error(f"Ingest failed for {err}")
    for r in runs:
        if r.error:
            st.error(r.error)
    if not todo:
        return
    listing = ", ".join(f"**{r.name}** ({r.status})" for r in todo)
    with st.container(border=True):
        st.warning(f"Not shown or out of date until ingested: {listing}")
        st.button(f"Ingest {len(todo)} run(s)", key="ingest", on_click=_ingest,
                  args=(root, [r.name for r in todo]))
