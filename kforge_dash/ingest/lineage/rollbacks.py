"""In-process rollbacks: a step that goes back within one attempt is a restart, kept as a lineage.

A loop that reloads an earlier checkpoint without a new process (a loss-spike rollback; an
in-process restart) ends steps it had ended before, in the same attempt folder: steps 1-150, then
101-200. The row pass keeps the last row written of each (rank, step), as for any repeat
(window.dedup_rows); this module, run once after it for the (rank, attempt)s that had repeats,
tells a rollback from a plain duplicate and keeps what the rollback superseded (docs/restarts.md,
"Rollbacks in one process"):

- Per (rank, attempt), its rows that ended a step in end-time order (ties: write order), as the
  recorder wrote them and as period.py orders them. A *rollback* is where a step is below the one
  ended just before it and its earlier row is still on the kept line (``_rolled_back``: steps ended
  out of order are none); it resumed at that step (``resumed_at_step``), from the step before it
  (``previous_last_step``). The same step twice in a row is a plain duplicate (today's warning).
- A row is *superseded by a rollback* when it ended before the rollback, at or past the step it
  resumed at: ended again later or never (the pass after it stopped below it: ``Lineage.tails``, which
  the row pass's keep-the-last cannot see; run.py reads the run again without them when its kept line
  holds one). It belongs to the first rollback after it that does so. Its values go to
  ``RUN/ingested/superseded.parquet`` (the format of kforge-import's ``imported/superseded.parquet``:
  ``tag, step, time, value, reason, superseded_at_step``, plus ``attempt``), one point per step and
  column, the mean over the ranks that rolled back (their Recorder.log values folded in).
- The time those rows took is *wasted progress*: the period (period.py) of the first kept row
  after them held it, since the rows before it in end time were dropped; ``period_fix`` says how
  much to take off each step's ``step_time_s`` (the mean over its ranks), and each rollback's
  ``wasted_s`` is what it took off (goodput books it as ``wasted_progress``).

The rows a relaunch superseded (an earlier launch's rows at or past the step a later launch resumed at,
which the row pass never reads: plan.py's cut-off) go to the same file with ``reason`` ``relaunch``.

Rows are read again only for the (rank, attempt)s with repeats (their step and time columns first: a plain
duplicate costs no more) and for the parts of a relaunched launch that reach its cut-off: a run with
neither costs nothing. ``benchmarks/bench_rollback_ingest.py`` measures the rest.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

import numpy as np
import polars as pl

from kforge_dash.contract import SUPERSEDED_FILE
from kforge_dash.ingest.inputs.read import PartToRead, scan_part
from kforge_record.atomic import atomic_path

ROLLBACK = "rollback"  # superseded.parquet ``reason`` and restarts[].why of an in-process rollback
RELAUNCH = "relaunch"  # superseded.parquet ``reason`` of rows a later launch superseded
_IDS = ("step", "rank", "attempt", "time", "_pos", "_event", "_prev")
_ENDS = ("step", "time", "step_time_s")


@dataclass
class Lineage:
    """What the rollbacks of a run are, and what its restarts superseded (empty: none)."""

    restarts: list[dict] = field(default_factory=list)  # summary "restarts" entries, in_process: true
    # (rank, attempt) -> steps recorded more than once that no rollback explains (the duplicate warning)
    duplicates: dict = field(default_factory=dict)
    superseded: pl.DataFrame | None = None  # superseded.parquet's rows (None: nothing superseded)
    # (rank, attempt, step, seconds, resumed_at_step, previous_last_step): per kept row whose period held
    # the time of superseded rows, the rollback they belong to
    period_fix: list = field(default_factory=list)
    # rank, attempt, step, time of the rows a rollback superseded that were never ended again (the pass after
    # it stopped below them: steps 121-150 of 1-150 then 101-120), and every earlier row of their steps (121-130
    # of pass 1 in 1-150, 101-130, 111-120), which the row pass drops (window.dedup_rows)
    tails: pl.DataFrame | None = None
    warnings: list[str] = field(default_factory=list)  # for summary.json: rows with no end time, per file


def find_rollbacks(plan, repeats: dict, bad: dict) -> Lineage:
    """The rollbacks of the (rank, attempt)s in ``repeats`` (rows.Rows.repeats), read from ``plan``'s
    parts (not those in ``bad``, which failed to decode), and the rows relaunches superseded."""
    out = Lineage()
    by = {}
    for f in plan.files:
        if (f.rank, f.launch) in repeats and f.part.path not in bad:
            by.setdefault((f.rank, f.launch), []).append(f)
    events: dict[tuple, dict] = {}
    frames, tails = [], []
    for key, n in sorted(repeats.items()):
        if not n or key not in by:
            continue
        items = sorted(by[key], key=lambda f: os.path.basename(f.part.path))
        try:  # the steps and times first (a plain duplicate costs no more), every column of the rolled-back steps
            light = _rows(items, plan.spec, columns=_ENDS)
            _warn_no_time(light, items, key, out.warnings)
            got = _went_back(light) and _one(light, lambda lo, hi, i=items: _rows(i, plan.spec, steps=(lo, hi)),
                                             key, events, out.period_fix, tails)
        except (pl.exceptions.PolarsError, OSError):  # unreadable now: the row pass warned about its parts
            got = None
        if not got:
            out.duplicates[key] = n
            continue
        dup, sup = got
        if dup:
            out.duplicates[key] = dup
        frames.append(sup)
    out.restarts = [_entry(k, e) for k, e in sorted(events.items())]
    out.tails = pl.concat(tails, how="vertical") if tails else None
    parts = [_long(pl.concat(frames, how="vertical_relaxed"), plan.spec.cols, ROLLBACK)] if frames else []
    parts += [x for x in (_relaunched(plan, L, bad) for L in plan.launches) if x is not None]
    out.superseded = pl.concat(parts, how="vertical").sort(
        "attempt", "superseded_at_step", "previous_last_step", "tag", "step", nulls_last=True) if parts \
        else None
    return out


def _relaunched(plan, L, bad: dict) -> pl.DataFrame | None:
    """The rows of launch ``L`` at or past its cut-off (the step a later launch resumed at), which the
    row pass never reads: superseded by that relaunch (reason ``relaunch``). Only its parts that reach
    the cut-off are read."""
    cut = plan.spec.cutoff.get(L.index)
    if cut is None:
        return None
    spec = replace(plan.spec, cutoff={**plan.spec.cutoff, L.index: None})
    frames = []
    for a in sorted(L.attempts, key=lambda a: a.rank):
        items = [PartToRead(p, a.rank, L.index) for p in sorted(a.parts, key=lambda p: os.path.basename(p.path))
                 if p.num_rows and p.max_step is not None and p.max_step >= cut and p.path not in bad]
        if not items:
            continue
        try:
            df = _rows(items, spec, steps=(cut, 1 << 62))
        except (pl.exceptions.PolarsError, OSError):  # unreadable: the row pass warns about its parts
            continue
        ended = df.filter(pl.col("step_time_s").is_not_null()).sort("time", "_pos", nulls_last=True)
        rows = _fold_logs(ended.with_columns(_event=pl.lit(cut, pl.Int64), _prev=pl.lit(None, pl.Int64)),
                          df.filter(pl.col("step_time_s").is_null()),
                          ended)
        if rows.height:
            frames.append(rows.unique(["step"], keep="last", maintain_order=True))
    if not frames:
        return None
    return _long(pl.concat(frames, how="vertical_relaxed"), spec.cols, RELAUNCH)


def _rows(items: list, spec, *, columns: tuple[str, ...] | None = None, steps: tuple[int, int] | None = None
          ) -> pl.DataFrame:
    """The kept rows of one (rank, attempt) (only ``columns``, when given; only steps lo..hi, when given), with
    ``_pos``: its place in write order."""
    lo, hi = steps if steps is not None else (-(1 << 62), (1 << 62) - 1)
    frames = [scan_part(f, spec, lo, hi + 1).with_columns(_pos=pl.col("_row").cast(pl.Int64) + (i << 32)).drop("_row")
              for i, f in enumerate(items)]
    if columns is not None:
        frames = [f.select(*columns, "_pos") for f in frames]
    return pl.concat(pl.collect_all(frames), how="vertical")


def _went_back(df: pl.DataFrame) -> bool:
    """Whether a row that ended a step ended one below the step ended just before it (end-time order)."""
    s = df.filter(pl.col("step_time_s").is_not_null()).sort("time", "_pos", nulls_last=True)["step"].to_numpy()
    return bool(np.any(s[1:] < s[:-1]))


def _one(light: pl.DataFrame, fetch, key: tuple, events: dict, fix: list, tails: list):
    """(plain duplicate steps, superseded rows with ``_event``) of one (rank, attempt), or None when it did
    not roll back, from its rows' steps and times (``light``); ``fetch(lo, hi)``: every column of its rows of
    steps lo..hi. Adds its rollbacks to ``events``, its kept rows' fixes to ``fix`` and, when a row a rollback
    superseded was never ended again (the pass after it stopped below it), those rows to ``tails``."""
    ended = light.filter(pl.col("step_time_s").is_not_null()).sort("time", "_pos", nulls_last=True)
    s = ended["step"].to_numpy()
    drops = np.flatnonzero(s[1:] < s[:-1]) + 1  # rows that went back
    if not drops.size:
        return None
    n = len(s)
    t = ended["time"].to_numpy().astype(np.float64)
    st = ended["step_time_s"].to_numpy().astype(np.float64)
    order = np.lexsort((np.arange(n), s))  # by step, then position
    same_next = np.r_[s[order][1:] == s[order][:-1], False]
    nxt, prv = np.full(n, -1), np.full(n, -1)
    nxt[order[same_next]] = order[np.flatnonzero(same_next) + 1]  # the next row ending the same step
    prv[nxt[nxt >= 0]] = np.flatnonzero(nxt >= 0)  # the row before that ended the same step
    owner = _rolled_back(s, drops, prv, nxt)  # each row's rollback (the row that went back), -1: none
    by_rollback = owner >= 0
    if not by_rollback.any():  # steps ended out of order, and plain duplicates: no row a rollback superseded
        return None
    superseded = nxt >= 0
    rank, att = key
    went = np.unique(owner[by_rollback])
    for j in went:
        e = events.setdefault((att, int(s[j]), int(s[j - 1])), {"ranks": set(), "time": None})
        e["ranks"].add(rank)
        start = t[j] - st[j]
        e["time"] = start if e["time"] is None else min(e["time"], start)
    orphan = by_rollback & ~superseded  # on the kept line until the row pass drops them (dedup_rows)
    if orphan.any():
        # every row of such a step goes, the ones ended before it too: steps 121-130 of 1-150, 101-130, 111-120
        # are pass 2's tails, and pass 1's would come back once those were left out
        orphan = np.isin(s, s[orphan])
        tails.append(ended.filter(pl.Series(orphan)).select(
            pl.lit(rank, pl.Int64).alias("rank"), pl.lit(att, pl.Int64).alias("attempt"), "step", "time"))
    own = np.r_[st[0], np.diff(t)]  # each row's period in end-time order
    _held(rank, att, s, own, by_rollback, superseded, owner, fix)
    dup = int(np.unique(s[superseded & ~by_rollback]).size)
    at = owner[by_rollback]  # each superseded row's rollback: the step it went back to, the one before it
    gone = pl.DataFrame({"_pos": ended["_pos"].to_numpy()[by_rollback], "_event": s[at], "_prev": s[at - 1]},
                        schema={"_pos": pl.Int64, "_event": pl.Int64, "_prev": pl.Int64})
    full = fetch(int(s[by_rollback].min()), int(s[by_rollback].max()))
    ended_full = full.filter(pl.col("step_time_s").is_not_null())
    rows = ended_full.join(gone, on="_pos", how="inner")
    return dup, _fold_logs(rows, full.filter(pl.col("step_time_s").is_null()), ended_full)


def _warn_no_time(light: pl.DataFrame, items: list, key: tuple, warnings: list[str]) -> None:
    """One warning per (rank, attempt) whose rows that ended a step have no end time (``time`` null), naming
    its files: such rows are placed in write order, after every row with a time."""
    at = light.filter(pl.col("step_time_s").is_not_null() & pl.col("time").is_null()).select(
        pl.col("_pos") // (1 << 32))["_pos"]  # the part's place in ``items``
    if not at.len():
        return
    files = [items[i].part.path for i in at.unique().sort().to_list()]
    more = f" and {len(files) - 1} more part files" if len(files) > 1 else ""
    warnings.append(f"{files[0]}{more}: {at.len()} rows of rank {key[0]}, attempt {key[1]} ended a step with no end "
                    "time (time null); placed in write order, after the rows with one, to tell a rollback")


def _rolled_back(s: np.ndarray, drops: np.ndarray, prv: np.ndarray, nxt: np.ndarray) -> np.ndarray:
    """Per row (end-time order, steps ``s``), the rollback that superseded it (that row's place), -1: none.

    A rollback is a row that went back (``drops``) to a step whose earlier end (``prv``) is still on the kept
    line; it takes off the kept line every row before it at or past its step. A step ended below the one
    before it for the first time (steps ended out of order: 1, 3, 2, 4), or again after a rollback already
    took its earlier end off (101, 103, 102 after 1-150), is no rollback. A row ended again (``nxt``) before
    its rollback is a plain duplicate (-1). A row never ended again stays unless it lies past every step
    ended from a rollback at or below it on: steps 121-150 of 1-150 then 101-120 go, a step the later pass
    skipped stays. A loop over the rows that went back (a few per rollback)."""
    n = len(s)
    owner = np.full(n, -1)
    events = []
    for j in drops.tolist():
        p = prv[j]
        if p < 0 or owner[p] >= 0:
            continue
        events.append(j)
        hit = np.flatnonzero((owner[:j] < 0) & (s[:j] >= s[j]))
        owner[hit] = j
    if not events:
        return owner
    top = np.maximum.accumulate(s[::-1])[::-1]  # the highest step ended from each row on
    last = nxt < 0
    past = np.zeros(n, bool)  # never ended again, past every step ended after a rollback at or below it
    for j in events:
        past[:j] |= last[:j] & (s[:j] >= s[j]) & (s[:j] > top[j])
    owner[(last & ~past) | (~last & (nxt < owner))] = -1
    return owner


def _held(rank: int, att: int, s, own, by_rollback, superseded, drop_of, fix: list) -> None:
    """The seconds of rows a rollback superseded, held by the period of the next kept row (one with a kept
    row before them: the first kept row of a (rank, attempt) has its own step time as its period): one
    ``fix`` entry per such kept row and rollback (``drop_of``: each row's)."""
    seq = np.flatnonzero(by_rollback | ~superseded)  # in end-time order
    rb = by_rollback[seq]
    kept = np.flatnonzero(~rb)  # places in seq of the kept rows
    if not kept.size:
        return
    k = np.flatnonzero(rb)
    k = k[k > kept[0]]
    to = np.searchsorted(kept, k)  # the next kept row of each
    k, to = k[to < kept.size], to[to < kept.size]
    if not k.size:
        return
    d = drop_of[seq[k]]  # each one's rollback: a kept row may hold the rows of two (1-150, 101-130, 51-60)
    pairs, at = np.unique(np.stack([to, d], axis=1), axis=0, return_inverse=True)
    held = np.bincount(at.ravel(), weights=own[seq[k]], minlength=len(pairs))
    for (j, dj), h in zip(pairs.tolist(), held.tolist()):
        if not np.isfinite(h):  # rows with no end time (find_rollbacks warns): no time to take off
            continue
        fix.append((rank, att, int(s[seq[kept[j]]]), float(h), int(s[dj]), int(s[dj - 1])))


def _fold_logs(rows: pl.DataFrame, logs: pl.DataFrame, ended: pl.DataFrame) -> pl.DataFrame:
    """Recorder.log values of superseded ``rows``: a log row belongs to the ended row of its step nearest
    to it in write order (``_pos``); the ended row's own values win, the last logged fills the rest."""
    if not logs.height or not rows.height:
        return rows
    at = ended.select("step", pl.col("_pos").alias("_at")).with_columns(_pos=pl.col("_at")).sort("_pos")
    logs = logs.sort("_pos").join_asof(at, on="_pos", by="step", strategy="nearest")
    logs = logs.filter(pl.col("_at").is_in(rows["_pos"].implode()))
    if not logs.height:
        return rows
    vals = [c for c in rows.columns if c not in (*_IDS, "step_time_s")]
    agg = logs.group_by("_at").agg([pl.col(c).drop_nulls().last() for c in vals])
    joined = rows.join(agg, left_on="_pos", right_on="_at", how="left", suffix="__log")
    return joined.with_columns([pl.coalesce(c, f"{c}__log").alias(c) for c in vals]).select(rows.columns)


def _entry(key: tuple, e: dict) -> dict:
    att, first, prev = key
    return {"attempt": att, "resumed_at_step": first, "previous_last_step": prev,
            "superseded_steps": max(0, prev - first + 1), "time": e["time"], "in_process": True, "why": ROLLBACK,
            "ranks": sorted(e["ranks"]), "wasted_s": 0.0}


def _long(sup: pl.DataFrame, cols: list[str], reason: str) -> pl.DataFrame:
    """superseded.parquet: one point per (restart, step, column), the mean over ranks."""
    # tokens left out: a mean of per-rank counts is no step's tokens (steps.parquet sums them)
    vals = [c for c in cols if c not in ("step", "rank", "attempt", "time", "tokens", "_counts") and c in sup.columns]
    # one branch per restart: two rollbacks to one checkpoint differ by the step each went back from (_prev)
    per = sup.group_by("attempt", "_event", "_prev", "step").agg(
        pl.col("time").max(), *[pl.col(c).cast(pl.Float64).mean() for c in vals])
    return (per.unpivot(index=["attempt", "_event", "_prev", "step", "time"], on=vals, variable_name="tag")
            .filter(pl.col("value").is_not_null())
            .select(pl.col("tag"), pl.col("step"), pl.col("time"), pl.col("value").cast(pl.Float64),
                    pl.lit(reason).alias("reason"), pl.col("_event").alias("superseded_at_step"),
                    pl.col("attempt"), pl.col("_prev").alias("previous_last_step")))


def apply_fix(steps: pl.DataFrame, lineage: Lineage, *, from_step: int | None, fresh: bool = True) -> pl.DataFrame:
    """``steps`` with each kept step's ``step_time_s`` less the superseded rows' time its ranks'
    periods held (the mean over the ranks that ended it); each rollback's ``wasted_s`` set to what was
    taken off. ``from_step``: only the steps from there on had their periods computed by this pass
    (an append keeps the earlier ones, fixed already): the rest are left as they are; ``fresh`` False:
    none was (steps.parquet stands)."""
    if not lineage.period_fix:
        return steps
    fix = pl.DataFrame(lineage.period_fix, orient="row", schema={
        "rank": pl.Int64, "attempt": pl.Int64, "step": pl.Int64, "less": pl.Float64, "first": pl.Int64, "prev": pl.Int64})
    n = steps.select("step", "n_ranks")
    fix = fix.join(n, on="step", how="left").with_columns(share=pl.col("less") / pl.col("n_ranks").clip(lower_bound=1))
    by_event = {(a, f, p): w for a, f, p, w in fix.group_by("attempt", "first", "prev").agg(pl.col("share").sum()).iter_rows()}
    for r in lineage.restarts:
        r["wasted_s"] = float(by_event.get((r["attempt"], r["resumed_at_step"], r["previous_last_step"])) or 0.0)
    if not fresh:
        return steps
    less = fix.group_by("step").agg(pl.col("share").sum())
    if from_step is not None:
        less = less.filter(pl.col("step") >= from_step)
    return steps.join(less, on="step", how="left").with_columns(
        (pl.col("step_time_s") - pl.col("share").fill_null(0.0)).alias("step_time_s")).drop("share")


def holds_tails(ranks_path: str | None, lineage: Lineage) -> bool:
    """Whether ranks.parquet (the kept line the row pass wrote, under its temp name; None: it wrote none) holds
    rows of ``lineage.tails``: rows a rollback superseded that no later row ended again, which only a row pass
    that knows them leaves out. An append on top of such a pass finds none (its old rows have none, a new part
    ends no step earlier)."""
    tails = lineage.tails
    if tails is None or ranks_path is None or not os.path.exists(ranks_path):
        return False
    kept = pl.scan_parquet(ranks_path, glob=False).select("rank", "attempt", "step", "time")
    tails = tails.cast(dict(kept.collect_schema()))
    got = (kept.filter(pl.col("step").is_between(tails["step"].min(), tails["step"].max()))
           .join(tails.lazy(), on=["rank", "attempt", "step", "time"], how="semi", nulls_equal=True)
           .select(pl.len()).collect())
    return bool(got.item())


def write_superseded(out_dir: str, lineage: Lineage) -> None:
    """RUN/ingested/superseded.parquet, or none when nothing was superseded (an old one removed)."""
    path = os.path.join(out_dir, SUPERSEDED_FILE)
    if lineage.superseded is None:
        if os.path.exists(path):
            os.remove(path)
        return
    with atomic_path(path) as tmp:
        lineage.superseded.write_parquet(tmp, compression="zstd")


def warn_duplicates(duplicates: dict, warnings: list[str]) -> None:
    for (rank, att), n in sorted(duplicates.items()):
        warnings.append(f"rank {rank}: {n} steps recorded more than once in attempt {att}; the last kept")
