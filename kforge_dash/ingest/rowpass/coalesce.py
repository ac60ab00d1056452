"""Folding Recorder.log rows into the end_step row of their (rank, step) (docs/CONTRACT.md, "Shards").

A window may be coalesced in batches of ranks (window.py): the clashes found are counted in a
``Clashes`` across them, so the window still gives one warning per kind and column.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl

from kforge_dash.ingest.rowpass.buffers import Buffers


@dataclass
class Clashes:
    """Values set twice, differently, for one (rank, step): per column, how many (rank, step) and
    the first such step, added up over the batches of one window."""

    twice: dict[str, tuple[int, int]] = field(default_factory=dict)  # logged twice
    both: dict[str, tuple[int, int]] = field(default_factory=dict)  # given by end_step and by log

    @staticmethod
    def _add(into: dict, col: str, k: int, first: int) -> None:
        n, f = into.get(col, (0, first))
        into[col] = (n + k, min(f, first))

    def warnings(self, scalars: list[str]) -> list[str]:
        """One warning per kind and column, in column order (logged-twice ones first)."""
        out = [f"{c!r} logged with different values more than once for {self.twice[c][0]} (rank, step) "
               f"(steps {self.twice[c][1]}...): the last logged kept" for c in scalars if c in self.twice]
        out += [f"{c!r} given by both end_step and log, differently, for {self.both[c][0]} (rank, step) "
                f"(steps {self.both[c][1]}...): the end_step value kept" for c in scalars if c in self.both]
        return out


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
    if key.size > 1:
        up = buffers.get("key/up", np.bool_, key.size - 1)  # (a comparison's own result: new pages each batch)
        np.greater(key[1:], key[:-1], out=up)
        if not up.all():
            return None
    want = (agg["rank"].to_numpy().astype(np.int64) << 40) + agg["step"].to_numpy()
    pos = np.searchsorted(key, want)
    got = pos < key.size
    got[got] = key[pos[got]] == want[got]
    return pl.Series(pos[got], dtype=pl.UInt32), pl.Series(got)


def _twice(logs: pl.DataFrame, scalars: list[str], clashes: Clashes) -> None:
    """Count values logged more than once, differently, for one (rank, step): the last wins."""
    if logs.select(pl.struct("rank", "step").is_unique().all()).item():
        return
    n = logs.group_by(["rank", "step"]).agg(*[(pl.col(c).drop_nulls().n_unique() > 1).alias(c) for c in scalars])
    for c in scalars:
        if (k := int(n[c].sum())):
            clashes._add(clashes.twice, c, k, int(n.filter(pl.col(c))["step"].min()))


def coalesce_logs(ends: pl.DataFrame, logs: pl.DataFrame, scalars: list[str], buffers: Buffers | None = None,
                  clashes: Clashes | None = None) -> pl.DataFrame:
    """Fold Recorder.log rows (step_time_s null) into the end_step row of the same (rank, step).

    The end_step row's values win; log rows fill the columns it left null (the last logged value
    when several). Either kind of clash (end_step and log, or log twice, with different values)
    is counted in ``clashes``. A log for a step the rank never ended stays a row of its own.
    Log rows are few, so instead of joining the big frame (slow), the matching end rows are found
    with a hash lookup and only those cells are written (scatter).
    """
    clashes = clashes if clashes is not None else Clashes()
    _twice(logs, scalars, clashes)
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
        was = col.gather(hit)
        if (k := int((was.is_not_null() & at[c].is_not_null() & (was != at[c])).sum())):
            clashes._add(clashes.both, c, k, int(ends["step"].gather(hit).filter(was != at[c]).min()))
        col.scatter(hit, pl.select(pl.coalesce(was, at[c])).to_series())
        updates.append(col)
    merged = ends.with_columns(updates) if updates else ends
    if only is None:
        only = agg.join(at.select("rank", "step"), on=["rank", "step"], how="anti")
    return pl.concat([merged, only.select(ends.columns)], how="vertical", rechunk=False) if only.height else merged
