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
  launch recomputed after resuming from an older checkpoint (``wasted_steps`` counts them). Steps
  a killed launch ended after its last flushed row are known from its heartbeat
  (kforge_record/heartbeat.py): the time from its last row to its heartbeat is shared out pro
  rata by steps, those a later launch recomputed to ``wasted_progress``, those none redid
  (trained, not recorded) to ``productive`` (docs/restarts.md).
- A launch that overlaps the next (still writing after it started: restarts.py) is on the clock
  only until the next one starts; what it did after that ran beside it, not after it.
- Per step, the interval since the previous step's end (the last rank's) is cut in this order,
  never more than is left: ``checkpoint`` (the longest ``checkpoint*``/``ckpt*`` phase of any
  rank), ``eval`` (``eval*`` phases); then the step of the *critical rank* (the one that waited
  least in the wait phases, i.e. reached the all-reduce last: everyone waited for it), less its own
  checkpoint/eval; what is left of the interval was spent by that rank between steps (``startup``
  before a launch's first step, else ``eval`` after a step that logged an ``eval*`` scalar, else
  ``other``). Its step is cut into ``warmup`` (a launch's first steps above its median + 3 MAD:
  their excess over the median), ``data_stall`` (the median rank's data phase),
  ``straggler_wait`` (the critical rank's own work minus the median rank's: what the others
  waited for it) and ``productive``, the rest.
"""

from __future__ import annotations

import os

import polars as pl

from kforge_dash.ingest.findings.model import RunFacts
from kforge_dash.ingest.parquet_io import column_max

BUCKETS = ("startup", "warmup", "wasted_progress", "downtime", "checkpoint", "data_stall", "straggler_wait", "eval",
           "other")
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
    """Per kept step of one launch: the wall time since the previous step's end (``_d``), cut."""
    cols = ("ckpt_max", "eval_max", "data_med", "own_med", "crit_st", "crit_own", "crit_side")
    df = kept.join(med.select("step", *cols), on="step", how="left") if med.height else kept.with_columns(
        *[pl.lit(None, pl.Float64).alias(c) for c in cols])
    df = df.with_columns(pl.col("crit_st").fill_null(pl.col("step_time_s")))
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
    # The critical rank's step, less its own checkpoint/eval; the remainder of the interval is
    # time that rank spent between steps (startup before the first, an eval, printing).
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


def goodput(facts: RunFacts, med: pl.DataFrame) -> dict:
    steps, summary = facts.steps, facts.summary
    eval_cols = [c for c in steps.columns if c.lower().startswith("eval") and steps.schema[c].is_numeric()]
    has_eval = pl.any_horizontal([pl.col(c).is_not_null() for c in eval_cols]) if eval_cols else pl.lit(False)
    steps = steps.select("step", "time", "step_time_s", "attempt", has_eval.alias("_eval")).sort("step")
    att = {a["attempt"]: a for a in summary.get("attempts") or []}
    live = [L for L in facts.launches if L.parts()]
    caps = {}  # launch -> (time the next launch started while it still wrote, step it had reached by then)
    for o in summary.get("overlaps") or []:
        k = o["attempts"][0]
        if k not in caps or o["time"] < caps[k][0]:
            caps[k] = (o["time"], o["reached_step"])
    t0 = t = None
    per_attempt = []
    for i, L in enumerate(live):
        kept = steps.filter(pl.col("attempt") == L.index)
        last_row, end = last_record(L)
        first_start = None
        if kept.height:
            first_start = kept["time"][0] - (kept["step_time_s"][0] or 0.0)
        start = launch_start(L)
        start = start if start is not None else first_start if first_start is not None else last_row
        if start is None:
            continue
        if t is None:
            t0 = t = start
        b = dict.fromkeys(BUCKETS, 0.0)
        b_prod = 0.0
        a_start = t
        wait = max(0.0, start - t)
        b["downtime"] += wait
        t = max(t, start)
        if kept.height:
            e = pl.max_horizontal(pl.col("time").cum_max(), pl.lit(t))
            kept = kept.with_columns(_e=e).with_columns(_d=pl.col("_e") - pl.col("_e").shift(1).fill_null(t))
            cut = _inside(kept, med)
            gaps = cut.with_columns(prev_eval=pl.col("_eval").shift(1).fill_null(False), first=pl.int_range(pl.len()) == 0)
            b["startup"] += float(gaps.filter("first")["gap"].sum())
            b["eval"] += float(gaps.filter(~pl.col("first") & pl.col("prev_eval"))["gap"].sum())
            b["other"] += float(gaps.filter(~pl.col("first") & ~pl.col("prev_eval"))["gap"].sum())
            for name in ("checkpoint", "eval_in", *_INSIDE):
                b["eval" if name == "eval_in" else name] += float(cut[name].sum())
            b_prod += float(cut["productive"].sum())
            t = float(cut["_e"][-1])
            last_eval = bool(cut["_eval"][-1])
        else:
            last_eval = False
        later = [att[M.index]["first_step"] for M in live[i + 1:] if att.get(M.index, {}).get("first_step") is not None]
        cutoff = min(later) if later else None
        mine = att.get(L.index, {})
        cap = caps.get(L.index)
        last_row, end, beat, reached = _capped(L, mine, last_row, end, cap)
        wasted_steps = 0
        if cutoff is not None and reached is not None:
            wasted_steps = max(0, reached - cutoff + 1)
        if wasted_steps and last_row is not None and last_row > t:
            b["wasted_progress"] += last_row - t
            t = last_row
        if beat is not None and beat > t:  # ended steps its rows do not hold (a kill): from the heartbeat
            w = _recomputed_share(mine.get("last_step"), reached, cutoff)
            b["wasted_progress"] += (beat - t) * w
            b_prod += (beat - t) * (1 - w)
            t = beat
        tail = max(0.0, end - t) if end is not None else 0.0  # after the last row: shutdown (and a last eval)
        shutdown = tail if i < len(live) - 1 else 0.0
        b["downtime" if shutdown else "eval" if last_eval else "other"] += tail
        t += tail
        entry = _entry(L.index, a_start, t, b_prod, b, wasted_steps)
        per_attempt.append({**entry, "downtime_before_s": wait, "shutdown_s": shutdown})
    if t0 is None:
        return None
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
