"""Whether a run is live (being written), from what its recorders write inside their files.

A run is live when a recorder of its newest launch has not closed (no end.json) and ended a step
within a window: the end time its heartbeat.bin holds (docs/CONTRACT.md). File times are not used
for recorders that write a heartbeat: git clone and cp set them to now, so copied runs looked live.
Plain functions (no Streamlit); views/common.py decides what the window is.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from kforge_dash.ingest.inputs import heartbeat_check
from kforge_record.heartbeat import HEARTBEAT_FILE, read_heartbeat
from kforge_record.regular_file import open_regular
from kforge_record.schema import END_FILE, META_FILE, RANK_PREFIX


def _newest_attempt(rank_path: str) -> str | None:
    """The rank's newest attempt folder: attempt ids lead with their UTC start (docs/CONTRACT.md), so
    name order is start order."""
    with os.scandir(rank_path) as entries:
        names = [e.name for e in entries if not e.name.startswith(".") and e.is_dir(follow_symlinks=False)]
    return os.path.join(rank_path, max(names)) if names else None


def _started(attempt: str) -> float | None:
    try:
        with open_regular(os.path.join(attempt, META_FILE), "r") as f:
            t = json.load(f).get("start_time")
        return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else None
    except (OSError, ValueError, AttributeError):
        return None


def attempt_last_seen(attempt: str) -> float | None:
    """When the recorder writing this attempt folder last showed life (Unix s); None once it finished
    (end.json). From what the recorder writes inside its files, never from file times alone (a
    clone or a copy sets those to now): the heartbeat's last ended step's end time; a heartbeat with
    no step ended yet: meta.json's start_time. Only an attempt with neither end.json nor a readable
    heartbeat (older recorders) falls back to the folder's mtime."""
    if os.path.exists(os.path.join(attempt, END_FILE)):
        return None
    hb_path = os.path.join(attempt, HEARTBEAT_FILE)
    try:
        hb = read_heartbeat(hb_path)
    except (OSError, ValueError):  # not a heartbeat: as for an older recorder
        hb, hb_path = None, None
    if hb is not None and heartbeat_check.why_impossible(  # a NaN or future time: no sign of life
            hb, start_time=_started(attempt), meta={}, rows=heartbeat_check.RowsSeen(None, 1.0, 0)) is not None:
        hb, hb_path = None, None
    if hb is not None:
        return hb.time
    if hb_path is not None and os.path.exists(hb_path):  # open, no step ended yet
        started = _started(attempt)
        if started is not None:
            return started
    return os.stat(attempt).st_mtime


def run_last_seen(path: Path) -> float | None:
    """The latest sign of life of the run's unfinished recorders (attempt_last_seen of each rank's
    newest attempt), None when every one finished or there are no shards. One scan of each rank
    folder and a 24-byte read per rank: cheap enough for every run of the landing page."""
    newest = None
    with os.scandir(path) as ranks:
        rank_paths = [e.path for e in ranks if e.name.startswith(RANK_PREFIX) and e.is_dir(follow_symlinks=False)]
    for rank in rank_paths:
        attempt = _newest_attempt(rank)
        t = None if attempt is None else attempt_last_seen(attempt)
        if t is not None and (newest is None or t > newest):
            newest = t
    return newest


def is_live(path: Path, now: float, window_s: float) -> bool:
    """Whether the run is being written: a recorder of its newest launch, not finished, ended a step
    (or started) within `window_s` of `now`. Unreadable folders count as not live."""
    try:
        seen = run_last_seen(path)
    except OSError:
        return False
    return seen is not None and now - seen < window_s
