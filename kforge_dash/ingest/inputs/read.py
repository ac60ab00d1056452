"""Reading a run's rows in step windows: the output columns, the window plan, one scan per
window or per batch of ranks in it (log rows coalesced by coalesce.py; ranks.parquet is written
by ranks_writer.py).

Each window holds every rank's rows for its steps, so the per-step reductions are complete within
it and the run can be far larger than memory; a window far bigger than chunk_rows is read in
batches of ranks (read_batches), so memory is bounded by about chunk_rows rows either way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from kforge_dash.contract import RESERVED_OUTPUT_NAMES
from kforge_dash.ingest.inputs.shards import PartInfo, corrupt_part
from kforge_dash.ingest.options import PartVanished
from kforge_dash.ingest.rowpass.buffers import Buffers
from kforge_dash.ingest.rowpass.coalesce import Clashes, coalesce_logs
from kforge_dash.ingest.rowpass.merge import merge_old
from kforge_record.schema import FIXED_NAMES, MEM_COLUMNS, PHASE_PREFIX

INT_COLS = {"step", "tokens", *MEM_COLUMNS}
LOGGED_FIXED = ("loss", "grad_norm", "lr", "tokens")  # fixed columns a Recorder.log row may fill


class PartToRead(NamedTuple):
    """A part file to read in windows, and whose rows it holds. The append's stand-ins for the old
    ranks.parquet's row groups (append.old_ranks_parts) have rank and launch None."""

    part: PartInfo
    rank: int | None
    launch: int | None  # the launch index, written as the ``attempt`` column
    skip_rows: int = 0  # rows at the head of the file an append already has (a merged part: coverage.py)


@dataclass(frozen=True)
class ReadSpec:
    """What every window of one ingest reads with. Plain values (picklable), so a window can be
    read in another process."""

    cols: list[str]  # the output columns of ranks.parquet, in order (output_columns)
    rename: dict[str, str]  # recorded name -> output name, for user scalars that clash
    cutoff: dict[int, int | None]  # launch -> first step a later launch superseded (None: none)
    counts_tokens: dict[tuple[int, int], bool] | None  # (rank, launch) -> tokens count; None: all do
    # rank, attempt, step, time of rows a rollback superseded that no later row ended again, left out by
    # window.dedup_rows (rollbacks.Lineage.tails; None: none)
    tails: pl.DataFrame | None = None

    @property
    def scalars(self) -> list[str]:
        """Phases and user scalars: the columns a Recorder.log row can carry."""
        return self.cols[len(FIXED_NAMES) + 2:]

    @property
    def recorded_name(self) -> dict[str, str]:
        """Output name -> the name in the part files (the inverse of ``rename``)."""
        return {v: k for k, v in self.rename.items()}

    def empty_frame(self) -> pl.DataFrame:
        return pl.DataFrame(schema={c: (pl.Int64 if c in INT_COLS | {"rank", "attempt"} else pl.Float64)
                                    for c in self.cols})


def _dtype(col: str):
    return pl.Int64 if col in INT_COLS else pl.Float64


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


def _scan_one(item: PartToRead, spec: ReadSpec, lo: int, hi: int, *, row_index: bool = False) -> pl.LazyFrame:
    """One part file as a lazy frame with every output column (absent ones null) and its step
    window. The filter is pushed into the Parquet reader: rows outside it are never built.
    ``row_index``: with ``_row``, each row's index in the file (as its reader counts it, so the filter is
    still pushed down)."""
    part, rank, launch = item.part, item.rank, item.launch
    recorded = spec.recorded_name
    exprs = []
    for c in spec.cols:
        if c == "rank":
            exprs.append(pl.lit(rank, pl.Int64).alias("rank"))
        elif c == "attempt":
            exprs.append(pl.lit(launch, pl.Int64).alias("attempt"))
        else:
            src = recorded.get(c, c)
            exprs.append(pl.col(src).cast(_dtype(c)).alias(c) if src in part.columns else pl.lit(None, _dtype(c)).alias(c))
    if spec.counts_tokens is not None:
        exprs.append(pl.lit(spec.counts_tokens[(rank, launch)]).alias("_counts"))
    cond = (pl.col("step") >= lo) & (pl.col("step") < hi)
    cutoff = spec.cutoff[launch]
    if cutoff is not None:
        cond = cond & (pl.col("step") < cutoff)
    # glob=False: a run directory may be named like a pattern (sweep[lr=3e-4]); a path is a path.
    if item.skip_rows or row_index:  # the head of a merged part that an append read before (coverage.py)
        lf = pl.scan_parquet(part.path, glob=False, row_index_name="_row")
        return lf.filter(cond & (pl.col("_row") >= item.skip_rows)).select(*exprs, *(["_row"] if row_index else []))
    return pl.scan_parquet(part.path, glob=False).filter(cond).select(exprs)


def scan_part(item: PartToRead, spec: ReadSpec, lo: int = -(1 << 62), hi: int = 1 << 62) -> pl.LazyFrame:
    """The rows of one part file in steps [lo, hi) that the plan keeps (its launch's cut-off applied), in
    write order, with every output column (absent ones null) and ``_row``, its row's index in the file."""
    return _scan_one(item._replace(skip_rows=0), spec, lo, hi, row_index=True)


_PIECE_ROWS = 16_384  # rows of a big part file counted as one place a window may end


def plan_windows(files: list[PartToRead], chunk_rows: int) -> list[tuple[int, int]]:
    """Step windows [lo, hi) of about chunk_rows rows each, cut where part files start.

    A window closes at the first part-file start after it holds chunk_rows rows (counting each
    file where it starts), so windows follow the part files (each read once when ranks flush
    in step, as the recorder does by default) and a stray far-away step cannot make one huge
    window. A part that straddles a cut is read by both windows, each keeping its own steps.
    A merged part (kforge_record/compact.py) spans many windows' steps: a window can end inside it
    where one of its row groups starts (footer statistics: PartInfo.group_steps), so each window
    decodes only its own row groups of it (a cut inside a row group decodes it twice: 12 % of the
    CPU of a 1,024-rank merged ingest); a big part without them is counted in pieces of about
    _PIECE_ROWS rows spread over its steps.
    """
    rows_starting_at: dict[int, int] = {}  # step -> rows of the parts that start there
    for f in files:
        if f.part.group_steps is not None:  # a merged part: its row groups' starts, each read by one window
            # Within the steps it is read for: an append reads a merged part from its first new
            # row on (coverage.py narrows min_step), and no window may start below that.
            lo_step, hi_step = f.part.min_step, f.part.max_step
            starts = [lo_step, *(g for g in f.part.group_steps if lo_step < g <= hi_step)]
        else:
            span = f.part.max_step - f.part.min_step + 1
            pieces = max(1, min(-(-f.part.num_rows // _PIECE_ROWS), span))
            starts = [f.part.min_step + span * j // pieces for j in range(pieces)]
        for at in starts:
            rows_starting_at[at] = rows_starting_at.get(at, 0) + f.part.num_rows // len(starts)
    hi = max(f.part.max_step for f in files) + 1
    windows, held = [], 0
    lo = min(rows_starting_at)
    for step in sorted(rows_starting_at):
        if held >= chunk_rows and step > lo:
            windows.append((lo, step))
            lo, held = step, 0
        held += rows_starting_at[step]
    windows.append((lo, hi))
    return windows


def _scan_schema(todo: list[PartToRead], rename: dict) -> dict:
    """Every recorded column of the window's files with the type it is read as."""
    schema = {}
    for f in todo:
        for name in f.part.columns:
            schema.setdefault(name, _dtype(rename.get(name, name)))
    return schema


def _scan_rows(todo: list[PartToRead], schema: dict, lo: int, hi: int):
    """(rows, file index of each row or None when every file was read whole and in order,
    rank of each row, launch of each row), from ONE polars scan of the window's files."""
    paths = [f.part.path for f in todo]
    num_rows = np.array([f.part.num_rows for f in todo], np.int64)
    ranks = np.array([f.rank for f in todo], np.int64)
    launches = np.array([f.launch for f in todo], np.int64)
    # No filter when whole files fit (and none starts with rows an append read before).
    whole = all(lo <= f.part.min_step and f.part.max_step < hi and not f.skip_rows for f in todo)
    if whole:
        df = pl.scan_parquet(paths, schema=schema, missing_columns="insert", glob=False).collect()
        if df.height == num_rows.sum():  # every file read whole, in order: its rows are its footer's row count
            return df, None, np.repeat(ranks, num_rows), np.repeat(launches, num_rows)
    # The row index counts rows before the filter, across the files in order: with each file's
    # row count from its footer, a binary search tells every row's file (cheaper than file paths).
    lf = pl.scan_parquet(paths, schema=schema, missing_columns="insert", row_index_name="_row", glob=False)
    if not whole:
        lf = lf.filter((pl.col("step") >= lo) & (pl.col("step") < hi))
    df = lf.collect()
    first_row = np.cumsum(np.r_[0, num_rows])
    file_of_row = np.searchsorted(first_row, df["_row"].to_numpy(), side="right") - 1
    skip = np.array([f.skip_rows for f in todo], np.int64)
    if skip.any():  # the head of a merged part whose rows an append read before, from the parts it replaced
        keep = df["_row"].to_numpy() - first_row[file_of_row] >= skip[file_of_row]
        df, file_of_row = df.filter(pl.Series(keep)), file_of_row[keep]
    return df, file_of_row, ranks[file_of_row], launches[file_of_row]


def _scan_together(todo: list[PartToRead], spec: ReadSpec, lo: int, hi: int) -> pl.DataFrame:
    """The window's part files in ONE polars scan (5x faster than a scan per file): a column a
    file lacks is inserted as null, and each row's file tells its rank and attempt."""
    schema = _scan_schema(todo, spec.rename)
    df, file_of_row, rank, launch = _scan_rows(todo, schema, lo, hi)
    if file_of_row is None and (spec.counts_tokens is not None or any(spec.cutoff[f.launch] is not None for f in todo)):
        file_of_row = np.repeat(np.arange(len(todo)), [f.part.num_rows for f in todo])
    recorded = spec.recorded_name
    out = []
    for c in spec.cols:
        if c == "rank":
            out.append(pl.Series("rank", rank))
        elif c == "attempt":
            out.append(pl.Series("attempt", launch))
        else:
            src = recorded.get(c, c)
            out.append(df[src].alias(c) if src in schema else pl.repeat(None, df.height, dtype=_dtype(c), eager=True).alias(c))
    if spec.counts_tokens is not None:
        out.append(pl.Series("_counts", np.array([spec.counts_tokens[(f.rank, f.launch)] for f in todo])[file_of_row]))
    df = pl.DataFrame(out)
    if len(todo) > 64 and df.height < len(todo) * 2048:
        # Many small part files (the recorder flushes every 100 steps by default): one chunk per
        # file per column makes every later column pass pay per chunk. One copy into single
        # chunks costs less than that overhead.
        df = df.rechunk()
    cuts = np.array([np.inf if spec.cutoff[f.launch] is None else spec.cutoff[f.launch] for f in todo])
    if file_of_row is not None and np.isfinite(cuts).any():  # an earlier launch's rows past a later launch's first step
        df = df.filter(pl.Series(df["step"].to_numpy() < cuts[file_of_row]))
    return df


def overlapping_parts(files: list[PartToRead], lo: int, hi: int) -> list[PartToRead]:
    """The parts that hold steps in [lo, hi), by their footers' step ranges: all a window reads."""
    mins = np.fromiter((f.part.min_step for f in files), np.int64, len(files))
    maxs = np.fromiter((f.part.max_step for f in files), np.int64, len(files))
    return [files[i] for i in np.flatnonzero((maxs >= lo) & (mins < hi))]


def _read_rows(todo: list[PartToRead], spec: ReadSpec, lo: int, hi: int) -> pl.DataFrame:
    try:
        return _scan_together(todo, spec, lo, hi)
    except pl.exceptions.PolarsError:  # e.g. a column typed differently in one file: cast file by file
        return pl.concat([_scan_one(f, spec, lo, hi) for f in todo], how="vertical").collect()


def _find_corrupt(todo: list[PartToRead], bad: dict, warnings: list[str]) -> bool:
    """Read each file whole: the ones that fail go into ``bad`` with a warning. True if any did."""
    found = False
    for f in todo:
        try:
            pq.read_table(f.part.path)
        except FileNotFoundError:  # merged by the recorder since the listing: list again
            raise PartVanished(f.part.path) from None
        except Exception as e:
            found = True
            bad[f.part.path] = corrupt_part(f.part.path, e)
            warnings.append(bad[f.part.path])
    return found


def read_window(files: list[PartToRead], spec: ReadSpec, lo: int, hi: int, *, bad: dict, warnings: list[str],
                buffers: Buffers | None = None, old: pl.DataFrame | None = None,
                clashes: Clashes | None = None) -> pl.DataFrame:
    """All rows with lo <= step < hi, log rows coalesced. A part file that fails to decode is
    found, reported, put in ``bad`` (path -> warning) and left out (its footer was fine, so only
    a full read tells). ``old``: the last ingest's kept rows of this window (an append, see
    docs/CONTRACT.md "Re-ingest"), merged in before coalescing. ``clashes``: where values logged
    twice are counted (a window read in batches warns once, at its end); None: warned here."""
    # What a log row can carry: the values Recorder.log takes by name, phases and user scalars.
    fill = [*LOGGED_FIXED, *spec.scalars]
    own = clashes is None
    clashes = Clashes() if own else clashes
    df = _read_coalesced(overlapping_parts(files, lo, hi), spec, lo, hi, fill, bad, warnings, buffers, old, clashes)
    if own:
        warnings.extend(clashes.warnings(fill))
    return df


def _read_coalesced(overlap: list[PartToRead], spec: ReadSpec, lo: int, hi: int, fill: list[str], bad: dict,
                    warnings: list[str], buffers: Buffers | None, old: pl.DataFrame | None,
                    clashes: Clashes) -> pl.DataFrame:
    while True:
        todo = [f for f in overlap if f.part.path not in bad]
        if not todo:
            if old is not None:
                # No new rows here: the last ingest's rows of these steps as they were written,
                # already coalesced and de-duplicated, each step's rows in rank order.
                return old
            return spec.empty_frame()
        try:
            df = _read_rows(todo, spec, lo, hi)
            break
        except Exception:
            if not _find_corrupt(todo, bad, warnings):
                raise
    if old is not None and old.height:
        df = merge_old(old, df, fill)
    elif not any(f.part.has_log_rows for f in todo):
        return df
    is_log = df["step_time_s"].is_null()
    return coalesce_logs(df.filter(~is_log), df.filter(is_log), fill, buffers, clashes) if is_log.any() else df


def rows_in(f: PartToRead, lo: int, hi: int) -> int:
    """About how many of a part's rows lie in [lo, hi), from its footer (rows spread evenly over its steps)."""
    span = f.part.max_step - f.part.min_step + 1
    inside = min(hi, f.part.max_step + 1) - max(lo, f.part.min_step)
    return f.part.num_rows if inside >= span else f.part.num_rows * max(inside, 0) // span


def read_batches(files: list[PartToRead], lo: int, hi: int, batch_rows: int, *, cutoff: dict,
                 bad: dict) -> list[list[PartToRead]]:
    """The part files of window [lo, hi) in batches of about ``batch_rows`` rows, so that a window
    far bigger than that (every rank's part files start together: 1,024 ranks x 10k-step parts
    make one of 10M rows) is never held whole.

    Batches are runs of consecutive files in the window's order (launch by launch, rank by rank),
    cut only where no (rank, step) can have rows on both sides: each one's rows (log rows, and
    rows of an earlier launch that a later one's log rows coalesce into) meet in one batch, so
    coalescing and de-duplication are complete within it. Two files of a rank may share a step
    when they are of one launch, or when the later launch's file starts below the earlier
    launch's ``cutoff`` (its rows stop there). Parts in ``bad`` (found corrupt before) are left out."""
    todo = [f for f in overlapping_parts(files, lo, hi) if f.part.path not in bad]
    if any(f.rank is None for f in todo):  # an append's stand-ins for old rows: read whole
        return [todo] if todo else []
    reach = _reach_back(todo, cutoff)
    out, cur, held = [], [], 0
    for i, f in enumerate(todo):
        if cur and held >= batch_rows and reach[i] >= i:  # nothing from i on shares a step with cur
            out.append(cur)
            cur, held = [], 0
        cur.append(f)
        held += rows_in(f, lo, hi)
    if cur:
        out.append(cur)
    return out


def _reach_back(todo: list[PartToRead], cutoff: dict) -> list[int]:
    """For each position i, the first file that some file at or after i may share a (rank, step)
    with (>= i: a batch may end before i)."""
    first_of: dict[tuple[int, int], int] = {}  # (rank, launch) -> its first file here
    launches_of: dict[int, list[int]] = {}  # rank -> its launches here, in order
    back = []
    for j, f in enumerate(todo):
        key = (f.rank, f.launch)
        if key not in first_of:
            first_of[key] = j
            launches_of.setdefault(f.rank, []).append(f.launch)
        b = first_of[key]
        for k in launches_of[f.rank]:
            cut = cutoff.get(k)
            if k != f.launch and (cut is None or f.part.min_step < cut):
                b = min(b, first_of[(f.rank, k)])
        back.append(b)
    reach, low = [0] * len(back), len(back)
    for i in range(len(back) - 1, -1, -1):
        low = min(low, back[i])
        reach[i] = low
    return reach
