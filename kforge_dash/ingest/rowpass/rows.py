"""The row pass of one ingest: every window of rows into ranks.parquet and per-step rows, from
scratch or (with an AppendPlan) on top of the last ingest's outputs (docs/CONTRACT.md, "Re-ingest")."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import polars as pl

from kforge_dash.contract import RANKS_FILE, RUN_DERIVED_COLUMNS
from kforge_dash.ingest.inputs.plan import IngestPlan
from kforge_dash.ingest.inputs.read import PartToRead, overlapping_parts, plan_windows
from kforge_dash.ingest.options import IngestError
from kforge_dash.ingest.rowpass.append import AppendPlan, copy_head, old_ranks_parts, old_steps_head, recheck_bad
from kforge_dash.ingest.rowpass.buffers import Buffers
from kforge_dash.ingest.rowpass.merge import AppendConflict
from kforge_dash.ingest.rowpass.period import PeriodAcc, exact_periods
from kforge_dash.ingest.rowpass.ranks_writer import RanksWriter
from kforge_dash.ingest.rowpass.reduce import step_columns
from kforge_dash.ingest.rowpass.window import Reducer, WindowTask, ingest_window, start_window
from kforge_record.atomic import publish, temp_name


@dataclass(frozen=True)
class Rows:
    """What the row pass gave."""

    steps: pl.DataFrame  # one row per step (step_time_s: the period, period.py), before tokens/s, MFU and the EMAs
    rank_ids: set[int]
    repeats: dict[tuple[int, int], int]  # (rank, launch) -> steps recorded more than once
    bad: dict[str, str]  # part path -> warning: failed to decode, left out
    wrote: bool  # ranks.parquet was written, and steps.parquet needs writing
    appended: bool  # only new part files were read, on top of the last outputs
    periods_from: int | None = None  # the first step whose period this pass computed (None: every step)
    ranks_tmp: str | None = None  # the new ranks.parquet, unpublished (publish_ranks), when ``wrote``


def read_rows(plan: IngestPlan, progress, warnings: list[str], windows=None) -> Rows:
    """The row pass; an append whose new rows cannot be merged exactly starts again from scratch.
    ``windows``: None (here, window after window) or an executor (ingest_run)."""
    mark = len(warnings)
    try:
        return _row_pass(plan, plan.append, progress, warnings, windows)
    except AppendConflict:  # as if there were no last ingest
        del warnings[mark:]
        return _row_pass(plan, None, progress, warnings, windows)


@dataclass
class _Acc:
    """What the windows add up to, window after window."""

    repeats: dict
    rank_ids: set
    step_parts: list
    bad: dict
    periods: PeriodAcc

    def add(self, got) -> None:
        self.bad.update(got.bad)
        self.periods.add(got.ends)
        for key, n in got.repeats.items():
            self.repeats[key] = self.repeats.get(key, 0) + n
        if got.steps is not None:
            self.step_parts.append(got.steps)
            self.rank_ids.update(got.rank_ids)


def _row_pass(plan: IngestPlan, append: AppendPlan | None, progress, warnings: list[str], windows) -> Rows:
    acc = _Acc({}, set(), [], {}, PeriodAcc())
    files, extra = list(plan.files), []
    head_periods = None
    if append is not None:
        for r, a, n in append.state.get("repeats", []):
            acc.repeats[(r, a)] = n
        acc.rank_ids.update(append.state.get("ranks", []))
        head = old_steps_head(append.steps_path, append.start, RUN_DERIVED_COLUMNS)
        recheck_bad(plan.cache.known_bad, acc.bad, warnings)
        if append.start is None:  # no new rows: the outputs stand, only the summary is redone
            return Rows(head, acc.rank_ids, acc.repeats, acc.bad, wrote=False, appended=True)
        acc.step_parts.append(head)
        head_periods = head.select("step", "step_time_s")  # the kept steps' periods stand
        files = append.new_files
        # (PartInfo, None, None) stand-ins for the old rows from ``start`` on: their step ranges and row counts
        extra = [PartToRead(*t) for t in old_ranks_parts(append.ranks_path, append.start)]
    if not files:
        raise IngestError(f"{plan.run_dir}: no readable rows (all rows superseded)")
    # ranks.parquet under its temp name, published by ingest_run with the other outputs (run.py publish_ranks):
    # a pass that fails, or a second one (a rollback's tails) that does, leaves the last good one in place
    ranks_tmp = temp_name(os.path.join(plan.out_dir, RANKS_FILE))
    try:
        n_new = _write_windows(plan, ranks_tmp, files, extra, append, acc, warnings, progress, windows)
        if not n_new and append is None:  # (an append keeps the old rows, even if every new part is bad)
            raise IngestError(f"{plan.run_dir}: no readable rows ({'; '.join(warnings[:5]) or 'all rows superseded'})")
        if acc.periods.out_of_order:  # steps ended out of order across windows: all at once (period.py)
            periods = exact_periods(ranks_tmp)
        else:
            periods = acc.periods.result()
            if head_periods is not None:
                periods = pl.concat([head_periods, periods], how="vertical_relaxed")
    except BaseException:
        discard_ranks(ranks_tmp)
        raise
    steps = _stack_steps(acc.step_parts, plan.spec.cols, append is not None)
    return Rows(steps.join(periods, on="step", how="left").sort("step"), acc.rank_ids, acc.repeats,
                acc.bad, wrote=True, appended=append is not None,
                periods_from=None if append is None or acc.periods.out_of_order else append.start, ranks_tmp=ranks_tmp)


def publish_ranks(rows: Rows, out_dir: str) -> None:
    """Publish the ranks.parquet the row pass wrote under its temp name (none when it wrote none)."""
    if rows.ranks_tmp is not None:
        publish(rows.ranks_tmp, os.path.join(out_dir, RANKS_FILE))


def discard_ranks(path: str | None) -> None:
    """Remove an unpublished ranks.parquet (a failed ingest, or a row pass read again)."""
    if path is not None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


def _stack_steps(step_parts: list[pl.DataFrame], cols: list[str], appended: bool) -> pl.DataFrame:
    if not appended:
        return pl.concat(step_parts, how="vertical").sort("step")
    # The old head may lack a column first recorded in the new parts: it is null there, and
    # the columns come in the order a full ingest gives.
    steps = pl.concat(step_parts, how="diagonal")
    have = set(steps.columns)
    steps = steps.select([pl.col(c) if c in have else pl.lit(None, pl.Float64).alias(c) for c in step_columns(cols)])
    return steps.sort("step")


def _write_windows(plan: IngestPlan, ranks_tmp: str, files: list, extra: list, append: AppendPlan | None,
                   acc: _Acc, warnings: list[str], progress, windows=None) -> int:
    """Every window through ingest_window, here (``windows`` None) or by ``windows`` (e.g. on Dask
    workers, several at once); its rows into ``ranks_tmp`` in window order, its steps into ``acc``.
    The number of windows that held rows."""
    spans = plan_windows(files + extra, plan.chunk_rows)
    old_ranks_path = append.ranks_path if append is not None else None
    writer = RanksWriter(ranks_tmp)
    n_new = 0
    results = None
    try:
        if append is not None:
            def put(t):
                acc.periods.carry(t)  # the kept rows' last ends, for the first new ones' periods
                writer.put(t)
            copy_head(append.ranks_path, append.start, plan.spec.cols, put)
        if windows is None:
            results = _windows_here(spans, files, plan, acc, old_ranks_path, writer)
        else:  # each task names only the parts it reads; the rows come back and are written here
            results = windows.map(ingest_window, [
                WindowTask(lo, hi, overlapping_parts(files, lo, hi), plan.spec, skip=dict(acc.bad),
                           old_ranks_path=old_ranks_path, batch_rows=plan.chunk_rows) for lo, hi in spans])
        for i, got in enumerate(results):
            # Windows run apart may each find the same corrupt part: its warning once, as here.
            known = set(acc.bad.values())
            warnings.extend(w for w in got.warnings if w not in known)
            acc.add(got)
            if got.rows is not None:
                writer.put(got.rows)
            n_new += got.steps is not None
            for n in got.reads:
                progress.rows_read(plan.run_dir, n)
            got = None
            progress.chunk(plan.run_dir, i + 1, len(spans))
        writer.close()
    finally:
        if hasattr(results, "close"):  # a generator left on an error: its reducer thread stops now
            results.close()
        writer.close()
    return n_new


def _windows_here(spans, files: list, plan: IngestPlan, acc: _Acc, old_ranks_path, writer: RanksWriter):
    """The windows run in this process, one after the other, each batch's reductions on a worker
    thread (window.Reducer) while the next batch is read, also across windows: a window's result
    is given once the next window's rows are read. Its rows are written by the writer's thread;
    each window skips the parts earlier ones found bad."""
    buffers, read_buffers = Buffers(), Buffers()  # numpy work space, reused window after window
    reducer = Reducer()
    known_bad = dict(acc.bad)
    try:
        last = None
        for lo, hi in spans:
            task = WindowTask(lo, hi, files, plan.spec, skip=dict(known_bad), old_ranks_path=old_ranks_path,
                              batch_rows=plan.chunk_rows)
            pending = start_window(task, buffers=buffers, read_buffers=read_buffers, reducer=reducer,
                                   put_rows=writer.put)
            known_bad.update(pending.bad)
            if last is not None:
                yield last.finish()
            last = pending
        if last is not None:
            yield last.finish()
    finally:
        reducer.close()

