"""Ingest one run: merge ranks and restarts, derive throughput/MFU/EMA, write RUN/ingested/.

The plan is made from metadata only (meta.json, end.json, Parquet footers: step ranges, which
files hold Recorder.log rows); the rows are then read in step windows (ingest_read.py), so
memory is bounded by the window however long the run is. Each window is coalesced, appended to
ranks.parquet and reduced to one row per step (ingest_reduce.py); launches and their FLOPs/peak
are in ingest_launches.py, summary.json in ingest_summary.py. Outputs go to temp names and are
renamed at the end, so a failed ingest never damages the last good one.
See docs/CONTRACT.md for the columns and summary keys.
"""

from __future__ import annotations

import os
import warnings as _warnings

from kforge_dash.contract import (
    EMA_METRICS,
    INGESTED_DIR,
    LOCK_FILE,
    RANKS_FILE,
    RUN_DERIVED_COLUMNS,
    STEP_HEAD,
    STEPS_FILE,
    SUMMARY_FILE,
    read_summary_file,
)
from kforge_dash.optional import require
from kforge_record.atomic import atomic_path, write_json_atomic

pl = require("polars", extra="ingest", purpose="kforge-ingest")

from kforge_dash.ingest import shards as _shards  # noqa: E402  (after the polars check)
from kforge_dash.ingest.append import (  # noqa: E402
    AppendPlan,
    attempts_state,
    copy_head,
    old_ranks_parts,
    old_rows,
    old_steps_head,
    plan_append,
    recheck_bad,
)
from kforge_dash.ingest.launches import group_launches, launch_flops, world_size_of  # noqa: E402
from kforge_dash.ingest.manifest import FooterCache, load_prior, output_stat, save_manifest  # noqa: E402
from kforge_dash.ingest.merge import AppendConflict  # noqa: E402
from kforge_dash.ingest.options import IngestError, IngestOptions, IngestResult, IngestWarning  # noqa: E402
from kforge_dash.ingest.read import RanksWriter, arrow_table, output_columns, plan_windows, read_window  # noqa: E402
from kforge_dash.ingest.reduce import Buffers, ema_expr, reduce_steps, step_columns  # noqa: E402
from kforge_dash.ingest.summary import build_summary  # noqa: E402
from kforge_dash.progress import NullProgress  # noqa: E402

__all__ = ["ingest_run"]

# Bump when the outputs' meaning changes: a new version re-ingests unchanged shards.
INGEST_VERSION = "2"


def ingest_run(run_dir, *, options: IngestOptions | None = None, progress=None, **option_kwargs) -> IngestResult:
    """Ingest one run directory into RUN/ingested/. Raises IngestError when nothing can be ingested.

    Options come as an IngestOptions or as its keywords (``ingest_run(run, alpha=0.05)``).
    ``progress`` (kforge_dash.progress; silent by default) hears of lock waits and windows done.
    """
    opts = options if options is not None else IngestOptions(**option_kwargs)
    if options is not None and option_kwargs:
        raise TypeError("ingest_run: give options= or option keywords, not both")
    progress = progress if progress is not None else NullProgress()
    filelock = require("filelock", extra="ingest", purpose="kforge-ingest")
    FileLock, Timeout = filelock.FileLock, filelock.Timeout

    run_dir = os.path.abspath(os.fspath(run_dir))
    if not os.path.isdir(run_dir):
        raise IngestError(f"{run_dir}: {'not a directory' if os.path.exists(run_dir) else 'no such directory'}")
    if not _shards.is_run_dir(run_dir):
        raise IngestError(f"{run_dir}: not a kforge run (no rank-NNNNN/ folders inside)")
    out_dir = os.path.join(run_dir, INGESTED_DIR)
    os.makedirs(out_dir, exist_ok=True)
    lock = FileLock(os.path.join(out_dir, LOCK_FILE))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        progress.lock_wait(run_dir)
        try:
            lock.acquire(timeout=opts.lock_timeout_s)
        except Timeout:
            raise IngestError(
                f"{run_dir}: another kforge-ingest of this run held {lock.lock_file} for over "
                f"{opts.lock_timeout_s:g}s; try again when it finishes"
            ) from None
    try:
        result = _ingest_locked(run_dir, out_dir, opts, progress)
    finally:
        lock.release()
    for w in result.summary.get("warnings", []) if not result.skipped else []:
        _warnings.warn(w, IngestWarning, stacklevel=2)
    progress.done(run_dir)
    return result


def _ingest_locked(run_dir: str, out_dir: str, opts: IngestOptions, progress) -> IngestResult:
    warnings: list[str] = []
    listing = _shards.list_attempts(run_dir, warnings)
    if not listing:
        raise IngestError(f"{run_dir}: no attempt folders under its rank-NNNNN/ folders (nothing recorded yet)")
    stats = _shards.stat_inputs(listing)
    options = {"v": INGEST_VERSION, "alpha": opts.alpha, "peak": opts.peak_tflops, "fpt": opts.flops_per_token}
    fp = _shards.fingerprint(run_dir, stats, options)
    summary_path = os.path.join(out_dir, SUMMARY_FILE)
    if not opts.force and os.path.exists(summary_path):
        try:
            prev = read_summary_file(summary_path)
            if prev.get("fingerprint") == fp and all(
                os.path.exists(os.path.join(out_dir, n)) for n in (STEPS_FILE, RANKS_FILE)
            ):
                return IngestResult(run_dir, prev, True)
        except ValueError:
            pass  # unreadable summary: ingest again

    # Footers come from the last ingest's manifest where the part is unchanged (--force: none).
    prior = None if opts.force else load_prior(out_dir, run_dir)
    cache = FooterCache(run_dir, stats, prior)
    cache.prefetch(listing)
    attempts = [a for a in (_shards.read_attempt(af, warnings, cache) for af in listing) if a is not None]
    launches = group_launches(attempts, warnings)
    files = []  # (PartInfo, rank, launch index)
    for L in launches:
        # Rank by rank within a launch (not in start-time order): the reductions take "the lowest
        # reporting rank" as the first row of a step, and the matrix path needs ascending ranks.
        for a in sorted(L.attempts, key=lambda a: a.rank):  # a rank is in a launch once
            files += [(p, a.rank, L.index) for p in a.parts if p.num_rows and p.min_step is not None]
    if not files:
        problems = "; ".join(warnings[:5]) or "every part file is empty"
        raise IngestError(f"{run_dir}: no readable rows ({problems})")

    # Restarts: rows of a launch at or past a later launch's first ended step are superseded.
    # Ended steps only: a Recorder.log row (an eval of the resumed checkpoint, a startup scalar
    # at step 0) is not where a launch resumed training, and must not supersede earlier rows.
    first = {L.index: _ended_bound(L.parts(), lowest=True) for L in launches}
    last = {L.index: _ended_bound(L.parts(), lowest=False) for L in launches}
    cutoff = {}
    for L in launches:
        later = [first[M.index] for M in launches[L.index + 1:] if first[M.index] is not None]
        cutoff[L.index] = min(later) if later else None
    files = [f for f in files if cutoff[f[2]] is None or f[0].min_step < cutoff[f[2]]]

    cols, rename = output_columns([f[0] for f in files])
    for old, new in rename.items():
        warnings.append(f"user scalar {old!r} clashes with a column ingest derives; written as {new!r}")
    counts = {(a.rank, L.index): bool(a.meta.get("counts_tokens", True)) for L in launches for a in L.attempts}
    plan = None
    if prior is not None:
        plan = plan_append(prior, run_dir=run_dir, out_dir=out_dir, listing=listing, stats=stats, options=options,
                           files=files, cutoff=cutoff, cols=cols, rename=rename)
    job = _Job(run_dir, out_dir, opts, progress, files, cutoff, cols, rename, counts, cache)
    mark = len(warnings)
    try:
        steps, rank_ids, repeats = job.run(warnings, plan)
    except AppendConflict:  # the new rows cannot be merged exactly: from scratch, as if no prior
        del warnings[mark:]
        job.bad.clear()
        plan = None
        steps, rank_ids, repeats = job.run(warnings, None)
    steps = _derive(steps, launches, opts, warnings)
    if job.wrote:
        with atomic_path(os.path.join(out_dir, STEPS_FILE)) as steps_tmp:
            steps.write_parquet(steps_tmp, compression="zstd", statistics=True)
    cache.mark_bad(job.bad)
    save_manifest(out_dir, cache, {
        "v": INGEST_VERSION, "options": options, "attempts": attempts_state(listing, stats),
        "cutoff": {str(k): v for k, v in cutoff.items()}, "cols": cols, "rename": rename,
        "repeats": [[r, a, n] for (r, a), n in sorted(repeats.items())], "ranks": sorted(rank_ids),
        "outputs": {"steps": output_stat(out_dir, STEPS_FILE), "ranks": output_stat(out_dir, RANKS_FILE)},
    })
    summary = build_summary(run_dir, steps, launches, first, last, sorted(rank_ids), attempts, opts, warnings, fp)
    write_json_atomic(summary_path, summary)
    return IngestResult(run_dir, summary, False, appended=plan is not None)


class _Job:
    """The row work of one ingest: windows of rows -> ranks.parquet and per-step rows, from
    scratch or (with an AppendPlan) on top of the last ingest's outputs."""

    def __init__(self, run_dir, out_dir, opts, progress, files, cutoff, cols, rename, counts, cache):
        self.run_dir, self.out_dir, self.opts, self.progress = run_dir, out_dir, opts, progress
        self.files, self.cutoff, self.cols, self.rename = files, cutoff, cols, rename
        self.counts = counts if not all(counts.values()) else None
        self.cache = cache
        self.bad: dict[str, str] = {}  # part path -> warning: failed to decode, left out
        self.wrote = False  # steps.parquet and ranks.parquet need writing

    def run(self, warnings: list[str], plan: AppendPlan | None):
        """(per-step rows before tokens/s, MFU and EMAs; rank ids; repeats per (rank, attempt))."""
        repeats: dict[tuple[int, int], int] = {}  # (rank, attempt) -> steps recorded more than once
        rank_ids: set[int] = set()
        step_parts: list[pl.DataFrame] = []
        files, extra = self.files, []
        if plan is not None:
            for r, a, n in plan.state.get("repeats", []):
                repeats[(r, a)] = n
            rank_ids.update(plan.state.get("ranks", []))
            head = old_steps_head(plan.steps_path, plan.start, RUN_DERIVED_COLUMNS)
            if plan.start is None:  # no new rows: the outputs stand, only the summary is redone
                recheck_bad(self.cache.known_bad, self.bad, warnings)
                _warn_repeats(repeats, warnings)
                return head, rank_ids, repeats
            step_parts.append(head)
            files = plan.new_files
            extra = old_ranks_parts(plan.ranks_path, plan.start)
            recheck_bad(self.cache.known_bad, self.bad, warnings)
        if not files:
            raise IngestError(f"{self.run_dir}: no readable rows (all rows superseded)")
        with atomic_path(os.path.join(self.out_dir, RANKS_FILE)) as ranks_tmp:
            n_new = self._write_windows(ranks_tmp, files, extra, plan, warnings, repeats, rank_ids, step_parts)
            if not n_new and plan is None:  # (an append keeps the old rows, even if every new part is bad)
                raise IngestError(f"{self.run_dir}: no readable rows ({'; '.join(warnings[:5]) or 'all rows superseded'})")
        self.wrote = True
        _warn_repeats(repeats, warnings)
        if plan is None:
            return pl.concat(step_parts, how="vertical").sort("step"), rank_ids, repeats
        # The old head may lack a column first recorded in the new parts: it is null there, and
        # the columns come in the order a full ingest gives.
        steps = pl.concat(step_parts, how="diagonal")
        have = set(steps.columns)
        steps = steps.select([pl.col(c) if c in have else pl.lit(None, pl.Float64).alias(c) for c in step_columns(self.cols)])
        return steps.sort("step"), rank_ids, repeats

    def _write_windows(self, ranks_tmp, files, extra, plan, warnings, repeats, rank_ids, step_parts) -> int:
        """Read, de-duplicate and reduce the windows; rows into ``ranks_tmp``, steps into
        ``step_parts``. The number of windows that held rows."""
        windows = plan_windows(files + extra, self.opts.chunk_rows)
        writer = RanksWriter(ranks_tmp)
        buffers = Buffers()  # numpy work space of the reductions, reused window after window
        n_new = 0
        try:
            if plan is not None:
                copy_head(plan.ranks_path, plan.start, self.cols, writer.put)
            for i, (lo, hi) in enumerate(windows):
                writer.wait()  # the last window is written and freed: this one reuses its memory (no page faults)
                old = old_rows(plan.ranks_path, lo, hi, self.cols, self.counts) if plan is not None else None
                df = read_window(files, self.bad, warnings, self.cols, self.rename, lo, hi, self.cutoff, self.counts,
                                 buffers, old)
                if df.height:
                    df = _dedup(df, repeats)
                    writer.put(arrow_table(df.drop("_counts", strict=False)))  # written while the window is reduced
                    step_parts.append(reduce_steps(df, self.cols, self.counts is not None, buffers))
                    rank_ids.update(df["rank"].unique().to_list())
                    n_new += 1
                df = old = None
                self.progress.chunk(self.run_dir, i + 1, len(windows))
            writer.close()
        finally:
            writer.close()
        return n_new


def _warn_repeats(repeats: dict, warnings: list[str]) -> None:
    for (rank, att), n in sorted(repeats.items()):
        warnings.append(f"rank {rank}: {n} steps recorded more than once in attempt {att}; the last kept")


def _ended_bound(parts, *, lowest: bool) -> int | None:
    """The smallest (lowest) or largest ended step over ``parts``, None when none ended a step.

    A part's ended range lies within its footer's [min_step, max_step], so parts are visited from
    the most promising footer bound and the walk stops once no later part can beat the best:
    only a few parts that mix end_step and log rows are read, however many there are.
    """
    cand = sorted((p for p in parts if p.has_end_rows and p.min_step is not None),
                  key=lambda p: p.min_step if lowest else -p.max_step)
    best = None
    for p in cand:
        if best is not None and (p.min_step >= best if lowest else p.max_step <= best):
            break
        lo, hi = _shards.ended_steps(p)
        v = lo if lowest else hi
        if v is not None and (best is None or (v < best if lowest else v > best)):
            best = v
    return best


def _dedup(df: pl.DataFrame, repeats: dict) -> pl.DataFrame:
    """One row per (rank, step): the last one written wins, wherever the repeat is (end_step
    called twice for a step, or an in-process rollback: steps 1..10 then 6..12). The steps
    recorded more than once are counted per (rank, attempt) into ``repeats``.

    Rows come attempt by attempt, rank by rank, in write order (log rows of steps never ended
    last), and restarts across attempts are already cut off, so a (rank, step) can repeat only
    within one such block: when every block's steps strictly increase (the usual case, one cheap
    pass) there is nothing to do. Otherwise each block is put back in step order.
    """
    log = pl.col("step_time_s").is_null()
    same = ((pl.col("rank") == pl.col("rank").shift(1)) & (pl.col("attempt") == pl.col("attempt").shift(1))
            & (log == log.shift(1))).fill_null(False)
    if not df.select((same & (pl.col("step") <= pl.col("step").shift(1))).any()).item():
        return df
    n = df.group_by("rank", "attempt", "step").len().filter(pl.col("len") > 1).group_by("rank", "attempt").len()
    for rank, att, k in n.iter_rows():
        repeats[(rank, att)] = repeats.get((rank, att), 0) + k
    return (df.with_columns((~same).cum_sum().alias("_block"))
            .unique(["rank", "step"], keep="last", maintain_order=True)
            .sort("_block", "step", maintain_order=True).drop("_block"))


def _derive(steps: pl.DataFrame, launches, opts: IngestOptions, warnings: list[str]) -> pl.DataFrame:
    """tokens/s, MFU (per launch: its world size, FLOPs and peak) and the EMAs."""
    scale = {}
    for L in launches:
        info = launch_flops(L, opts, warnings) if L.parts() else None
        L.flops = info
        if info and info["flops_per_token"] and info["peak_tflops"]:
            scale[L.index] = info["flops_per_token"] / (world_size_of(L) * info["peak_tflops"] * 1e12)
    steps = steps.with_columns(
        (pl.col("tokens").cast(pl.Float64) / pl.col("step_time_s")).alias("tokens_per_sec")
    ).with_columns(
        (pl.col("tokens_per_sec") * pl.col("attempt").replace_strict(scale, default=None, return_dtype=pl.Float64)).alias("mfu")
    ).with_columns([ema_expr(m, alpha=opts.alpha).alias(f"{m}_ema") for m in EMA_METRICS])
    head = list(STEP_HEAD)
    emas = [f"{m}_ema" for m in EMA_METRICS]
    rest = [c for c in steps.columns if c not in head and c not in emas]
    return steps.select(head + rest + emas)
