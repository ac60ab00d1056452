"""The work of one step window, as one function of plain values: rows -> de-duplicated rows ->
one row per step (docs/CONTRACT.md, "Ingested outputs").

A window far bigger than ``batch_rows`` (every rank's part files start together, so 1,024 ranks
in 10k-step parts make 10M-row windows however small chunk_rows is) is read in batches of ranks
(read.read_batches): each batch is coalesced, de-duplicated and handed on for ranks.parquet in
the order one read of the window gives, and its per-step reductions are added up
(reduce.StepAcc), so only a batch of rows and the window's step times (8 bytes a row) and
periods (period.LocalPeriods, 16 bytes a row) are held at once.

``ingest_window`` takes a ``WindowTask`` (picklable: paths, footers, column names, numbers) and
returns a ``WindowRows``, so windows can be handed to other processes; ingest itself runs them
one after the other (kforge_dash.ingest.rowpass.rows) through ``start_window``: each batch's reductions
on a worker thread (``Reducer``) while the next batch is read, and its rows written by the ranks
writer's thread, so reading, reducing and writing overlap.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import polars as pl
import pyarrow as pa

from kforge_dash.ingest.inputs.read import LOGGED_FIXED, PartToRead, ReadSpec, read_batches, read_window, rows_in
from kforge_dash.ingest.rowpass.append import old_rows
from kforge_dash.ingest.rowpass.buffers import Buffers
from kforge_dash.ingest.rowpass.coalesce import Clashes
from kforge_dash.ingest.rowpass.period import LocalPeriods, local_periods
from kforge_dash.ingest.rowpass.ranks_writer import arrow_table
from kforge_dash.ingest.rowpass.reduce import StepAcc, reduce_steps


@dataclass(frozen=True)
class WindowTask:
    """One window [lo, hi) of steps to read and reduce."""

    lo: int
    hi: int
    # The part files to read; those outside the window are passed over, so a scheduler that ships
    # tasks elsewhere can send only read.overlapping_parts(files, lo, hi).
    files: list[PartToRead]
    spec: ReadSpec
    skip: dict[str, str] = field(default_factory=dict)  # path -> warning: parts found corrupt before
    old_ranks_path: str | None = None  # an append: the last ingest's ranks.parquet, merged in
    # Read in batches of ranks of about this many rows when the window holds more (None: whole).
    # An append's window (old_ranks_path) is read whole.
    batch_rows: int | None = None


@dataclass(frozen=True)
class WindowRows:
    """What one window gave."""

    rows: pa.Table | None  # the rows for ranks.parquet (None: handed to ``put_rows`` instead, or none)
    steps: pl.DataFrame | None  # one row per step, before tokens/s, MFU and EMAs (None: no rows)
    rank_ids: set[int]
    repeats: dict[tuple[int, int], int]  # (rank, launch) -> steps recorded more than once
    bad: dict[str, str]  # path -> warning: parts found corrupt in this window
    warnings: list[str]
    reads: tuple[int, ...] = ()  # rows of each read: the whole window, or each batch of its ranks
    ends: tuple[LocalPeriods, ...] = ()  # the periods of its rows that ended a step, batch by batch


def ingest_window(task: WindowTask, *, buffers: Buffers | None = None,
                  put_rows: Callable[[pa.Table], None] | None = None) -> WindowRows:
    """Read, coalesce, de-duplicate and reduce the rows of one window.

    ``buffers``: numpy work space reused from the previous window in this process. ``put_rows``:
    called with the rows as soon as they are ready, before the reduction (so a background writer
    overlaps it); without it they come back in ``WindowRows.rows``.
    """
    buffers = buffers or Buffers()
    return start_window(task, buffers=buffers, read_buffers=buffers, put_rows=put_rows, reducer=Inline()).finish()


class Inline:
    """A reducer that runs each reduction at once, on the calling thread (Reducer's interface)."""

    def submit(self, fn, *args) -> Future:
        f: Future = Future()
        f.set_result(fn(*args))  # (an error is raised here, at once)
        return f

    hand_over = submit


class Reducer:
    """The reductions of every batch on ONE worker thread, in the order given, while the calling
    thread reads the next batch (numpy and polars release the GIL). At most one batch waits for
    its reduction (``hand_over``): the batch being read, and the one being reduced and written,
    as with read-then-reduce (where the writer's thread held the last batch while the next was read)."""

    def __init__(self):
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kforge-reduce")
        self.pending: Future | None = None

    def submit(self, fn, *args) -> Future:
        return self.pool.submit(fn, *args)

    def hand_over(self, fn, *args) -> Future:
        """fn(*args), once the one handed over before it is done (its error re-raised here)."""
        if self.pending is not None:
            self.pending.result()
        self.pending = self.pool.submit(fn, *args)
        return self.pending

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


@dataclass
class PendingWindow:
    """A window whose rows are all read; its reductions may still run on the reducer."""

    bad: dict[str, str]  # path -> warning: parts found corrupt in this window (known now)
    make: Callable[[], WindowRows]

    def finish(self) -> WindowRows:
        return self.make()


def start_window(task: WindowTask, *, buffers: Buffers, read_buffers: Buffers, reducer,
                 put_rows: Callable[[pa.Table], None] | None = None) -> PendingWindow:
    """ingest_window, with every reduction handed to ``reducer`` (a Reducer, or Inline): returns
    once the window's rows are read and handed on. ``buffers`` are the reducer's work space,
    ``read_buffers`` the reads' (the same object only when the reducer is Inline)."""
    spec = task.spec
    bad, warnings = dict(task.skip), []
    old = None
    if task.old_ranks_path is not None:
        old = old_rows(task.old_ranks_path, task.lo, task.hi, spec.cols, spec.counts_tokens)
    elif task.batch_rows is not None:
        batches = read_batches(task.files, task.lo, task.hi, task.batch_rows, cutoff=spec.cutoff, bad=bad)
        if len(batches) > 1:
            return _in_batches(task, batches, bad, warnings, buffers, read_buffers, reducer, put_rows)
    df = read_window(task.files, spec, task.lo, task.hi, bad=bad, warnings=warnings, buffers=read_buffers, old=old)
    new_bad = {p: w for p, w in bad.items() if p not in task.skip}
    if not df.height:
        return PendingWindow(new_bad, lambda: WindowRows(None, None, set(), {}, new_bad, warnings, (0,)))
    repeats: dict[tuple[int, int], int] = {}
    read = df.height
    df = dedup_rows(df, repeats, read_buffers, spec.tails)
    rows = arrow_table(df, exclude=("_counts",))
    rank_ids = set(df["rank"].unique().to_list())
    ends = (local_periods(df),)
    steps = _reduce_and_write(reducer, put_rows, rows, reduce_steps, df, spec.cols, spec.counts_tokens is not None,
                              buffers)
    rows = None if put_rows is not None else rows
    return PendingWindow(new_bad, lambda: WindowRows(rows, steps.result(), rank_ids, repeats, new_bad, warnings,
                                                     (read,), ends))


def _reduce_and_write(reducer, put_rows, rows: pa.Table, fn, *args) -> Future:
    """fn(*args) on the reducer and ``rows`` to ``put_rows`` (if any), each as soon as it can
    start: with a Reducer the reduction is handed over first, so it runs while ``put_rows`` waits
    for the last write; run here (Inline), the rows go first, to be written while it runs."""
    if isinstance(reducer, Inline):
        if put_rows is not None:
            put_rows(rows)
        return reducer.hand_over(fn, *args)
    done = reducer.hand_over(fn, *args)
    if put_rows is not None:
        put_rows(rows)
    return done


def _in_batches(task: WindowTask, batches: list[list[PartToRead]], bad: dict, warnings: list[str],
                buffers: Buffers, read_buffers: Buffers, reducer,
                put_rows: Callable[[pa.Table], None] | None) -> PendingWindow:
    """start_window, the window read batch after batch (module docstring). Rows of steps a rank
    never ended (log rows only) come at the end of the window, as one read of it gives them."""
    spec = task.spec
    acc = StepAcc(spec.cols, spec.counts_tokens is not None, buffers,
                  expect_rows=sum(rows_in(f, task.lo, task.hi) for b in batches for f in b))
    clashes, repeats, rank_ids, tables, unended, reads, ends = Clashes(), {}, set(), [], [], [], []
    added: list[Future] = []  # the last batch's add (an error in it is raised by finish)

    def hand_on(df: pl.DataFrame) -> None:
        df = dedup_rows(df, repeats, read_buffers, spec.tails)
        rank_ids.update(df["rank"].unique().to_list())
        ends.append(local_periods(df))
        rows = arrow_table(df, exclude=("_counts",))
        if put_rows is None:
            tables.append(rows)
        added[:] = [_reduce_and_write(reducer, put_rows, rows, acc.add, df)]

    for files in batches:
        df = read_window(files, spec, task.lo, task.hi, bad=bad, warnings=warnings, buffers=read_buffers,
                         clashes=clashes)
        reads.append(df.height)
        ended = df["step_time_s"].is_not_null()
        if not ended.all():
            unended.append(df.filter(~ended))
            df = df.filter(ended)
        if df.height:
            hand_on(df)
        df = None  # (freed before the next batch is read)
    if unended:
        hand_on(pl.concat(unended, how="vertical"))
    warnings.extend(clashes.warnings([*LOGGED_FIXED, *spec.scalars]))
    new_bad = {p: w for p, w in bad.items() if p not in task.skip}
    if not rank_ids:
        return PendingWindow(new_bad, lambda: WindowRows(None, None, set(), {}, new_bad, warnings, tuple(reads)))
    rows = pa.concat_tables(tables) if put_rows is None else None
    steps = reducer.submit(acc.result)  # after every add: the reducer runs them in order

    def finish() -> WindowRows:
        added[0].result()  # (an error of the last add, not hidden by a result of half the rows)
        return WindowRows(rows, steps.result(), rank_ids, repeats, new_bad, warnings, tuple(reads), tuple(ends))
    return PendingWindow(new_bad, finish)


def dedup_rows(df: pl.DataFrame, repeats: dict, buffers: Buffers | None = None,
               tails: pl.DataFrame | None = None) -> pl.DataFrame:
    """One row per (rank, step): the last one written wins, wherever the repeat is (end_step
    called twice for a step, or an in-process rollback: steps 1..10 then 6..12). The steps
    recorded more than once are counted per (rank, attempt) into ``repeats``. ``buffers``: work
    space reused from the last call (on the calling thread). ``tails``: rows (rank, attempt, step,
    time) a rollback superseded that no later row ended again (rollbacks.Lineage.tails), left out.

    Rows come attempt by attempt, rank by rank, in write order (log rows of steps never ended
    last), and restarts across attempts are already cut off, so a (rank, step) can repeat only
    within one such block: when every block's steps strictly increase (the usual case, one cheap
    pass) there is nothing to do. Otherwise each block is put back in step order.
    """
    if tails is not None:
        _count_repeats(df, repeats)
        tails = tails.cast({c: df.schema[c] for c in tails.columns})
        # (a null end time matches a null one: a part written without times, rollbacks.find_rollbacks warns)
        df = df.join(tails, on=["rank", "attempt", "step", "time"], how="anti", maintain_order="left", nulls_equal=True)
    elif _steps_increase(df, buffers or Buffers()):
        return df
    else:
        _count_repeats(df, repeats)
    log = pl.col("step_time_s").is_null()
    same = ((pl.col("rank") == pl.col("rank").shift(1)) & (pl.col("attempt") == pl.col("attempt").shift(1))
            & (log == log.shift(1))).fill_null(False)
    return (df.with_columns((~same).cum_sum().alias("_block"))
            .unique(["rank", "step"], keep="last", maintain_order=True)
            .sort("_block", "step", maintain_order=True).drop("_block"))


def _count_repeats(df: pl.DataFrame, repeats: dict) -> None:
    n = df.group_by("rank", "attempt", "step").len().filter(pl.col("len") > 1).group_by("rank", "attempt").len()
    for rank, att, k in n.iter_rows():
        repeats[(rank, att)] = repeats.get((rank, att), 0) + k


def _steps_increase(df: pl.DataFrame, buffers: Buffers) -> bool:
    """Whether each block of rows (one rank, attempt, and kind: ended or log row) has strictly
    increasing steps. In numpy, in reused buffers: the polars expression of shifted columns
    compared made five window-sized temporaries, new pages every batch (156k page faults at
    1,024 ranks). Steps fall or repeat only where a block starts (a few per batch) unless
    something repeats; only those rows are compared by rank, attempt and kind."""
    n = df.height
    if n < 2:
        return True
    step = buffers.column("dedup/step", df["step"])[0]  # (never null: such parts are skipped)
    down = buffers.get("dedup/down", np.bool_, n - 1)
    np.less_equal(step[1:], step[:-1], out=down)
    at = np.flatnonzero(down)  # row at + 1's step is not above row at's
    if not at.size:
        return True
    rows = pl.Series(np.r_[at, at + 1])
    pairs = df.select(pl.col("rank", "attempt").gather(rows), pl.col("step_time_s").gather(rows).is_null().alias("log"))
    a, b = pairs.slice(0, at.size), pairs.slice(at.size)
    return not ((a["rank"] == b["rank"]) & (a["attempt"] == b["attempt"]) & (a["log"] == b["log"])).any()
