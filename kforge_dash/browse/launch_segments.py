"""The run page's restart chart, prepared: each launch cut into the steps it kept, the steps a later launch ran
again, and the steps it trained but never recorded. Plain functions on summary.json's restart timeline.

A killed launch's rows end at its last flush (``last_step``); its heartbeat says how far it got (``reached_step``,
docs/restarts.md). The chart draws it up to ``reached_step`` (issue 27.4: launch 0 drawn to its last flush at 199
looked like a clean hand-off while the table said 51 steps were run again):

- ``kept``: first_step .. the step before the next launch resumed (or its end), recorded;
- ``recomputed``: from where a later launch resumed to where this one reached (recorded or not): ran twice;
- ``unrecorded``: past its last row up to the resume (or its end): trained, no row (no later launch redid them);
- ``rolled back``: steps the launch ran, then went back over in its own process and ran again (summary
  ``restarts`` with ``in_process``: ingest/lineage/rollbacks.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

KINDS = ("kept", "recomputed", "unrecorded", "rolled back")


@dataclass(frozen=True, kw_only=True)
class Segment:
    attempt: int
    kind: str  # one of KINDS
    first: int
    last: int


def launch_segments(timeline: pl.DataFrame, rollbacks=()) -> list[Segment]:
    """``timeline``: browse.ranks.restart_timeline (one row per launch, with ``reached_step``); ``rollbacks``:
    summary ``restarts`` entries of in-process rollbacks (each drawn over the launch that made it)."""
    rows = timeline.sort("attempt").to_dicts()
    out: list[Segment] = []
    for i, r in enumerate(rows):
        first, last = r.get("first_step"), r.get("last_step")
        if first is None or last is None:
            continue
        reached = r.get("reached_step")
        end = max(last, reached) if isinstance(reached, int) else last
        later = [x["resumed_at_step"] for x in rows[i + 1:] if isinstance(x.get("resumed_at_step"), int)]
        redo = min(later) if later else None  # the lowest step a later launch resumed at
        keep_to = end if redo is None else min(end, redo - 1)
        a = r["attempt"]
        if keep_to >= first:
            out.append(Segment(attempt=a, kind="kept", first=first, last=min(last, keep_to)))
            if keep_to > last:
                out.append(Segment(attempt=a, kind="unrecorded", first=last + 1, last=keep_to))
        if redo is not None and redo <= end:
            out.append(Segment(attempt=a, kind="recomputed", first=max(first, redo), last=end))
    for r in rollbacks:
        if r.get("in_process") and isinstance(r.get("resumed_at_step"), int) and isinstance(r.get("previous_last_step"), int):
            out.append(Segment(attempt=r["attempt"], kind="rolled back", first=r["resumed_at_step"],
                               last=max(r["resumed_at_step"], r["previous_last_step"])))
    return out
