"""How far each launch got and how the next took over: restarts, kills, unrecorded steps, overlaps.

A launch's *recorded* last step comes from its rows; the step it *reached* from its ranks'
heartbeats as well (kforge_record/heartbeat.py: each rank's last ended step, which a SIGKILL
keeps while the rows not yet flushed are lost). With both, a restart is told exactly
(docs/restarts.md): a job killed after step 140 with rows flushed to step 92 and resumed from its
step-100 checkpoint *reached* 140, *resumed at* 101, *recomputed* 101-140, and trained steps 93-100
that no row records and no later launch redid (``unrecorded``).

Two launches *overlap* when a rank of the earlier one still wrote (a row, its heartbeat, end.json)
after the same rank of the later one had started: torchrun killed, its workers orphaned in their
own sessions, and a relaunch writing the same run at the same time. A restart is then no
sequence of kill, downtime and resume: what the later launch recomputed is counted against what
the earlier had reached when it started, and the steps the earlier ran after that are named as
run by both at once.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import pyarrow.compute as pc

from kforge_dash import text
from kforge_dash.ingest.inputs import heartbeat_check
from kforge_dash.ingest.inputs.launches import Launch
from kforge_dash.ingest.inputs.parquet_io import column_max, read_columns
from kforge_dash.ingest.inputs.plan import ended_bound
from kforge_record.heartbeat import HEARTBEAT_FILE, read_heartbeat
from kforge_record.leftovers import folder_writer_gone
from kforge_record.regular_file import read_regular_bytes
from kforge_record.schema import META_FILE

# Clocks of different hosts agree to about this (NTP): a smaller overlap is taken for none.
CLOCK_SLACK_S = 1.0


@dataclass(frozen=True)
class Reach:
    """How far one launch got."""

    recorded: int | None  # its highest ended step in rows (None: no row ended a step)
    reached: int | None  # its highest ended step by rows or heartbeat (None: neither)
    ranks_behind: tuple[int, ...]  # ranks whose heartbeat is past their own last row


@dataclass(frozen=True)
class Timeline:
    """What summary.json says of the launches' sequence (keys in docs/CONTRACT.md)."""

    reach: dict  # launch index -> Reach
    restarts: list  # summary "restarts" entries
    unrecorded: list  # summary "unrecorded" entries
    overlaps: list  # summary "overlaps" entries


def launch_timeline(launches: list[Launch], first_ended: dict, last_ended: dict, warnings: list[str]) -> Timeline:
    reach = {L.index: _reach(L, last_ended[L.index]) for L in launches}
    ends = _Ends()
    overlaps = [o for i, L in enumerate(launches) for M in launches[i + 1:] if (o := _overlap(L, M, ends)) is not None]
    for o in overlaps:
        steps = "" if o["first_step"] is None else \
            f"; {text.step_range(o['first_step'], o['last_step'])} {_were(o['first_step'], o['last_step'])} run by both"
        warnings.append(
            f"launches {o['attempts'][0]} and {o['attempts'][1]} wrote this run at the same time: launch "
            f"{o['attempts'][0]} ({_ids(launches[o['attempts'][0]])}) still wrote {o['seconds']:.1f} s after launch "
            f"{o['attempts'][1]} ({_ids(launches[o['attempts'][1]])}) started, on rank(s) {_ranks(o['ranks'])}{steps} "
            "(workers of a killed launcher left running?); restarts are counted from what it had reached by then")
    restarts = _restarts(launches, first_ended, reach, overlaps)
    unrecorded = _unrecorded(launches, first_ended, reach, warnings)
    return Timeline(reach, restarts, unrecorded, overlaps)


def _reach(L: Launch, recorded: int | None) -> Reach:
    reached, behind = recorded, []
    for a in L.attempts:
        hb = a.heartbeat
        if hb is None:
            continue
        reached = hb.step if reached is None else max(reached, hb.step)
        own = ended_bound(a.parts, lowest=False)
        if own is None or hb.step > own:
            behind.append(a.rank)
    return Reach(recorded, reached, tuple(sorted(behind)))


def _gone(L: Launch, later: bool) -> bool:
    """The launch writes no more: a later launch replaced it, or every rank's writer is known gone
    (end.json, or a pid on this host that no longer runs). A live job's heartbeat runs ahead of its
    rows by the unflushed window, which is no loss."""
    return later or all(folder_writer_gone(a.dir) for a in L.attempts)


def _unrecorded(launches: list[Launch], first_ended: dict, reach: dict, warnings: list[str]) -> list[dict]:
    out = []
    for L in launches:
        r = reach[L.index]
        if not r.ranks_behind or r.reached is None or (r.recorded is not None and r.reached <= r.recorded):
            continue
        later = [first_ended[M.index] for M in launches[L.index + 1:] if first_ended[M.index] is not None]
        if not _gone(L, bool(later)):
            continue
        cutoff = min(later) if later else None
        last = r.reached if cutoff is None else min(r.reached, cutoff - 1)
        first = r.recorded + 1 if r.recorded is not None else None
        if first is not None and first > last:
            continue  # every step past its rows was recomputed by a later launch: none is missing
        redone = "" if cutoff is None or r.reached < cutoff else \
            f"; {text.step_range(cutoff, r.reached)} {_were(cutoff, r.reached)} recomputed by a later launch"
        behind = set(r.ranks_behind)
        killed = any(a.end is None for a in L.attempts if a.rank in behind)
        out.append({"attempt": L.index, "first_step": first, "last_step": last, "reached_step": r.reached,
                    "recorded_step": r.recorded, "ranks": list(r.ranks_behind), "killed": killed})
        what = f"{text.step_range(first, last)} {_were(first, last)}" if first is not None else f"steps up to {last} were"
        why = ("lost with the unflushed rows when it was killed" if killed else
               "it closed cleanly: rows the recorder dropped (dropped_rows) or steps ended after close()")
        warnings.append(
            f"launch {L.index} reached step {r.reached} (heartbeat of rank(s) {_ranks(r.ranks_behind)}) but its rows "
            f"stop at {'no step' if r.recorded is None else f'step {r.recorded}'}: {what} trained but not recorded "
            f"({why}){redone}")
    return out


def _restarts(launches: list[Launch], first_ended: dict, reach: dict, overlaps: list[dict]) -> list[dict]:
    """summary "restarts": per later launch that ended a step, where it resumed and what the
    earlier launches had reached by then (heartbeats counted; an overlapping one by that launch's start)."""
    ahead = {(o["attempts"][0], o["attempts"][1]): o for o in overlaps}
    out = []
    for M in launches[1:]:
        first = first_ended[M.index]
        prev = None
        for L in launches[:M.index]:
            o = ahead.get((L.index, M.index))
            got = o["reached_step"] if o is not None else reach[L.index].reached
            if got is not None:
                prev = got if prev is None else max(prev, got)
        if first is None or prev is None:
            continue
        out.append({"attempt": M.index, "resumed_at_step": first, "previous_last_step": prev,
                    # step numbers the earlier launch(es) had reached and this one redid
                    "superseded_steps": max(0, prev - first + 1),
                    "time": min((a.start_time for a in M.attempts if a.start_time is not None), default=None),
                    "in_process": False, "why": _why(launches[M.index - 1], M, ahead)})
    return out


def _why(L: Launch, M: Launch, ahead: dict) -> str:
    """Why launch M followed launch L: ``overlap`` (L still wrote when M started), ``kill`` (a rank of L
    left no end.json: SIGKILL, OOM, a node lost) or ``relaunch`` (L closed: done, SIGTERM, an exception)."""
    if (L.index, M.index) in ahead:
        return "overlap"
    return "kill" if any(a.end is None for a in L.attempts) else "relaunch"


def with_rollbacks(restarts: list[dict], rollbacks: list[dict]) -> list[dict]:
    """summary "restarts": the relaunches and the in-process rollbacks (rollbacks.py), by launch, then time."""
    return sorted([*restarts, *rollbacks], key=lambda r: (r["attempt"], r["in_process"], r["time"] is None,
                                                         r["time"] or 0.0, r["resumed_at_step"]))


def attempt_end(a) -> float | None:
    """The attempt's last sign of life: its last row, its heartbeat or end.json, whichever is latest.
    end.json comes after every row, and the heartbeat holds the last ended row's time, so the last
    part's footer is opened only for shards without either (a log row after the last ended step
    of a killed launch is missed: an overlap can only look shorter for it, or go unseen)."""
    times = []
    if a.heartbeat is not None:
        times.append(a.heartbeat.time)
    if a.end and isinstance(a.end.get("end_time"), (int, float)):
        times.append(float(a.end["end_time"]))
    parts = [p for p in a.parts if p.num_rows]
    if parts and not times:
        try:
            v = column_max(parts[-1].path, "time")  # the last written part: rows are written in time order
        except Exception:  # unreadable: ingest warned about that part already
            v = None
        if v is not None:
            times.append(v)
    return max(times, default=None)


class _Ends(dict):
    """attempt_end of each attempt (by folder), each found once."""

    def of(self, a) -> float | None:
        if a.dir not in self:
            self[a.dir] = attempt_end(a)
        return self[a.dir]


def _overlap(L: Launch, M: Launch, ends: _Ends) -> dict | None:
    """The overlap of earlier launch L with later launch M on their common ranks, or None."""
    later = {a.rank: a for a in M.attempts if a.start_time is not None}
    ranks, seconds, since = [], 0.0, None
    for a in L.attempts:
        b = later.get(a.rank)
        end = ends.of(a) if b is not None else None
        if end is None or end <= b.start_time + CLOCK_SLACK_S:
            continue
        ranks.append(a.rank)
        seconds = max(seconds, min(end, ends.of(b) or end) - b.start_time)
        since = b.start_time if since is None else min(since, b.start_time)
    if not ranks:
        return None
    # meta.json's start_time has microsecond resolution (datetime): a row at that instant came before
    before, first, last = _ended_around(L, since + 1e-6)
    return {"attempts": [L.index, M.index], "ranks": sorted(ranks), "time": since, "seconds": seconds,
            "reached_step": before, "first_step": first, "last_step": last}


def _ended_around(L: Launch, t: float) -> tuple[int | None, int | None, int | None]:
    """(highest step L ended by time ``t``, first and last step it ended after ``t``), from its
    rows and heartbeats. Reads the step and time columns of the parts that reach past ``t`` only."""
    before, first, last = None, None, None

    def seen(step, after):
        nonlocal before, first, last
        if after:
            first = step if first is None else min(first, step)
            last = step if last is None else max(last, step)
        else:
            before = step if before is None else max(before, step)

    for a in L.attempts:
        for p in a.parts:
            if not p.num_rows or not p.has_end_rows:
                continue
            try:
                top = column_max(p.path, "time")
                if top is not None and top <= t:
                    hi = ended_bound([p], lowest=False)
                    if hi is not None:
                        seen(hi, False)
                    continue
                tbl = read_columns(p.path, ["step", "time", "step_time_s"])
            except Exception:  # unreadable: ingest warns about it where it reads the rows
                continue
            ended = pc.is_valid(tbl.column("step_time_s"))
            for after, cond in ((False, pc.less_equal(tbl.column("time"), t)), (True, pc.greater(tbl.column("time"), t))):
                mm = pc.min_max(pc.filter(tbl.column("step"), pc.and_(ended, cond)))
                if mm["max"].as_py() is not None:
                    seen(mm["max"].as_py(), after)
                    if after:
                        seen(mm["min"].as_py(), after)
        hb = a.heartbeat
        if hb is not None:
            seen(hb.step, hb.time > t)
    return before, first, last


def _ids(L: Launch) -> str:
    ids = sorted({os.path.basename(a.dir) for a in L.attempts})
    return ids[0] if len(ids) == 1 else f"{ids[0]} and {len(ids) - 1} more"


def _ranks(ranks) -> str:
    ranks = sorted(ranks)
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return text.span(ranks[0], ranks[-1])
    return ", ".join(map(str, ranks))


def _were(first: int, last: int) -> str:
    return "was" if first == last else "were"


def killed_since(prev: dict, listing: list) -> bool:
    """True when the last launch of a run whose inputs are unchanged since summary ``prev`` was
    killed since: its heartbeats moved past the step ``prev`` says it reached and its writer is gone.
    (A kill writes no file: the fingerprint cannot see it.) One probe of the lowest rank's writer,
    then, only for a gone one, the launch's heartbeats: a live run costs one meta.json read."""
    attempts = prev.get("attempts") or []
    if not attempts or not isinstance(attempts[-1], dict):
        return False
    ids = set(attempts[-1].get("attempt_ids") or ())
    dirs = [af.dir for af in sorted(listing, key=lambda af: af.rank) if af.attempt_id in ids]
    if not dirs or folder_writer_gone(dirs[0]) is not True:
        return False
    steps = []
    top = attempts[-1].get("last_step")
    rows = heartbeat_check.RowsSeen(top if isinstance(top, int) else None, 1.0, 0)
    for d in dirs:
        try:
            hb = read_heartbeat(os.path.join(d, HEARTBEAT_FILE))
            meta = json.loads(read_regular_bytes(os.path.join(d, META_FILE)))
        except (OSError, ValueError):
            continue
        meta = meta if isinstance(meta, dict) else {}
        start = meta.get("start_time") if isinstance(meta.get("start_time"), (int, float)) else None
        # an impossible heartbeat (which ingest ignores) is no sign of a kill: else every pass re-ingests
        if hb is not None and heartbeat_check.why_impossible(hb, start_time=start, meta=meta, rows=rows) is None:
            steps.append(hb.step)
    return bool(steps) and max(steps) != attempts[-1].get("reached_step")
