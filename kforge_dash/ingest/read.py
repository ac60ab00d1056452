"""Reading a run's rows in step windows: the output columns, the window plan, one scan per
window, log-row coalescing, and the background writer of ranks.parquet.

Memory is bounded by the window: each holds every rank's rows for its steps, so the per-step
reductions are complete within it and the run can be far larger than memory.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from kforge_dash.contract import RESERVED_OUTPUT_NAMES
from kforge_dash.ingest.merge import merge_old
from kforge_dash.ingest.reduce import Buffers
from kforge_dash.ingest.shards import corrupt_part
from kforge_record.schema import FIXED_NAMES, MEM_COLUMNS, PHASE_PREFIX

INT_COLS = {"step", "tokens", *MEM_COLUMNS}


def output_columns(parts: list) -> tuple[list[str], dict[str, str]]:
    """Output columns of ranks.parquet, in order, and the rename of user scalars that clash."""
    seen: dict[str, None] = {}
    for p in parts:
        seen.update(dict.fromkeys(p.columns))
    extra = [c for c in seen if c not in FIXED_NAMES]
    rename = {c: f"user/{c}" for c in extra if c in RESERVED_OUTPUT_NAMES}
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
            dt = pl.Int64 if c in INT_COLS else pl.Float64
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


def _match_sorted(ends: pl.DataFrame, agg: pl.DataFrame, buffers: Buffers):
    """(positions in ``ends`` of the matched ``agg`` rows, which ``agg`` rows matched), or None
    when ``ends``' (rank, step) keys are not strictly increasing (two launches in the window, a
    repeated step): then the caller hashes. ``agg``'s ranks and steps must fit the int key."""
    key = buffers.column("key", ends["rank"])[0]  # a reused buffer: no fresh pages per window
    key <<= 40
    key += buffers.column("v", ends["step"])[0]
    if key.size > 1 and not (key[1:] > key[:-1]).all():
        return None
    want = (agg["rank"].to_numpy().astype(np.int64) << 40) + agg["step"].to_numpy()
    pos = np.searchsorted(key, want)
    got = pos < key.size
    got[got] = key[pos[got]] == want[got]
    return pl.Series(pos[got], dtype=pl.UInt32), pl.Series(got)


def _coalesce_logs(ends: pl.DataFrame, logs: pl.DataFrame, scalars: list[str], buffers: Buffers | None = None) -> pl.DataFrame:
    """Fold Recorder.log rows (step_time_s null) into the end_step row of the same (rank, step).

    The end_step row's values win; log rows fill the columns it left null (the last logged value
    when several). A log for a step the rank never ended stays a row of its own. Log rows are
    few, so instead of joining the big frame (slow), the matching end rows are found with a
    hash lookup and only those cells are written (scatter).
    """
    agg = logs.group_by(["rank", "step"], maintain_order=True).agg(
        pl.all().exclude("rank", "step", *scalars).last(), *[pl.col(c).drop_nulls().last() for c in scalars]
    )
    if ends.height == 0:  # a window of log rows only (e.g. an eval logged past the last ended step)
        return agg.select(ends.columns)
    as_int = ends["step"].min() >= 0 and ends["step"].max() < 1 << 40 and ends["rank"].max() < 1 << 22
    as_int = as_int and agg["step"].min() >= 0 and agg["step"].max() < 1 << 40
    found = _match_sorted(ends, agg, buffers or Buffers()) if as_int else None
    if found is not None:  # the usual case: no hash of the big frame, a binary search per log row
        hit, got = found
        at, only = agg.filter(got), agg.filter(~got)
    else:
        hit = _key(ends, as_int).is_in(_key(agg, as_int).implode()).arg_true()
        at = ends.select("rank", "step")[hit].with_row_index("_j").join(agg, on=["rank", "step"], how="inner").sort("_j")
        only = None
    updates = []
    for c in scalars:
        if agg[c].null_count() == agg.height:
            continue  # this column never appears in a log row
        col = ends[c].clone()
        col.scatter(hit, pl.select(pl.coalesce(col.gather(hit), at[c])).to_series())
        updates.append(col)
    merged = ends.with_columns(updates) if updates else ends
    if only is None:
        only = agg.join(at.select("rank", "step"), on=["rank", "step"], how="anti")
    return pl.concat([merged, only.select(ends.columns)], how="vertical", rechunk=False) if only.height else merged


def plan_windows(files: list, chunk_rows: int) -> list[tuple[int, int]]:
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


def arrow_table(df: pl.DataFrame) -> pa.Table:
    """``df`` as an Arrow table without copying: each column keeps its own chunks. (DataFrame.
    to_arrow first gives every column the same chunks, which here means a copy of the whole
    window: the scanned columns come in one chunk per file, rank and attempt in one.)"""
    cols = {}
    for c in df.columns:
        chunks = [ch.to_arrow() for ch in df[c].get_chunks()]
        cols[c] = pa.chunked_array(chunks) if chunks else df[c].to_arrow()
    return pa.table(cols)


class RanksWriter:
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
            # lz4: a third faster to write than zstd here, for files ~20% larger. Min/max
            # statistics only for the keys readers filter on, and batches of 64k rows (not 1k):
            # together a fifth less CPU for the same data.
            keys = [c for c in ("step", "rank", "attempt") if c in table.schema.names]
            self.writer = pq.ParquetWriter(self.path, table.schema, compression="lz4", use_dictionary=keys,
                                           write_statistics=keys, write_batch_size=1 << 16)
        self.writer.write_table(table.cast(self.writer.schema))

    def wait(self) -> None:
        """Until the pending window is written (re-raises a write error here)."""
        if self.pending is not None:
            self.pending.result()
            self.pending = None

    def put(self, table: pa.Table) -> None:
        self.wait()
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


def _scan_together(todo, cols, rename, lo, hi, cutoff, counts) -> pl.DataFrame:
    """The window's part files in ONE polars scan (5x faster than a scan per file): a column a
    file lacks is inserted as null, and each row's file tells its rank and attempt."""
    back = {v: k for k, v in rename.items()}
    schema = {}
    for p, _, _ in todo:
        for name in p.columns:
            schema.setdefault(name, pl.Int64 if rename.get(name, name) in INT_COLS else pl.Float64)
    paths = [p.path for p, _, _ in todo]
    num_rows = np.array([p.num_rows for p, _, _ in todo], np.int64)
    whole = all(lo <= p.min_step and p.max_step < hi for p, _, _ in todo)  # no filter when whole files fit
    if whole:
        df = pl.scan_parquet(paths, schema=schema, missing_columns="insert").collect()
    if whole and df.height == num_rows.sum():
        # Every file read whole, in order: each file's rows are its footer's row count.
        f = None
        rank = np.repeat(np.array([r for _, r, _ in todo], np.int64), num_rows)
        att = np.repeat(np.array([a for _, _, a in todo], np.int64), num_rows)
    else:
        # The row index counts rows before the filter, across the files in order: with each file's
        # row count from its footer, a binary search tells every row's file (cheaper than file paths).
        lf = pl.scan_parquet(paths, schema=schema, missing_columns="insert", row_index_name="_row")
        if not whole:
            lf = lf.filter((pl.col("step") >= lo) & (pl.col("step") < hi))
        df = lf.collect()
        f = np.searchsorted(np.cumsum(np.r_[0, num_rows]), df["_row"].to_numpy(), side="right") - 1
        rank = np.array([r for _, r, _ in todo], np.int64)[f]
        att = np.array([a for _, _, a in todo], np.int64)[f]
    if f is None and (counts is not None or any(cutoff[a] is not None for _, _, a in todo)):
        f = np.repeat(np.arange(len(todo)), num_rows)
    out = []
    for c in cols:
        if c == "rank":
            out.append(pl.Series("rank", rank))
        elif c == "attempt":
            out.append(pl.Series("attempt", att))
        else:
            src = back.get(c, c)
            dt = pl.Int64 if c in INT_COLS else pl.Float64
            out.append(df[src].alias(c) if src in schema else pl.repeat(None, df.height, dtype=dt, eager=True).alias(c))
    if counts is not None:
        out.append(pl.Series("_counts", np.array([counts[(r, a)] for _, r, a in todo])[f]))
    df = pl.DataFrame(out)
    if len(todo) > 64 and df.height < len(todo) * 2048:
        # Many small part files (the recorder flushes every 100 steps by default): one chunk per
        # file per column makes every later column pass pay per chunk. One copy into single
        # chunks costs less than that overhead.
        df = df.rechunk()
    cuts = np.array([np.inf if cutoff[a] is None else cutoff[a] for _, _, a in todo])
    if f is not None and np.isfinite(cuts).any():  # an earlier launch's rows past a later launch's first step
        df = df.filter(pl.Series(df["step"].to_numpy() < cuts[f]))
    return df


def read_window(files, bad, warnings, cols, rename, lo, hi, cutoff, counts, buffers=None, old=None) -> pl.DataFrame:
    """All rows with lo <= step < hi, log rows coalesced. A part file that fails to decode is
    found, reported, put in ``bad`` (path -> warning) and left out (its footer was fine, so only
    a full read tells). ``old``: the last ingest's kept rows of this window (an append, see
    ingest_append.py), merged in before coalescing."""
    scalars = cols[len(FIXED_NAMES) + 2:]  # phases and user scalars (what a log row can carry)
    mins = np.fromiter((p.min_step for p, _, _ in files), np.int64, len(files))
    maxs = np.fromiter((p.max_step for p, _, _ in files), np.int64, len(files))
    overlap = np.flatnonzero((maxs >= lo) & (mins < hi))
    while True:
        todo = [files[i] for i in overlap if files[i][0].path not in bad]
        if not todo:
            if old is not None:
                # No new rows here: the last ingest's rows of these steps as they were written,
                # already coalesced and de-duplicated, each step's rows in rank order.
                return old
            return pl.DataFrame(schema={c: (pl.Int64 if c in INT_COLS | {"rank", "attempt"} else pl.Float64) for c in cols})

        def scan(p, rank, att):
            return _scan(p, rank, att, cols, rename, lo, hi, cutoff[att], None if counts is None else counts[(rank, att)])
        try:
            try:
                df = _scan_together(todo, cols, rename, lo, hi, cutoff, counts)
            except pl.exceptions.PolarsError:  # e.g. a column typed differently in one file: cast file by file
                df = pl.concat([scan(p, r, a) for p, r, a in todo], how="vertical").collect()
            break
        except Exception:
            found = False
            for p, _, _ in todo:
                try:
                    pq.read_table(p.path)
                except Exception as e:
                    found = True
                    bad[p.path] = corrupt_part(p.path, e)
                    warnings.append(bad[p.path])
            if not found:
                raise
    if old is not None and old.height:
        df = merge_old(old, df, scalars)
    elif not any(p.has_log_rows for p, _, _ in todo):
        return df
    is_log = df["step_time_s"].is_null()
    return _coalesce_logs(df.filter(~is_log), df.filter(is_log), scalars, buffers) if is_log.any() else df
