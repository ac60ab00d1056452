"""The work of one step window, as one function of plain values: rows -> de-duplicated rows ->
one row per step (docs/CONTRACT.md, "Ingested outputs").

``ingest_window`` takes a ``WindowTask`` (picklable: paths, footers, column names, numbers) and
returns a ``WindowRows``, so windows can be handed to other processes; ingest itself runs them
one after the other (kforge_dash.ingest.rows), writing each window's rows while the next is read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import polars as pl
import pyarrow as pa

from kforge_dash.ingest.append import old_rows
from kforge_dash.ingest.ranks_writer import arrow_table
from kforge_dash.ingest.read import PartToRead, ReadSpec, read_window
from kforge_dash.ingest.reduce import Buffers, reduce_steps


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


@dataclass(frozen=True)
class WindowRows:
    """What one window gave."""

    rows: pa.Table | None  # the rows for ranks.parquet (None: handed to ``put_rows`` instead, or none)
    steps: pl.DataFrame | None  # one row per step, before tokens/s, MFU and EMAs (None: no rows)
    rank_ids: set[int]
    repeats: dict[tuple[int, int], int]  # (rank, launch) -> steps recorded more than once
    bad: dict[str, str]  # path -> warning: parts found corrupt in this window
    warnings: list[str]


def ingest_window(task: WindowTask, *, buffers: Buffers | None = None,
                  put_rows: Callable[[pa.Table], None] | None = None) -> WindowRows:
    """Read, coalesce, de-duplicate and reduce the rows of one window.

    ``buffers``: numpy work space reused from the previous window in this process. ``put_rows``:
    called with the rows as soon as they are ready, before the reduction (so a background writer
    overlaps it); without it they come back in ``WindowRows.rows``.
    """
    spec = task.spec
    buffers = buffers or Buffers()
    bad, warnings = dict(task.skip), []
    old = None
    if task.old_ranks_path is not None:
        old = old_rows(task.old_ranks_path, task.lo, task.hi, spec.cols, spec.counts_tokens)
    df = read_window(task.files, spec, task.lo, task.hi, bad=bad, warnings=warnings, buffers=buffers, old=old)
    new_bad = {p: w for p, w in bad.items() if p not in task.skip}
    if not df.height:
        return WindowRows(None, None, set(), {}, new_bad, warnings)
    repeats: dict[tuple[int, int], int] = {}
    df = dedup_rows(df, repeats)
    rows = arrow_table(df.drop("_counts", strict=False))
    if put_rows is not None:
        put_rows(rows)  # written while the window is reduced
        rows = None
    steps = reduce_steps(df, spec.cols, spec.counts_tokens is not None, buffers)
    return WindowRows(rows, steps, set(df["rank"].unique().to_list()), repeats, new_bad, warnings)


def dedup_rows(df: pl.DataFrame, repeats: dict) -> pl.DataFrame:
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
