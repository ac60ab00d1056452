"""Appending to the last ingest instead of redoing it, when new part files are all that changed
(a running job between two `kforge-ingest --watch` polls).

Rows below the first step the new parts hold (``start``) cannot have changed, so their reduced
steps are taken from the old steps.parquet and their rows copied from the old ranks.parquet
(one sequential file, instead of every part file again). From ``start`` on, the old rows are
read back from ranks.parquet and merged with the new parts' rows, window by window, through
the same coalescing, de-duplication and reductions as a full ingest, so both give the same
outputs (tests/test_ingest_append.py checks that).

Anything else (an attempt folder added or gone, a meta.json or a consumed part changed, other
options, new columns, a restart cut-off that moved, outputs edited since) makes ``plan_append``
answer None, and ingest starts from scratch. While merging, two cases a merge cannot reproduce
exactly raise ``AppendConflict`` and ingest starts from scratch too: a step a rank ended again
in a new part (a rollback across parts), and a scalar logged again for a (rank, step) whose
kept row already holds one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kforge_dash.contract import RANKS_FILE, STEPS_FILE
from kforge_dash.ingest.inputs import shards as _shards
from kforge_dash.ingest.inputs.coverage import Coverage, unread_tail
from kforge_dash.ingest.inputs.manifest import Prior, output_stat
from kforge_dash.ingest.inputs.parquet_io import read_columns
from kforge_dash.ingest.rowpass.merge import AppendConflict
from kforge_record.regular_file import check_regular_file
from kforge_record.schema import META_FILE


@dataclass(frozen=True)
class AppendPlan:
    new_files: list  # (PartInfo, rank, launch index) of the part files the last ingest did not see
    start: int | None  # the smallest step in them (None: no new rows, only the summary is redone)
    ranks_path: str
    steps_path: str
    state: dict  # the last ingest's (manifest state): its repeats and rank ids carry over


def attempts_state(listing, stats) -> list:
    """What identifies the attempts an ingest was made from: rank, id and meta.json's stat."""
    return [[af.rank, af.attempt_id, _list(stats.get(os.path.join(af.dir, META_FILE)))] for af in listing]


def _list(st):
    return None if st is None else list(st)


def plan_append(prior: Prior, *, run_dir: str, out_dir: str, listing, stats: dict, options: dict, files: list,
                cutoff: dict, cols: list, rename: dict) -> AppendPlan | None:
    """An AppendPlan when the old outputs can be extended with the new part files, else None."""
    s = prior.state
    if (s.get("options") != options or s.get("attempts") != attempts_state(listing, stats)
            or s.get("cutoff") != {str(k): v for k, v in cutoff.items()}
            or not set(s.get("cols") or ()) <= set(cols) or s.get("rename") != rename):
        return None  # (a new scalar or phase column is fine: the old rows get it as null)
    outputs = s.get("outputs") or {}
    if outputs.get("steps") is None or outputs.get("steps") != output_stat(out_dir, STEPS_FILE) \
            or outputs.get("ranks") != output_stat(out_dir, RANKS_FILE):
        return None
    current = {_shards.rel_path(run_dir, p): st for p, st in stats.items()}
    cover = Coverage(prior.parts, (_shards.rel_path(run_dir, p) for af in listing for p in af.parts))
    for rel, entry in prior.parts.items():
        if not entry.same_file(current.get(rel)) and (rel in current or not cover.replaced(rel)):
            return None  # a part the outputs were made from changed or is gone (and not merged)
    new = _new_rows(files, prior, cover, run_dir)
    if new is None:
        return None
    start = min((f.part.min_step for f in new), default=None)
    return AppendPlan(new, start, os.path.join(out_dir, RANKS_FILE), os.path.join(out_dir, STEPS_FILE), s)


def _new_rows(files: list, prior: Prior, cover: Coverage, run_dir: str) -> list | None:
    """The files (read.PartToRead) with rows the last ingest did not read: new parts, and
    merged parts less the head it read from the parts they replace; None when that cannot be told."""
    new = []
    for f in files:
        rel = _shards.rel_path(run_dir, f.part.path)
        if rel in prior.parts:
            continue
        read = cover.flushes_read(rel)
        if read is None:
            return None
        if read == 0:
            new.append(f)
            continue
        try:
            tail = unread_tail(f, read)
        except (OSError, ValueError, KeyError, TypeError):  # no flush_rows, unreadable: a full ingest tells
            return None
        if tail is not None:
            new.append(tail)
    return new


def recheck_bad(known_bad: dict, bad: dict, warnings: list[str]) -> None:
    """Parts whose rows failed to decode in the last ingest, read again on their own: still bad,
    they are skipped with a warning as a full ingest would; readable now (the error was passing),
    their rows are missing from the old outputs, so the append is off (AppendConflict)."""
    for path in known_bad:
        try:
            read_columns(path)
        except Exception as e:
            bad[path] = _shards.corrupt_part(path, e)
            warnings.append(bad[path])
            continue
        raise AppendConflict(f"{path} is readable now")


def old_ranks_parts(path: str, start: int) -> list:
    """The old ranks.parquet's row groups that hold steps >= start, as (PartInfo, None, None)
    stand-ins for plan_windows (which needs only their step range and row count)."""
    check_regular_file(path)
    pf = pq.ParquetFile(path)
    i = pf.schema_arrow.get_field_index("step")
    out = []
    for g in range(pf.num_row_groups):
        rg = pf.metadata.row_group(g)
        st = rg.column(i).statistics
        if rg.num_rows == 0:
            continue
        lo, hi = (st.min, st.max) if st is not None and st.has_min_max else (start, None)
        if hi is None:  # no statistics: read the column
            steps = pf.read_row_group(g, columns=["step"]).column("step")
            mm = pc.min_max(steps)
            lo, hi = mm["min"].as_py(), mm["max"].as_py()
        if hi >= start:
            out.append((_shards.PartInfo(path, rg.num_rows, {}, max(lo, start), hi, False, None), None, None))
    return out


def copy_head(path: str, start: int, cols: list[str], put) -> None:
    """Hand every row of the old ranks.parquet with step < start to ``put``, in file order,
    one row group at a time (bounded memory), with the columns ``cols`` (new ones null)."""
    check_regular_file(path)
    pf = pq.ParquetFile(path)
    i = pf.schema_arrow.get_field_index("step")
    for g in range(pf.num_row_groups):
        st = pf.metadata.row_group(g).column(i).statistics
        known = st is not None and st.has_min_max
        if known and st.min >= start:
            continue
        t = pf.read_row_group(g)
        if not (known and st.max < start):
            t = t.filter(pc.less(t.column("step"), start))
        if t.num_rows:
            put(_conform(t, cols))


def _conform(t: pa.Table, cols: list[str]) -> pa.Table:
    """``t`` with the columns ``cols`` in order; a column it lacks (a scalar first recorded in
    the new parts) is all null, float64 like every scalar."""
    if t.column_names == cols:
        return t
    have = set(t.column_names)
    return pa.table({c: t.column(c) if c in have else pa.nulls(t.num_rows, pa.float64()) for c in cols})


def old_rows(path: str, lo: int, hi: int, cols: list[str], counts: dict | None) -> pl.DataFrame:
    """The old ranks.parquet's rows with lo <= step < hi (row groups pruned by their statistics)
    with the columns ``cols`` (new ones null), plus the _counts column the reductions need when
    some ranks' tokens do not count."""
    lf = pl.scan_parquet(path, glob=False)  # a path, never a pattern (run dirs named sweep[lr=3e-4])
    have = set(lf.collect_schema().names())
    lf = lf.filter((pl.col("step") >= lo) & (pl.col("step") < hi))
    df = lf.select([pl.col(c) if c in have else pl.lit(None, pl.Float64).alias(c) for c in cols]).collect()
    if counts is not None:
        key = pl.col("rank").cast(pl.Int64) * (1 << 20) + pl.col("attempt")
        mapping = {r * (1 << 20) + a: bool(v) for (r, a), v in counts.items()}
        df = df.with_columns(key.replace_strict(mapping, default=True, return_dtype=pl.Boolean).alias("_counts"))
    return df


def old_steps_head(path: str, start: int | None, derived: set) -> pl.DataFrame:
    """The old steps.parquet's rows below ``start`` (all when None), without the derived columns
    (tokens/s, MFU, EMAs), which are computed again over the whole run."""
    lf = pl.scan_parquet(path, glob=False)  # a path, never a pattern (run dirs named sweep[lr=3e-4])
    if start is not None:
        lf = lf.filter(pl.col("step") < start)
    return lf.drop([c for c in lf.collect_schema().names() if c in derived]).collect()
