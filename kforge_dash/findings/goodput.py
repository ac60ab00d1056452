"""Goodput: where the wall clock of a job went, from the first launch's start to the last record.

The definitions follow Google's ml-goodput-measurement (goodput = productive training time / total
time; badput buckets: program startup, wasted progress from disruptions, infrastructure
downtime, checkpointing, data loading, other) and Meta's ETTR (effective training time ratio:
productive time over the job's wall time, restarts and recomputation counted against it).
The timeline is cut into consecutive pieces, each in exactly one bucket, so
``productive_s + sum(buckets) == total_s`` to rounding:

- ``downtime``: from a launch's last record (end.json, else its last row) to the next launch's
  start (meta.json ``start_time``), plus the earlier launch's shutdown after its last step.
- ``startup``: a launch's start (its earliest process start, meta.json ``process_start_time``; for
  shards without it, the recorder's ``start_time``) to the start of its first step (its end minus
  its step time).
- ``wasted_progress``: an earlier launch's time after its last kept step, i.e. the steps a later
  launch recomputed after resuming from an older checkpoint (``wasted_steps`` counts them), and the
  steps a launch rolled back in its own process (ingest/lineage/rollbacks.py: their time, ``wasted_s``, is out
  of the kept steps' periods). Steps
  a killed launch ended after its last flushed row are known from its heartbeat
  (kforge_record/heartbeat.py): the time from its last row to its heartbeat is shared out pro
  rata by steps, those a later launch recomputed to ``wasted_progress``, those none redid
  (trained, not recorded) to ``productive`` (docs/restarts.md).
- A launch that overlaps the next (still writing after it started: restarts.py) is on the clock
  only until the next one starts; what it did after that ran beside it, not after it.
- Per step, its job step time (steps.parquet ``step_time_s``: the period since the ranks'
  previous step end, each on its own clock, mean over ranks: ingest/rowpass/period.py) is cut in this
  order, never more than is left: ``checkpoint`` (the longest ``checkpoint*``/``ckpt*`` phase of
  any rank), ``eval`` (``eval*`` phases); then the step of the *critical rank* (the one that waited
  least in the wait phases, i.e. reached the all-reduce last: everyone waited for it), less its own
  checkpoint/eval; what is left of the period is time between the previous ``end_step`` and this
  ``start_step`` (``eval`` after a step that logged an ``eval*`` scalar, else ``between_steps``).
  Its step is cut into ``warmup`` (a launch's first steps above its median + 3 MAD: their excess
  over the median), ``data_stall`` (the median rank's data phase), ``straggler_wait`` (the
  critical rank's own work minus the median rank's: what the others waited for it) and
  ``productive``, the rest. Each step books its own period, so steps ended out of order lose nothing.
- ``other``: after a launch's last step up to its last record (when no launch follows and the last
  step logged no eval).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import polars as pl

from kforge_dash.findings.finding import RunFacts
from kforge_dash.ingest.inputs.parquet_io import column_max

BUCKETS = ("startup", "warmup", "wasted_progress", "downtime", "checkpoint", "data_stall", "straggler_wait", "eval",
           "between_steps", "other")
_INSIDE = ("warmup", "data_stall", "straggler_wait")


def last_record(L) -> tuple[float | None, float | None]:
    """(time of the launch's last row, time of its last record: end.json's end_time or that row)."""
    last_row, end = None, None
    for a in L.attempts:
        if a.end and isinstance(a.end.get("end_time"), (int, float)):
            end = max(end or a.end["end_time"], a.end["end_time"])
        parts = [p for p in a.parts if p.num_rows and p.max_step is not None]
        if not parts:
            continue
        p = max(parts, key=lambda p: (p.max_step, os.path.basename(p.path)))
        try:
            v = column_max(p.path, "time")
        except Exception:  # unreadable: ingest already warned about that part
            v = None
        if v is not None:
            last_row = max(last_row or v, v)
    return last_row, max(x for x in (last_row, end) if x is not None) if (last_row or end) else None


def launch_start(L) -> float | None:
    """The launch's earliest process start (meta.json ``process_start_time``), else its recorder start."""
    starts = []
    for a in L.attempts:
        p = a.meta.get("process_start_time")
        starts.append(p if isinstance(p, (int, float)) and not isinstance(p, bool) else a.start_time)
    return min((x for x in starts if x is not None), default=None)


def _inside(kept: pl.DataFrame, med: pl.DataFrame) -> pl.DataFrame:
    """Per kept step of one launch: its period (``_d``, the time since the ranks' previous step end), cut."""
    cols = ("ckpt_max", "eval_max", "data_med", "own_med", "crit_st", "crit_own", "crit_side")
    df = kept.join(med.select("step", *cols), on="step", how="left") if med.height else kept.with_columns(
        *[pl.lit(None, pl.Float64).alias(c) for c in cols])
    df = df.with_columns(pl.col("crit_st").fill_null(pl.col("step_work_s")))
    st = pl.col("crit_st").fill_null(0.0)
    typical = df["crit_st"].drop_nulls()
    m = typical.median() if typical.len() else 0.0
    mad = (typical - m).abs().median() if typical.len() else 0.0
    thr = m + 3 * 1.4826 * max(mad or 0.0, 0.01 * (m or 0.0))

    def take(e, avail):
        return pl.min_horizontal(e.fill_null(0.0).clip(lower_bound=0.0), avail)

    # Checkpoint and eval phases first, from the whole interval: a rank 0 that saves after the
    # all-reduce ends the step late while the others are already in the next one.
    df = df.with_columns(checkpoint=take(pl.col("ckpt_max"), pl.col("_d")))
    df = df.with_columns(eval_in=take(pl.col("eval_max"), pl.col("_d") - pl.col("checkpoint")))
    rest = pl.col("_d") - pl.col("checkpoint") - pl.col("eval_in")
    # The critical rank's step, less its own checkpoint/eval; the remainder of the period is
    # time spent between steps (an eval, printing, a data loader outside the step).
    df = df.with_columns(part=take(st - pl.col("crit_side").fill_null(0.0), rest))
    df = df.with_columns(gap=rest - pl.col("part"))
    df = df.with_columns(
        warm=pl.when(((pl.col("crit_st") <= thr).fill_null(True).cum_sum() == 0)).then(st - m).otherwise(0.0),
        strag=(pl.col("crit_own") - pl.col("own_med")),
    )
    rem = pl.col("part")
    exprs = []
    for name, src in zip(_INSIDE, ("warm", "data_med", "strag")):
        x = take(pl.col(src), rem)
        exprs.append(x.alias(name))
        rem = rem - x
    exprs.append(rem.alias("productive"))
    return df.with_columns(exprs)


@dataclass
class _Launch:
    """One launch's pieces of the timeline, booked as they are cut (``_book_*``)."""

    index: int
    start: float  # where its piece of the timeline starts (the previous piece's end)
    t: float  # how far its timeline is booked
    buckets: dict = field(default_factory=lambda: dict.fromkeys(BUCKETS, 0.0))
    productive: float = 0.0
    wasted_steps: int = 0
    downtime_before: float = 0.0
    shutdown: float = 0.0
    last_eval: bool = False  # its last kept step logged an eval* scalar

    def book(self, bucket: str, seconds: float) -> None:
        """``seconds`` more of the timeline into the badput ``bucket``."""
        self.buckets[bucket] += seconds
        self.t += seconds

    def book_productive(self, seconds: float) -> None:
        self.productive += seconds
        self.t += seconds

    def entry(self) -> dict:
        return {**_entry(self.index, self.start, self.t, self.productive, self.buckets, self.wasted_steps),
                "downtime_before_s": self.downtime_before, "shutdown_s": self.shutdown}


def goodput(facts: RunFacts, med: pl.DataFrame) -> dict | None:
    """summary.json ``goodput``: the wall clock from the first launch's start to the last record,
    cut into consecutive pieces, each booked once, launch by launch (None: no launch has a known
    start or a row). The bucket rules (formulas: docs/findings-and-goodput.md):

    1. ``downtime``: the time before a launch's start since the previous launch's last record
       (``_book_start``), and a launch's shutdown after its last row when another follows
       (``_book_end``).
    2. ``startup``: a launch's start to the start of its first kept step (its end minus its step
       time) (``_book_start``).
    3. Each kept step books its job step time (steps.parquet ``step_time_s``: the period since the
       ranks' previous step end, ingest/rowpass/period.py), whatever the order its steps were ended in
       (``_book_steps``, cut by ``_inside``): ``checkpoint`` (longest checkpoint phase of any
       rank), ``eval`` (eval phases), the critical rank's own step (its work, less its own
       checkpoint/eval) as ``warmup`` / ``data_stall`` / ``straggler_wait`` / productive, and what
       is left of the period, the time between the previous ``end_step`` and this ``start_step``,
       as ``between_steps`` (``eval`` after a step that logged an ``eval*`` scalar).
    4. ``wasted_progress``: a launch's time after its last kept step up to its last row when a
       later launch recomputed steps; from its last row to its heartbeat, shared by steps between
       ``wasted_progress`` (recomputed) and productive (trained, not recorded) (``_book_end``).
    5. What is left to the launch's last record: ``downtime`` when another launch follows, else
       ``eval`` after a last step that logged an eval, else ``other`` (``_book_end``).

    ``productive_s + sum(buckets) == total_s``; the per-attempt entries add up to the total.
    """
    steps = _step_table(facts.steps)
    summary = facts.summary
    att = {a["attempt"]: a for a in summary.get("attempts") or []}
    live = [L for L in facts.launches if L.parts()]
    caps = _overlap_caps(summary)
    t0 = t = None
    per_attempt = []
    for i, L in enumerate(live):
        kept = steps.filter(pl.col("attempt") == L.index)
        start = _known_start(L, kept)
        if start is None:
            continue
        if t is None:
            t0 = t = start
        la = _book_start(L.index, t, start, kept)
        if kept.height:
            _book_steps(la, kept, med)
        _book_rollbacks(la, summary, L.index)
        later = [att[M.index]["first_step"] for M in live[i + 1:] if att.get(M.index, {}).get("first_step") is not None]
        _book_end(la, L, att.get(L.index, {}), caps.get(L.index), min(later) if later else None, last=i == len(live) - 1)
        t = la.t
        per_attempt.append(la.entry())
    if t0 is None:
        return None
    return _totals(per_attempt, t0, t)


def _step_table(steps: pl.DataFrame) -> pl.DataFrame:
    """The kept steps: step, time, the job step time (period), the longest rank's own time, the
    attempt and whether the step logged an eval* scalar, by step."""
    eval_cols = [c for c in steps.columns if c.lower().startswith("eval") and steps.schema[c].is_numeric()]
    has_eval = pl.any_horizontal([pl.col(c).is_not_null() for c in eval_cols]) if eval_cols else pl.lit(False)
    work = pl.col("step_work_s") if "step_work_s" in steps.columns else pl.col("step_time_s")
    return steps.select("step", "time", "step_time_s", work.alias("step_work_s"), "attempt",
                        has_eval.alias("_eval")).sort("step")


def _overlap_caps(summary: dict) -> dict:
    """launch -> (time the next launch started while it still wrote, step it had reached by then)."""
    caps = {}
    for o in summary.get("overlaps") or []:
        k = o["attempts"][0]
        if k not in caps or o["time"] < caps[k][0]:
            caps[k] = (o["time"], o["reached_step"])
    return caps


def _first_start(kept: pl.DataFrame) -> float | None:
    """When the launch's first kept step started: its end minus its step time."""
    if not kept.height or kept["time"][0] is None:
        return None
    return kept["time"][0] - (kept["step_time_s"][0] or 0.0)


def _known_start(L, kept: pl.DataFrame) -> float | None:
    """The launch's start (launch_start), else its first step's start, else its last row."""
    start = launch_start(L)
    if start is None:
        start = _first_start(kept)
    return start if start is not None else last_record(L)[0]


def _book_start(index: int, t: float, start: float, kept: pl.DataFrame) -> _Launch:
    """A launch whose piece starts at ``t`` (the last one's end): the downtime up to its start,
    then startup up to its first kept step's start."""
    la = _Launch(index, start=t, t=t)
    la.downtime_before = max(0.0, start - t)
    la.book("downtime", la.downtime_before)
    first = _first_start(kept)
    if first is not None:
        la.book("startup", max(0.0, first - la.t))
    return la


def _book_steps(la: _Launch, kept: pl.DataFrame, med: pl.DataFrame) -> None:
    """Each kept step's period, cut (``_inside``): the pieces are booked in step order, so a step
    ended out of order still books its own time."""
    kept = kept.with_columns(_d=pl.col("step_time_s").fill_nan(None).fill_null(0.0).clip(lower_bound=0.0))
    cut = _inside(kept, med).with_columns(prev_eval=pl.col("_eval").shift(1).fill_null(False))
    la.book("eval", float(cut.filter("prev_eval")["gap"].sum()))
    la.book("between_steps", float(cut.filter(~pl.col("prev_eval"))["gap"].sum()))
    for name in ("checkpoint", "eval_in", *_INSIDE):
        la.book("eval" if name == "eval_in" else name, float(cut[name].sum()))
    la.book_productive(float(cut["productive"].sum()))
    la.last_eval = bool(cut["_eval"][-1])


def _book_rollbacks(la: _Launch, summary: dict, index: int) -> None:
    """The steps the launch ran and then rolled back in its own process (summary ``restarts`` with
    ``in_process``, ingest/lineage/rollbacks.py): their time, taken out of the kept steps' periods, is
    ``wasted_progress``; their steps are ``wasted_steps``."""
    for r in summary.get("restarts") or []:
        if r.get("in_process") and r["attempt"] == index:
            la.wasted_steps += r["superseded_steps"]
            la.book("wasted_progress", max(0.0, r.get("wasted_s") or 0.0))


def _book_end(la: _Launch, L, mine: dict, cap, cutoff: int | None, *, last: bool) -> None:
    """After the launch's last kept step: the steps a later launch recomputed (from ``cutoff``),
    the heartbeat's unrecorded steps, and the tail to its last record."""
    last_row, end = last_record(L)
    last_row, end, beat, reached = _capped(L, mine, last_row, end, cap)
    redone = max(0, reached - cutoff + 1) if cutoff is not None and reached is not None else 0
    la.wasted_steps += redone
    if redone and last_row is not None and last_row > la.t:
        la.book("wasted_progress", last_row - la.t)
    if beat is not None and beat > la.t:  # ended steps its rows do not hold (a kill): from the heartbeat
        w = _recomputed_share(mine.get("last_step"), reached, cutoff)
        gap = beat - la.t
        la.book("wasted_progress", gap * w)
        la.book_productive(gap * (1 - w))
    tail = max(0.0, end - la.t) if end is not None else 0.0  # after the last row: shutdown (and a last eval)
    la.shutdown = 0.0 if last else tail
    la.book("downtime" if la.shutdown else "eval" if la.last_eval else "other", tail)


def _totals(per_attempt: list[dict], t0: float, t: float) -> dict:
    tot = dict.fromkeys(BUCKETS, 0.0)
    for a in per_attempt:
        for k in BUCKETS:
            tot[k] += a["buckets"][k]
    out = _entry(None, t0, t, sum(a["productive_s"] for a in per_attempt), tot, sum(a["wasted_steps"] for a in per_attempt))
    out.pop("attempt")
    out["per_attempt"] = per_attempt
    return out


def _capped(L, mine: dict, last_row, end, cap):
    """(last row, last record, heartbeat time, step reached) of launch ``L``, each cut at ``cap``
    (the next launch's start and the step reached by then) when the two overlap."""
    beats = [a.heartbeat.time for a in L.attempts if a.heartbeat is not None]
    beat = max(beats) if beats else None
    reached = mine.get("reached_step", mine.get("last_step"))
    if beat is not None and end is not None:
        end = max(end, beat)
    if cap is None:
        return last_row, end, beat, reached
    at, step = cap
    return (*(None if x is None else min(x, at) for x in (last_row, end, beat)), step)


def _recomputed_share(recorded, reached, cutoff) -> float:
    """Of the steps after a launch's last row up to the one its heartbeat reached, the share a later
    launch recomputed (from ``cutoff`` on): the rest were trained and kept, though not recorded."""
    if reached is None or cutoff is None or reached < cutoff:
        return 0.0
    if recorded is None or reached <= recorded:
        return 1.0
    return (reached - max(recorded, cutoff - 1)) / (reached - recorded)


def _entry(attempt, start, end, productive, buckets, wasted_steps) -> dict:
    total = end - start
    return {"attempt": attempt, "start_time": start, "end_time": end, "total_s": total, "productive_s": productive,
            "fraction": productive / total if total > 0 else None, "buckets": buckets, "wasted_steps": wasted_steps}
