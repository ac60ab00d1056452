"""Is a heartbeat possible? A heartbeat.bin of the right size, magic and layout can still hold a
body no recorder wrote (a damaged file, a foreign writer, a copy gone wrong): a time of NaN or
inf, a step of 2**63-1. Trusted, it makes launches reach absurd steps and recompute 9e18 of them.

A heartbeat is ignored, with a warning naming the file, when its time is not finite, is before the
attempt started (meta.json ``start_time``) or after this ingest, or its step lies beyond the
attempt's own rows by more rows than a kill can lose (docs/recording.md, "Crash safety"): the
window being filled (``flush_every_steps``), the rows queued for the writer (at most
``max_backlog_rows``, 100,000 by default, reached only while the disk hangs) and the rows counted as
dropped, each at the attempt's step stride. (``flush_every_s`` only ever makes a window shorter.)
An attempt with no row has no steps to measure against: only its time is checked.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from kforge_record.heartbeat import Heartbeat

CLOCK_SLACK_S = 300.0  # a heartbeat this far after the ingest's clock (or before the start) is still taken: hosts' clocks
MAX_BACKLOG_ROWS = 100_000  # the Recorder's default max_backlog_rows (not in meta.json): rows a hung writer may queue
DEFAULT_FLUSH_EVERY_STEPS = 100  # the Recorder's default, for a meta.json without the field


@dataclass(frozen=True)
class RowsSeen:
    """What an attempt's part footers say of its rows."""

    top_step: int | None  # the highest step of its rows (None: no row)
    stride: float  # steps per row, >= 1
    dropped: int  # rows the recorder counted as dropped


def rows_seen(parts, end: dict | None) -> RowsSeen:
    """RowsSeen from PartInfo footers (and end.json's dropped_rows_total)."""
    spans = [(p.min_step, p.max_step, p.num_rows) for p in parts if p.min_step is not None and p.num_rows]
    if not spans:
        top, stride = None, 1.0
    else:
        lo, top, rows = min(s[0] for s in spans), max(s[1] for s in spans), sum(s[2] for s in spans)
        stride = max(1.0, (top - lo) / max(1, rows - 1))
    dropped = [p.dropped_rows_total for p in parts if isinstance(p.dropped_rows_total, int)]
    if end and isinstance(end.get("dropped_rows_total"), int):
        dropped.append(end["dropped_rows_total"])
    return RowsSeen(top, stride, max([0, *dropped]))


def why_impossible(hb: Heartbeat, *, start_time: float | None, meta: dict, rows: RowsSeen,
                   now: float | None = None) -> str | None:
    """None when ``hb`` could have been written by this attempt's recorder, else why not (a phrase)."""
    now = time.time() if now is None else now
    if not math.isfinite(hb.time):
        return f"its end time is {hb.time!r}"
    if start_time is not None and hb.time < start_time - CLOCK_SLACK_S:
        return f"its end time {hb.time:.3f} is {start_time - hb.time:.0f} s before the attempt started"
    if hb.time > now + CLOCK_SLACK_S:
        return f"its end time {hb.time:.3f} is {hb.time - now:.0f} s after this ingest"
    if rows.top_step is not None:
        fes = meta.get("flush_every_steps")
        fes = fes if isinstance(fes, int) and not isinstance(fes, bool) and fes > 0 else DEFAULT_FLUSH_EVERY_STEPS
        hidden = fes + MAX_BACKLOG_ROWS + rows.dropped
        if hb.step > rows.top_step + math.ceil(rows.stride * hidden):
            return (f"its step {hb.step} is {hb.step - rows.top_step} steps past the attempt's last row (step "
                    f"{rows.top_step}), more than a kill can leave unwritten ({hidden} rows)")
    return None


def checked(hb: Heartbeat | None, path: str, warnings: list[str], *, start_time: float | None, meta: dict,
            rows: RowsSeen, now: float | None = None) -> Heartbeat | None:
    """``hb``, or None (and a warning naming ``path``) when it is impossible."""
    if hb is None:
        return None
    why = why_impossible(hb, start_time=start_time, meta=meta, rows=rows, now=now)
    if why is None:
        return hb
    warnings.append(f"{path}: an impossible heartbeat ({why}); ignored: how far this rank got past its last row "
                    "is taken from its rows")
    return None
