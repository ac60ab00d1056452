"""The job's step time: the period between consecutive step ends, each rank on its own clock.

Per (rank, attempt), its rows that ended a step (``step_time_s`` not null, a finite ``time``) in
the order of their end times (ties by step): a row's period is its end time minus the end time
of the row before it; the first row of a (rank, attempt) has no end before it, and its period is
the longest ``start_step`` -> ``end_step`` time (``step_time_s``) of that first step over the
attempt's ranks: the job's first step began when its first rank began it (a rank that reached the
loop late waits for nobody, the others wait for it in the first collective). A step's job step
time (steps.parquet ``step_time_s``) is the mean of its ranks' periods. Summed over the steps,
the means telescope to the elapsed time from the first rank's first step start to the ranks' last
step end (their step ends line up under data parallelism), the time between ``end_step`` and the
next ``start_step`` included, and clock skew between hosts cancels (each difference is taken on
one clock). Ordered by end time, not by
step: steps ended out of order (a shuffled order, an in-process rollback) each get the time
since the end before them, so every second is counted once.

Ingest reads a run in step windows: each window hands its ended rows' steps and periods over
(``LocalPeriods``, 16 bytes a row: ``window.WindowRows.ends``), the first row of each (rank,
attempt) still holding its own step time, and ``PeriodAcc`` takes them in window order, carrying each
(rank, attempt)'s last end time from window to window (and from the rows an append keeps, whose
steps' periods stand), so the result does not depend on the window size (bit for bit: each
step's periods are added in (attempt, rank) order whatever the windows). A row that ended before
its (rank, attempt)'s last end in an earlier window (out of order across windows) cannot be
placed one window at a time: then ``out_of_order`` is set and the run's ended rows are read back
from ranks.parquet (these five columns, 32 bytes a row) and taken as one window (``exact_periods``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa

from kforge_dash.ingest.rowpass.arrays import np_array

END_COLUMNS = ("rank", "attempt", "step", "time", "step_time_s")


@dataclass(frozen=True)
class LocalPeriods:
    """The rows of one window (or one batch of its ranks) that ended a step, in (attempt, rank, end
    time, step) order: each row's step and its period since the row before it in its (rank,
    attempt). The first row of each block (one (rank, attempt)) holds its own step time until
    ``PeriodAcc.add`` knows the end before it. 16 bytes a row, plus a few per block."""

    step: np.ndarray  # int64, a row
    period: np.ndarray  # float64, a row
    first: np.ndarray  # each block's first row
    rank: np.ndarray  # each block's rank, attempt, first and last end time
    attempt: np.ndarray
    first_time: np.ndarray
    last_time: np.ndarray


def ended_rows(df: pl.DataFrame) -> pl.DataFrame | None:
    """The END_COLUMNS of the rows of ``df`` that ended a step (None: none did)."""
    ends = df.select(END_COLUMNS).filter(pl.col("step_time_s").is_not_null() & pl.col("time").is_finite())
    return ends if ends.height else None


def local_periods(df: pl.DataFrame) -> LocalPeriods | None:
    """LocalPeriods of the rows of ``df`` (one row per (rank, step) of each attempt; None: no row ended a step)."""
    ends = ended_rows(df)
    if ends is None:
        return None
    r, a, s = (ends[c].cast(pl.Int64).to_numpy() for c in ("rank", "attempt", "step"))
    t, w = (ends[c].cast(pl.Float64).to_numpy() for c in ("time", "step_time_s"))
    ends = None
    if not _blocks_in_time_order(r, a, t):
        order = np.lexsort((s, t, r, a))  # by attempt, rank, then end time (ties by step)
        r, a, s, t, w = r[order], a[order], s[order], t[order], w[order]
    period = np.empty_like(t)
    period[1:] = t[1:] - t[:-1]
    first = np.flatnonzero(np.r_[True, (r[1:] != r[:-1]) | (a[1:] != a[:-1])])
    period[first] = w[first]  # no end before it in these rows
    last = np.r_[first[1:], len(t)] - 1
    return LocalPeriods(s, period, first, r[first], a[first], t[first], t[last])


class PeriodAcc:
    """Each step's mean period over its ranks, window after window (``add``), then ``result``."""

    def __init__(self):
        self.last: dict[tuple[int, int], float] = {}  # (rank, attempt) -> its latest end time so far
        self.parts: list[pl.DataFrame] = []
        self.out_of_order = False  # a row ended before its (rank, attempt)'s last end in an earlier window

    def carry(self, rows: pa.Table | pl.DataFrame) -> None:
        """Rows whose steps' periods are known already (an append's kept head): only their
        latest end per (rank, attempt) is carried into the next window."""
        df = rows if isinstance(rows, pl.DataFrame) else pl.from_arrow(rows)
        ends = ended_rows(df)
        if ends is None:
            return
        for r, a, t in ends.group_by("rank", "attempt").agg(pl.col("time").max()).iter_rows():
            key = (int(r), int(a))
            self.last[key] = max(self.last.get(key, t), t)

    def add(self, window: list[LocalPeriods] | tuple) -> None:
        """One window's LocalPeriods (its batches in order), windows in step order."""
        window = [lp for lp in window if lp is not None]
        if not window:
            return
        starts: dict[tuple[int, int], list[tuple[LocalPeriods, int]]] = {}  # (attempt, step) -> its ranks' first rows
        for lp in window:
            for i, r, a, t_first, t_last in zip(lp.first.tolist(), lp.rank.tolist(), lp.attempt.tolist(),
                                                lp.first_time.tolist(), lp.last_time.tolist()):
                before = self.last.get((r, a))
                if before is not None:
                    lp.period[i] = t_first - before
                    self.out_of_order |= t_first < before
                else:
                    starts.setdefault((a, int(lp.step[i])), []).append((lp, i))
                self.last[(r, a)] = t_last if before is None else max(before, t_last)
        for rows in starts.values():  # an attempt's first step began when its first rank began it
            longest = max(lp.period[i] for lp, i in rows)
            for lp, i in rows:
                lp.period[i] = longest
        # the batches' rows in one sum per step, in row order: the bits of one read of the window
        self.parts.append(_mean_by_step([lp.step for lp in window], [lp.period for lp in window]))

    def result(self) -> pl.DataFrame:
        """(step, step_time_s): each step's mean period over the ranks that ended it."""
        if not self.parts:
            return pl.DataFrame(schema={"step": pl.Int64, "step_time_s": pl.Float64})
        return pl.concat(self.parts, how="vertical").sort("step")


def exact_periods(ranks_path: str) -> pl.DataFrame:
    """PeriodAcc.result over every ended row of ``ranks_path`` (ranks.parquet) taken as one window."""
    lf = pl.scan_parquet(ranks_path, glob=False)  # a path, never a pattern
    acc = PeriodAcc()
    acc.add([local_periods(lf.select(END_COLUMNS).collect())])
    return acc.result()


def _blocks_in_time_order(r: np.ndarray, a: np.ndarray, t: np.ndarray) -> bool:
    """Whether the rows come as one block per (rank, attempt), blocks by (attempt, rank), end
    times non-decreasing within each (the usual window: steps ended in order)."""
    new = (r[1:] != r[:-1]) | (a[1:] != a[:-1])
    if np.any(~new & (t[1:] < t[:-1])):
        return False
    at = np.flatnonzero(new)
    ka, kr = a[at + 1], r[at + 1]
    pa_, pr = a[at], r[at]
    return bool(np.all((ka > pa_) | ((ka == pa_) & (kr > pr))))


def _mean_by_step(steps: list[np.ndarray], periods: list[np.ndarray]) -> pl.DataFrame:
    """Each step's mean of the periods, the values added in row order, batch after batch (np.add.at, in
    order: the bits of one np.bincount over the batches' rows, without their concatenated copy)."""
    n = sum(len(s) for s in steps)
    lo, hi = min(int(s.min()) for s in steps if len(s)), max(int(s.max()) for s in steps if len(s))
    if hi - lo < 4 * n:  # steps of a window are dense: index by step
        # Batch by batch, not concatenated: PeriodAcc.add 0.72 -> 0.12 CPU-s on the row pass's main thread at 1,024
        # ranks x 20k steps (its row of `python3 benchmarks/bench_ingest_stages.py RUN`), no 16-byte copy of each row
        n_bins = hi - lo + 1
        total, count = np.zeros(n_bins), np.zeros(n_bins, np.int64)
        for s, period in zip(steps, periods):
            idx = s - lo
            np.add.at(total, idx, period)
            count += np.bincount(idx, minlength=n_bins)
        has = count > 0
        steps, total, count = np.arange(lo, hi + 1, dtype=np.int64)[has], total[has], count[has]
    else:
        s, period = np.concatenate(steps), np.concatenate(periods)
        steps, idx = np.unique(s, return_inverse=True)
        total, count = np.bincount(idx, weights=period), np.bincount(idx)
    return pl.from_arrow(pa.table({"step": np_array(steps.astype(np.int64)), "step_time_s": np_array(total / count)}))
