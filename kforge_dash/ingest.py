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

import math
import os
import warnings as _warnings
from dataclasses import dataclass

try:
    import polars as pl
except ImportError as e:  # optional dependency: say how to get it
    raise ImportError("kforge-ingest needs polars: pip install 'kforge[ingest]'") from e

from kforge_record.schema import INGESTED_DIR, RANKS_FILE, STEPS_FILE, SUMMARY_FILE
from kforge_record.writer import write_json_atomic

from . import shards as _shards
from .ingest_launches import group_launches, launch_flops, world_size_of
from .ingest_append import (AppendConflict, AppendPlan, attempts_state, copy_head, old_ranks_parts, old_rows,
                            old_steps_head, plan_append, recheck_bad)
from .ingest_read import RanksWriter, arrow_table, output_columns, plan_windows, read_window
from .ingest_reduce import EMA_METRICS, MEM, Buffers, ema_expr, reduce_steps, step_columns
from .ingest_state import FooterCache, load_prior, output_stat, save_manifest
from .ingest_summary import OUTPUT_SCHEMA_VERSION, build_summary, read_summary_file

__all__ = ["ingest_run", "ingest_path", "IngestResult", "IngestFailure", "IngestError", "IngestWarning",
           "IngestOptions", "OUTPUT_SCHEMA_VERSION"]

# Bump when the outputs' meaning changes: a new version re-ingests unchanged shards.
INGEST_VERSION = "2"
LOCK_FILE = ".ingest.lock"


class IngestError(Exception):
    """Nothing could be ingested from a path; the message names the path and the problem."""


class IngestWarning(UserWarning):
    """Something was skipped or could not be derived; the run was still ingested (see summary)."""


@dataclass(frozen=True, kw_only=True)
class IngestOptions:
    alpha: float = 0.1
    peak_tflops: float | None = None
    flops_per_token: float | None = None
    chunk_rows: int = 4_000_000  # rows held in memory at once (about 100 bytes each, plus polars' work space)
    lock_timeout_s: float = 600.0
    force: bool = False

    def __post_init__(self):
        if not (isinstance(self.alpha, (int, float)) and 0 < self.alpha <= 1):
            raise ValueError(f"alpha: must be in (0, 1], got {self.alpha!r}")
        for name in ("peak_tflops", "flops_per_token"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"{name}: must be a positive finite number, got {v!r}")
        if not (isinstance(self.chunk_rows, int) and self.chunk_rows >= 1):
            raise ValueError(f"chunk_rows: must be a positive integer, got {self.chunk_rows!r}")
        if not (isinstance(self.lock_timeout_s, (int, float)) and self.lock_timeout_s >= 0):
            raise ValueError(f"lock_timeout_s: must be >= 0 seconds, got {self.lock_timeout_s!r}")


@dataclass(frozen=True)
class IngestResult:
    run_dir: str
    summary: dict
    skipped: bool  # True: shards and options unchanged since the last ingest, outputs reused
    appended: bool = False  # True: only new part files were read, on top of the last outputs (ingest_append.py)

    @property
    def ingested_dir(self) -> str:
        return os.path.join(self.run_dir, INGESTED_DIR)


@dataclass(frozen=True)
class IngestFailure:
    run_dir: str
    error: str


def ingest_run(run_dir, *, alpha: float = 0.1, peak_tflops: float | None = None,
               flops_per_token: float | None = None, chunk_rows: int = 4_000_000,
               lock_timeout_s: float = 600.0, force: bool = False, progress=None) -> IngestResult:
    """Ingest one run directory into RUN/ingested/. Raises IngestError when nothing can be ingested.

    ``progress(event, run_dir, done, total)`` is called with event "lock-wait" (another ingest
    of this run holds the lock), "chunk" (after each chunk of rows) and "done".
    """
    opts = IngestOptions(alpha=alpha, peak_tflops=peak_tflops, flops_per_token=flops_per_token,
                         chunk_rows=chunk_rows, lock_timeout_s=lock_timeout_s, force=force)
    try:
        from filelock import FileLock, Timeout
    except ImportError as e:
        raise ImportError("kforge-ingest needs filelock: pip install 'kforge[ingest]'") from e

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
        if progress:
            progress("lock-wait", run_dir, 0, 0)
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
    if progress:
        progress("done", run_dir, 1, 1)
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
        steps_tmp = os.path.join(out_dir, f".{STEPS_FILE}.{os.getpid()}.tmp")
        try:
            steps.write_parquet(steps_tmp, compression="zstd", statistics=True)
            os.replace(steps_tmp, os.path.join(out_dir, STEPS_FILE))
        finally:
            if os.path.exists(steps_tmp):
                os.remove(steps_tmp)
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
            head = old_steps_head(plan.steps_path, plan.start, _DERIVED)
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
        windows = plan_windows(files + extra, self.opts.chunk_rows)
        ranks_tmp = os.path.join(self.out_dir, f".{RANKS_FILE}.{os.getpid()}.tmp")
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
                if self.progress:
                    self.progress("chunk", self.run_dir, i + 1, len(windows))
            writer.close()
            if not n_new and plan is None:  # (an append keeps the old rows, even if every new part is bad)
                raise IngestError(f"{self.run_dir}: no readable rows ({'; '.join(warnings[:5]) or 'all rows superseded'})")
            os.replace(ranks_tmp, os.path.join(self.out_dir, RANKS_FILE))
        finally:
            writer.close()
            if os.path.exists(ranks_tmp):
                os.remove(ranks_tmp)
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


_DERIVED = {"tokens_per_sec", "mfu", *(f"{m}_ema" for m in EMA_METRICS)}


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
    head = ["step", "time", "step_time_s", "step_time_min_s", "step_time_median_s", "slowest_rank", "n_ranks",
            "attempt", "tokens", "tokens_per_sec", "mfu", "loss", "grad_norm", "lr", *MEM]
    emas = [f"{m}_ema" for m in EMA_METRICS]
    rest = [c for c in steps.columns if c not in head and c not in emas]
    return steps.select(head + rest + emas)


def ingest_path(path, *, tensorboard: bool = True, wandb: bool = True, wandb_project: str | None = None,
                wandb_entity: str | None = None, upload: bool = False, **ingest_kwargs) -> list:
    """Ingest every run at or below ``path``, then export each. One IngestResult or IngestFailure per run.

    Raises IngestError when ``path`` does not exist or holds no run at all.
    """
    path = os.path.abspath(os.fspath(path))
    if not os.path.exists(path):
        raise IngestError(f"{path}: no such file or directory")
    if not os.path.isdir(path):
        raise IngestError(f"{path}: not a directory (give a runs root or one run directory)")
    runs = _shards.discover_runs(path)
    if not runs:
        raise IngestError(f"{path}: no kforge runs found (a run directory holds rank-NNNNN/ folders)")
    out = []
    for run in runs:
        try:
            res = ingest_run(run, **ingest_kwargs)
        except IngestError as e:
            out.append(IngestFailure(run, str(e)))
            continue
        except Exception as e:  # any failure (even a bug of ours) is this run's: the other runs still ingest
            out.append(IngestFailure(run, f"{run}: {type(e).__name__}: {e}"))
            continue
        exports = _export(res, tensorboard=tensorboard, wandb=wandb, wandb_project=wandb_project,
                          wandb_entity=wandb_entity, upload=upload)
        if exports is not None:
            res = IngestResult(res.run_dir, _record_exports(res, exports), res.skipped, res.appended)
        out.append(res)
    return out


def _export(res: IngestResult, *, tensorboard, wandb, **kw) -> dict | None:
    """Run kforge_dash.export on a fresh ingest; its failure is recorded, never raised."""
    wanted = [k for k, on in (("tensorboard", tensorboard), ("wandb", wandb or kw.get("upload"))) if on]
    if not wanted:
        return None
    prev = res.summary.get("exports") or {}
    if res.skipped and not kw.get("upload") and all((prev.get(k) or {}).get("ok") for k in wanted):
        return None  # nothing changed and the last export of each target worked (an upload is always tried)
    asked = [*wanted, *(["upload"] if kw.get("upload") else [])]

    def failed(error: str) -> dict:
        """Every asked-for exporter failed with ``error``: the shape of ExportResult.to_dict()."""
        return {k: ({"ok": False, "path": None, "error": error, "points": None, "run_id": None, "seconds": None}
                    if k in asked else None) for k in ("tensorboard", "wandb", "upload")}

    try:
        from .export import export_run
    except ImportError as e:
        return failed(f"export unavailable: {e}")
    try:
        got = export_run(res.run_dir, tensorboard=tensorboard, wandb=wandb, **kw)
    except Exception as e:  # an export must never cost the Parquet outputs
        return failed(f"{type(e).__name__}: {e}")
    return got.to_dict()


def _record_exports(res: IngestResult, exports: dict) -> dict:
    from filelock import FileLock

    path = os.path.join(res.ingested_dir, SUMMARY_FILE)
    with FileLock(os.path.join(res.ingested_dir, LOCK_FILE)):
        try:
            summary = read_summary_file(path)
        except ValueError:
            summary = dict(res.summary)
        summary["exports"] = exports
        write_json_atomic(path, summary)
    return summary
