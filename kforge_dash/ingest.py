"""Ingest one run: merge ranks and restarts, derive throughput/MFU/EMA, write RUN/ingested/.

The plan is made from metadata only (meta.json, end.json, Parquet footers: step ranges, which
files hold Recorder.log rows). The rows are then read in step-range chunks, so memory is bounded
by the chunk size however long the run is: each chunk holds every rank's rows for its steps,
is coalesced, sorted by (step, rank), appended to ranks.parquet and reduced to one row per step.
Outputs go to temp names and are renamed at the end, so a failed ingest never damages the last
good one. See docs/CONTRACT.md for the columns and summary keys.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import warnings as _warnings
from dataclasses import dataclass, field

try:
    import polars as pl
except ImportError as e:  # optional dependency: say how to get it
    raise ImportError("kforge-ingest needs polars: pip install 'kforge[ingest]'") from e
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from kforge_record.schema import FIXED_NAMES, INGESTED_DIR, PHASE_PREFIX
from kforge_record.writer import write_json_atomic

from . import flops as _flops
from . import shards as _shards
from .ingest_reduce import MEM as _MEM, reduce_steps

OUTPUT_SCHEMA_VERSION = "1.0"
# Bump when the outputs' meaning changes: a new version re-ingests unchanged shards.
INGEST_VERSION = "1"
STEPS_FILE, RANKS_FILE, SUMMARY_FILE, LOCK_FILE = "steps.parquet", "ranks.parquet", "summary.json", ".ingest.lock"
EMA_METRICS = ("loss", "tokens_per_sec", "mfu", "step_time_s")
_INT_COLS = {"step", "tokens", *_MEM}
# Column names ingest derives in steps.parquet: a user scalar with one of these names is renamed.
_DERIVED = {"rank", "attempt", "step_time_min_s", "step_time_median_s", "slowest_rank", "n_ranks",
            "tokens_per_sec", "mfu", *(f"{m}_ema" for m in EMA_METRICS)}


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

    @property
    def ingested_dir(self) -> str:
        return os.path.join(self.run_dir, INGESTED_DIR)


@dataclass(frozen=True)
class IngestFailure:
    run_dir: str
    error: str


@dataclass
class _Launch:
    """One process launch of the job (all ranks' attempts that started together)."""

    index: int
    attempts: list = field(default_factory=list)
    flops: dict | None = None  # _launch_flops(), filled in by _derive

    @property
    def ranks(self):
        return {a.rank for a in self.attempts}

    def parts(self):
        return [p for a in self.attempts for p in a.parts]


def _group_launches(attempts: list, warnings: list[str]) -> list[_Launch]:
    """Cluster per-rank attempts into launches, in start-time order.

    Attempt ids differ per rank (they carry the pid), so a launch is recognised by time: walking
    attempts by start time, a new launch begins when a rank already seen in the current one
    appears again, or when world size or the Slurm/torchelastic launch counters change.
    """
    launches: list[_Launch] = []
    for a in sorted(attempts, key=lambda a: (a.start_time, a.attempt_id)):
        cur = launches[-1] if launches else None
        new = cur is None or a.rank in cur.ranks
        if not new and a.meta_ok:
            ref = next((b for b in cur.attempts if b.meta_ok), None)
            if ref is not None:
                new = ref.world_size != a.world_size or (ref.meta.get("launch") or {}) != (a.meta.get("launch") or {})
        if new:
            launches.append(_Launch(len(launches)))
        launches[-1].attempts.append(a)
    for L in launches:
        sizes = sorted({a.world_size for a in L.attempts if a.world_size is not None})
        if len(sizes) > 1:
            warnings.append(f"attempt {L.index}: ranks disagree on world size {sizes}; using {sizes[-1]}")
    return launches


def _launch_world_size(L: _Launch) -> int:
    sizes = [a.world_size for a in L.attempts if a.world_size is not None]
    return max(sizes) if sizes else len(L.ranks)


def _lead_meta(L: _Launch) -> dict:
    """The lowest rank's meta.json that was readable (rank 0 normally)."""
    ok = sorted((a for a in L.attempts if a.meta_ok), key=lambda a: a.rank)
    return ok[0].meta if ok else {}


def _launch_flops(L: _Launch, opts: IngestOptions, warnings: list[str]) -> dict:
    """FLOPs per token, peak TFLOPS and their sources for one launch (None where unknown)."""
    meta = _lead_meta(L)
    out = {"flops_per_token": None, "flops_source": None, "peak_tflops": None, "peak_source": None,
           "device": meta.get("device"), "model": meta.get("model")}
    if opts.flops_per_token is not None:
        out["flops_per_token"], out["flops_source"] = float(opts.flops_per_token), "override"
    else:
        try:
            out["flops_per_token"], out["flops_source"] = _flops.flops_per_token(meta.get("model"))
        except (ValueError, TypeError) as e:
            warnings.append(f"attempt {L.index}: model description unusable for FLOPs ({e}); MFU is null")
        if out["flops_per_token"] is None and meta.get("model") is None:
            warnings.append(f"attempt {L.index}: no model description in meta.json; MFU is null (pass --flops-per-token)")
    recorded = next((a.meta.get("peak_tflops") for a in L.attempts if a.meta.get("peak_tflops")), None)
    dev = meta.get("device") or {}
    if opts.peak_tflops is not None:
        out["peak_tflops"], out["peak_source"] = float(opts.peak_tflops), "override"
    elif recorded is not None:
        out["peak_tflops"], out["peak_source"] = float(recorded), "meta.json peak_tflops"
    else:
        entry = _flops.peak_for_device(dev.get("name")) if dev.get("type") != "cpu" else None
        if entry is not None:
            out["peak_tflops"], out["peak_source"] = entry.tflops, f"table: {dev.get('name')} ({entry.source})"
        elif dev.get("type") == "cpu":
            warnings.append(f"attempt {L.index}: ran on CPU; no peak TFLOPS, MFU is null (pass --peak-tflops)")
        else:
            warnings.append(
                f"attempt {L.index}: device {dev.get('name')!r} is not in the peak-TFLOPS table; "
                "MFU is null (pass --peak-tflops)"
            )
    return out


def _columns(parts: list) -> tuple[list[str], dict[str, str]]:
    """Output columns of ranks.parquet, in order, and the rename of user scalars that clash."""
    seen: dict[str, None] = {}
    for p in parts:
        seen.update(dict.fromkeys(p.columns))
    extra = [c for c in seen if c not in FIXED_NAMES]
    rename = {c: f"user/{c}" for c in extra if c in _DERIVED}
    extra = [rename.get(c, c) for c in extra]
    phases = sorted(c for c in extra if c.startswith(PHASE_PREFIX))
    scalars = sorted(c for c in extra if not c.startswith(PHASE_PREFIX))
    return ["step", "rank", "attempt", *FIXED_NAMES[1:], *phases, *scalars], rename


def _scan(part, rank: int, attempt: int, cols: list[str], rename: dict, lo: int, hi: int, cutoff,
          counts) -> pl.LazyFrame:
    """One part file as a lazy frame with every output column (absent ones null) and its step
    window. The filter is pushed into the Parquet reader: rows outside it are never built."""
    back = {v: k for k, v in rename.items()}
    exprs = []
    for c in cols:
        if c == "rank":
            exprs.append(pl.lit(rank, pl.Int64).alias("rank"))
        elif c == "attempt":
            exprs.append(pl.lit(attempt, pl.Int64).alias("attempt"))
        else:
            src = back.get(c, c)
            dt = pl.Int64 if c in _INT_COLS else pl.Float64
            exprs.append(pl.col(src).cast(dt).alias(c) if src in part.columns else pl.lit(None, dt).alias(c))
    if counts is not None:
        exprs.append(pl.lit(counts).alias("_counts"))
    cond = (pl.col("step") >= lo) & (pl.col("step") < hi)
    if cutoff is not None:
        cond = cond & (pl.col("step") < cutoff)
    return pl.scan_parquet(part.path).filter(cond).select(exprs)


def _key(df: pl.DataFrame, as_int: bool) -> pl.Series:
    """(rank, step) as one hashable value: an int64 when the values allow (fast), else a struct."""
    if as_int:
        return df.select((pl.col("rank") * (1 << 40) + pl.col("step")).alias("k"))["k"]
    return df.select(pl.struct("rank", "step").alias("k"))["k"]


def _coalesce_logs(ends: pl.DataFrame, logs: pl.DataFrame, scalars: list[str]) -> pl.DataFrame:
    """Fold Recorder.log rows (step_time_s null) into the end_step row of the same (rank, step).

    The end_step row's values win; log rows fill the columns it left null (the last logged value
    when several). A log for a step the rank never ended stays a row of its own. Log rows are
    few, so instead of joining the big frame (slow), the matching end rows are found with a
    hash lookup and only those cells are written (scatter).
    """
    agg = logs.group_by(["rank", "step"], maintain_order=True).agg(
        pl.all().exclude("rank", "step", *scalars).last(), *[pl.col(c).drop_nulls().last() for c in scalars]
    )
    as_int = ends["step"].min() >= 0 and ends["step"].max() < 1 << 40 and ends["rank"].max() < 1 << 22
    as_int = as_int and agg["step"].min() >= 0 and agg["step"].max() < 1 << 40
    hit = _key(ends, as_int).is_in(_key(agg, as_int).implode()).arg_true()
    at = ends.select("rank", "step")[hit].with_row_index("_j").join(agg, on=["rank", "step"], how="inner").sort("_j")
    updates = []
    for c in scalars:
        if agg[c].null_count() == agg.height:
            continue  # this column never appears in a log row
        col = ends[c].clone()
        col.scatter(hit, pl.select(pl.coalesce(col.gather(hit), at[c])).to_series())
        updates.append(col)
    merged = ends.with_columns(updates) if updates else ends
    only = agg.join(at.select("rank", "step"), on=["rank", "step"], how="anti")
    return pl.concat([merged, only.select(ends.columns)], how="vertical", rechunk=False) if only.height else merged


def _ema(col: str, alpha: float) -> pl.Expr:
    """EMA where the first finite value starts it and non-finite/missing values hold the last value.

    polars' ewm_mean(adjust=False, ignore_nulls=True) is exactly y = a*x + (1-a)*y over the
    non-null values, bootstrapped with the first one (checked against a plain loop in
    tests/test_ingest_ema.py); NaN/inf are turned into nulls first and the holes forward-filled.
    """
    x = pl.col(col)
    return (
        pl.when(x.is_finite()).then(x).otherwise(None)
        .ewm_mean(alpha=alpha, adjust=False, ignore_nulls=True, min_samples=1)
        .forward_fill().alias(f"{col}_ema")
    )


def _chunks(files: list, chunk_rows: int) -> list[tuple[int, int]]:
    """Step windows [lo, hi) of about chunk_rows rows each, cut where part files start.

    A window closes at the first part-file start after it holds chunk_rows rows (counting each
    file where it starts), so windows follow the part files (each read once when ranks flush
    in step, as the recorder does by default) and a stray far-away step cannot make one huge
    window. A part that straddles a cut is read by both windows, each keeping its own steps.
    """
    starts: dict[int, int] = {}
    for p, _, _ in files:
        starts[p.min_step] = starts.get(p.min_step, 0) + p.num_rows
    hi = max(p.max_step for p, _, _ in files) + 1
    windows, acc = [], 0
    lo = min(starts)
    for step in sorted(starts):
        if acc >= chunk_rows and step > lo:
            windows.append((lo, step))
            lo, acc = step, 0
        acc += starts[step]
    windows.append((lo, hi))
    return windows


class _RanksWriter:
    """Appends each window's rows to ranks.parquet on a background thread (pyarrow releases the
    GIL while encoding), so writing overlaps reading the next window. At most one window waits."""

    def __init__(self, path: str):
        from concurrent.futures import ThreadPoolExecutor

        self.path = path
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kforge-ranks-writer")
        self.pending = None
        self.writer = None

    def _write(self, table: pa.Table) -> None:
        if self.writer is None:
            # Dictionary encoding pays off only for the repetitive key columns; floats rarely repeat.
            # lz4: a third faster to write than zstd here, for files ~20% larger.
            self.writer = pq.ParquetWriter(self.path, table.schema, compression="lz4",
                                           use_dictionary=["step", "rank", "attempt"])
        self.writer.write_table(table.cast(self.writer.schema))

    def put(self, table: pa.Table) -> None:
        if self.pending is not None:
            self.pending.result()  # re-raises a write error here
        self.pending = self.pool.submit(self._write, table)

    def close(self) -> None:
        if self.pool is None:
            return
        try:
            if self.pending is not None:
                self.pending.result()
        finally:
            self.pool.shutdown()
            self.pool = None
            if self.writer is not None:
                self.writer.close()


def _finite(v):
    return v is not None and math.isfinite(v)


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
        raise IngestError(f"{run_dir}: no such directory")
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
    fp = _shards.fingerprint(run_dir, listing, {"v": INGEST_VERSION, "alpha": opts.alpha,
                                                "peak": opts.peak_tflops, "fpt": opts.flops_per_token})
    summary_path = os.path.join(out_dir, SUMMARY_FILE)
    if not opts.force and os.path.exists(summary_path):
        try:
            with open(summary_path) as f:
                prev = json.load(f)
            if prev.get("fingerprint") == fp and all(
                os.path.exists(os.path.join(out_dir, n)) for n in (STEPS_FILE, RANKS_FILE)
            ):
                return IngestResult(run_dir, prev, True)
        except (OSError, ValueError):
            pass  # unreadable summary: ingest again

    attempts = [a for a in (_shards.read_attempt(af, warnings) for af in listing) if a is not None]
    launches = _group_launches(attempts, warnings)
    files = []  # (PartInfo, rank, launch index)
    for L in launches:
        for a in L.attempts:
            files += [(p, a.rank, L.index) for p in a.parts if p.num_rows and p.min_step is not None]
    if not files:
        problems = "; ".join(warnings[:5]) or "every part file is empty"
        raise IngestError(f"{run_dir}: no readable rows ({problems})")

    # Restarts: rows of a launch at or past a later launch's first step are superseded.
    first = {L.index: min((p.min_step for p in L.parts() if p.min_step is not None), default=None) for L in launches}
    last = {L.index: max((p.max_step for p in L.parts() if p.max_step is not None), default=None) for L in launches}
    cutoff = {}
    for L in launches:
        later = [first[M.index] for M in launches[L.index + 1:] if first[M.index] is not None]
        cutoff[L.index] = min(later) if later else None
    files = [f for f in files if cutoff[f[2]] is None or f[0].min_step < cutoff[f[2]]]

    cols, rename = _columns([f[0] for f in files])
    for old, new in rename.items():
        warnings.append(f"user scalar {old!r} clashes with a column ingest derives; written as {new!r}")
    counts = {(a.rank, L.index): bool(a.meta.get("counts_tokens", True)) for L in launches for a in L.attempts}
    need_counts = not all(counts.values())
    windows = _chunks(files, opts.chunk_rows)

    ranks_tmp = os.path.join(out_dir, f".{RANKS_FILE}.{os.getpid()}.tmp")
    steps_tmp = os.path.join(out_dir, f".{STEPS_FILE}.{os.getpid()}.tmp")
    writer = _RanksWriter(ranks_tmp)
    step_parts, rank_ids, bad = [], set(), set()
    try:
        for i, (lo, hi) in enumerate(windows):
            df = _read_window(files, bad, warnings, cols, rename, lo, hi, cutoff, counts if need_counts else None)
            if df.height:
                # Rows come rank by rank, steps ascending: a repeated (rank, step) is adjacent.
                dup = (pl.col("step") == pl.col("step").shift(1)) & (pl.col("rank") == pl.col("rank").shift(1))
                n_dup = df.select(dup.sum()).item()
                if n_dup:
                    warnings.append(f"{n_dup} row(s) in steps [{lo}, {hi}) repeat a (rank, step) "
                                    "(end_step called twice for one step?); the last one is kept")
                    df = df.unique(["rank", "step"], keep="last", maintain_order=True)
                step_parts.append(reduce_steps(df, cols, need_counts))
                rank_ids.update(df["rank"].unique().to_list())
                writer.put(df.drop("_counts", strict=False).to_arrow())
            if progress:
                progress("chunk", run_dir, i + 1, len(windows))
        writer.close()
        if not step_parts:
            raise IngestError(f"{run_dir}: no readable rows ({'; '.join(warnings[:5]) or 'all rows superseded'})")
        steps = _derive(pl.concat(step_parts).sort("step"), launches, opts, warnings)
        steps.write_parquet(steps_tmp, compression="zstd", statistics=True)
        os.replace(steps_tmp, os.path.join(out_dir, STEPS_FILE))
        os.replace(ranks_tmp, os.path.join(out_dir, RANKS_FILE))
    finally:
        writer.close()
        for tmp in (ranks_tmp, steps_tmp):
            if os.path.exists(tmp):
                os.remove(tmp)

    summary = _summary(run_dir, steps, launches, first, last, sorted(rank_ids), attempts, opts, warnings, fp)
    write_json_atomic(summary_path, summary)
    return IngestResult(run_dir, summary, False)


def _scan_together(todo, cols, rename, lo, hi, cutoff, counts) -> pl.DataFrame:
    """The window's part files in ONE polars scan (5x faster than a scan per file): a column a
    file lacks is inserted as null, and each row's file tells its rank and attempt."""
    back = {v: k for k, v in rename.items()}
    schema = {}
    for p, _, _ in todo:
        for name in p.columns:
            schema.setdefault(name, pl.Int64 if rename.get(name, name) in _INT_COLS else pl.Float64)
    paths = [p.path for p, _, _ in todo]
    lf = pl.scan_parquet(paths, schema=schema, missing_columns="insert", include_file_paths="_path")
    if not all(lo <= p.min_step and p.max_step < hi for p, _, _ in todo):  # no filter when whole files fit
        lf = lf.filter((pl.col("step") >= lo) & (pl.col("step") < hi))
    df = (
        lf.with_columns(pl.col("_path").replace_strict({q: i for i, q in enumerate(paths)}, return_dtype=pl.UInt32))
        .collect()
    )
    f = df["_path"].to_numpy()
    rank = np.array([r for _, r, _ in todo], np.int64)[f]
    att = np.array([a for _, _, a in todo], np.int64)[f]
    out = []
    for c in cols:
        if c == "rank":
            out.append(pl.Series("rank", rank))
        elif c == "attempt":
            out.append(pl.Series("attempt", att))
        else:
            src = back.get(c, c)
            dt = pl.Int64 if c in _INT_COLS else pl.Float64
            out.append(df[src].alias(c) if src in schema else pl.repeat(None, df.height, dtype=dt, eager=True).alias(c))
    if counts is not None:
        out.append(pl.Series("_counts", np.array([counts[(r, a)] for _, r, a in todo])[f]))
    df = pl.DataFrame(out)
    cuts = np.array([np.inf if cutoff[a] is None else cutoff[a] for _, _, a in todo])
    if np.isfinite(cuts).any():  # an earlier launch's rows past a later launch's first step
        df = df.filter(pl.Series(df["step"].to_numpy() < cuts[f]))
    return df


def _read_window(files, bad, warnings, cols, rename, lo, hi, cutoff, counts) -> pl.DataFrame:
    """All rows with lo <= step < hi, log rows coalesced. A part file that fails to decode is
    found, reported and left out (its footer was fine, so only a full read tells)."""
    scalars = cols[len(FIXED_NAMES) + 2:]  # phases and user scalars (what a log row can carry)
    mins = np.fromiter((p.min_step for p, _, _ in files), np.int64, len(files))
    maxs = np.fromiter((p.max_step for p, _, _ in files), np.int64, len(files))
    overlap = np.flatnonzero((maxs >= lo) & (mins < hi))
    while True:
        todo = [files[i] for i in overlap if files[i][0].path not in bad]
        if not todo:
            return pl.DataFrame(schema={c: (pl.Int64 if c in _INT_COLS | {"rank", "attempt"} else pl.Float64) for c in cols})

        def scan(p, rank, att):
            return _scan(p, rank, att, cols, rename, lo, hi, cutoff[att], None if counts is None else counts[(rank, att)])
        try:
            try:
                df = _scan_together(todo, cols, rename, lo, hi, cutoff, counts)
            except pl.exceptions.PolarsError:  # e.g. a column typed differently in one file: cast file by file
                df = pl.concat([scan(p, r, a) for p, r, a in todo], how="vertical").collect()
            if not any(p.has_log_rows for p, _, _ in todo):
                return df
            is_log = df["step_time_s"].is_null()
            return _coalesce_logs(df.filter(~is_log), df.filter(is_log), scalars) if is_log.any() else df
        except Exception:
            found = False
            for p, _, _ in todo:
                try:
                    pq.read_table(p.path)
                except Exception as e:
                    bad.add(p.path)
                    found = True
                    warnings.append(f"{p.path}: corrupt part file ({type(e).__name__}: {e}); skipped")
            if not found:
                raise


def _derive(steps: pl.DataFrame, launches, opts: IngestOptions, warnings: list[str]) -> pl.DataFrame:
    """tokens/s, MFU (per launch: its world size, FLOPs and peak) and the EMAs."""
    scale = {}
    for L in launches:
        info = _launch_flops(L, opts, warnings) if L.parts() else None
        L.flops = info
        if info and info["flops_per_token"] and info["peak_tflops"]:
            scale[L.index] = info["flops_per_token"] / (_launch_world_size(L) * info["peak_tflops"] * 1e12)
    steps = steps.with_columns(
        (pl.col("tokens").cast(pl.Float64) / pl.col("step_time_s")).alias("tokens_per_sec")
    ).with_columns(
        (pl.col("tokens_per_sec") * pl.col("attempt").replace_strict(scale, default=None, return_dtype=pl.Float64)).alias("mfu")
    ).with_columns([_ema(m, opts.alpha) for m in EMA_METRICS])
    head = ["step", "time", "step_time_s", "step_time_min_s", "step_time_median_s", "slowest_rank", "n_ranks",
            "attempt", "tokens", "tokens_per_sec", "mfu", "loss", "grad_norm", "lr", *_MEM]
    emas = [f"{m}_ema" for m in EMA_METRICS]
    rest = [c for c in steps.columns if c not in head and c not in emas]
    return steps.select(head + rest + emas)


def _summary(run_dir, steps: pl.DataFrame, launches, first, last, ranks, attempts, opts, warnings, fp) -> dict:
    live = [L for L in launches if L.parts()]
    cur = live[-1]
    info = cur.flops
    meta = _lead_meta(cur)
    for key in ("flops_per_token", "peak_tflops"):
        vals = {L.flops[key] for L in live}
        if len(vals) > 1:
            warnings.append(f"{key} differs between attempts ({sorted(vals, key=str)}); MFU uses each attempt's own")
    sizes = [_launch_world_size(L) for L in live]
    if len(set(sizes)) > 1:
        warnings.append(f"world size changed across attempts ({' -> '.join(map(str, sizes))}); MFU uses each attempt's own")

    both = steps.filter(pl.col("tokens").is_not_null() & pl.col("step_time_s").is_not_null())
    t_both = both["step_time_s"].sum() if both.height else None
    mfu_ok = steps.filter(pl.col("mfu").is_finite() & pl.col("step_time_s").is_not_null())
    loss = steps["loss"].drop_nulls()
    finite_loss = loss.filter(loss.is_finite())
    nonfinite = {}
    for c, dt in steps.schema.items():
        if dt == pl.Float64 and not c.endswith("_ema"):
            n = int(steps[c].drop_nulls().is_finite().not_().sum())
            if n or c in EMA_METRICS:
                nonfinite[c] = n
    dropped = []
    for a in attempts:
        if a.end is not None and a.end.get("dropped_rows_total") is not None:
            dropped.append(int(a.end["dropped_rows_total"]))
        else:
            known = [p.dropped_rows_total for p in a.parts if p.dropped_rows_total is not None]
            if known:
                dropped.append(max(known))
    dropped_rows = sum(dropped) if dropped else None
    if dropped_rows:
        warnings.append(f"the recorder dropped {dropped_rows} row(s) on disk errors (see end.json / part metadata)")
    peak_mem = steps["mem_peak_bytes"].max()

    restarts = []
    prev_last = None
    for L in launches:
        if L.index and first[L.index] is not None and prev_last is not None:
            restarts.append({
                "attempt": L.index,
                "resumed_at_step": first[L.index],
                "previous_last_step": prev_last,
                # step numbers the earlier attempt(s) had reached and this one redid
                "superseded_steps": max(0, prev_last - first[L.index] + 1),
                "time": min(a.start_time for a in L.attempts),
            })
        if last[L.index] is not None:
            prev_last = last[L.index] if prev_last is None else max(prev_last, last[L.index])
    return {
        "schema_version": OUTPUT_SCHEMA_VERSION,
        "run_name": meta.get("run_name") or os.path.basename(run_dir),
        "ingested_at": _dt.datetime.now(_dt.timezone.utc).isoformat(),
        "steps": steps.height,
        "first_step": steps["step"].min(),
        "last_step": steps["step"].max(),
        "world_size": _launch_world_size(cur),
        "ranks": ranks,
        "attempts": [{
            "attempt": L.index,
            "attempt_ids": sorted({a.attempt_id for a in L.attempts}),
            "start_time": min(a.start_time for a in L.attempts),
            "first_step": first[L.index],
            "last_step": last[L.index],
            "world_size": _launch_world_size(L),
        } for L in launches],
        "restarts": restarts,
        "tokens": steps["tokens"].sum() if steps["tokens"].null_count() < steps.height else None,
        # Training wall time: the sum of per-step times of the kept steps (restart downtime excluded).
        "wall_time_s": steps["step_time_s"].sum() if steps["step_time_s"].null_count() < steps.height else None,
        "mean_tokens_per_sec": both["tokens"].sum() / t_both if t_both else None,
        # Time-weighted, so a long slow step counts for its duration.
        "mean_mfu": ((mfu_ok["mfu"] * mfu_ok["step_time_s"]).sum() / mfu_ok["step_time_s"].sum()
                     if mfu_ok.height and mfu_ok["step_time_s"].sum() else None),
        "final_loss": loss[-1] if loss.len() else None,  # NaN stays NaN: a diverged run must show it
        "best_loss": finite_loss.min() if finite_loss.len() else None,
        "peak_mem_bytes": peak_mem,
        "device": info["device"],
        "model": info["model"],
        "flops_per_token": info["flops_per_token"],
        "flops_source": info["flops_source"],
        "peak_tflops": info["peak_tflops"],
        "peak_source": info["peak_source"],
        "alpha": opts.alpha,
        "hparams": meta.get("hparams"),
        "tags": meta.get("tags"),
        "nonfinite": nonfinite,
        "dropped_rows": dropped_rows,
        "warnings": warnings,
        "exports": None,
        "fingerprint": fp,
    }


# -- many runs, and the exports that follow an ingest ----------------------------------------

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
        except (OSError, pl.exceptions.PolarsError, pa.ArrowException) as e:  # one bad run must not stop the others
            out.append(IngestFailure(run, f"{run}: {type(e).__name__}: {e}"))
            continue
        exports = _export(res, tensorboard=tensorboard, wandb=wandb, wandb_project=wandb_project,
                          wandb_entity=wandb_entity, upload=upload)
        if exports is not None:
            res = IngestResult(res.run_dir, _record_exports(res, exports), res.skipped)
        out.append(res)
    return out


def _export(res: IngestResult, *, tensorboard, wandb, **kw) -> dict | None:
    """Run kforge_dash.export on a fresh ingest; its failure is recorded, never raised."""
    wanted = [k for k, on in (("tensorboard", tensorboard), ("wandb", wandb)) if on]
    if not wanted:
        return None
    prev = res.summary.get("exports") or {}
    if res.skipped and all((prev.get(k) or {}).get("ok") for k in wanted):
        return None  # nothing changed and the last export of each target worked
    try:
        from .export import export_run
    except ImportError as e:
        return {k: {"ok": False, "path": None, "error": f"export unavailable: {e}"} for k in wanted}
    try:
        got = export_run(res.run_dir, tensorboard=tensorboard, wandb=wandb, **kw)
    except Exception as e:  # an export must never cost the Parquet outputs
        return {k: {"ok": False, "path": None, "error": f"{type(e).__name__}: {e}"} for k in wanted}
    return _as_dict(got)


def _as_dict(obj):
    import dataclasses

    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if dataclasses.is_dataclass(obj):
        return dataclasses.asdict(obj)
    return dict(obj) if isinstance(obj, dict) else {"result": str(obj)}


def _record_exports(res: IngestResult, exports: dict) -> dict:
    from filelock import FileLock

    path = os.path.join(res.ingested_dir, SUMMARY_FILE)
    with FileLock(os.path.join(res.ingested_dir, LOCK_FILE)):
        try:
            with open(path) as f:
                summary = json.load(f)
        except (OSError, ValueError):
            summary = dict(res.summary)
        summary["exports"] = exports
        write_json_atomic(path, summary)
    return summary
