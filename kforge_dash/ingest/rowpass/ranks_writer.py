"""Writing ranks.parquet: each window's rows appended on a background thread while the next window
is read (docs/CONTRACT.md, "Ingested outputs")."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from kforge_dash.contract import RANKS_NONFINITE_KEY

ROW_GROUP_ROWS = 1 << 20  # a table is written in row groups of this many rows (pyarrow's default)


def arrow_table(df: pl.DataFrame, *, exclude: tuple[str, ...] = ()) -> pa.Table:
    """``df`` as an Arrow table without copying, less the columns ``exclude``: each column keeps
    its own chunks. (DataFrame.to_arrow first gives every column the same chunks, and so does
    DataFrame.drop, which runs a query: here either means a copy of the whole window, as the
    scanned columns come in one chunk per file, rank and attempt in one.) Each column goes over
    the Arrow C stream, one call a column (a call per chunk cost 5x more at 100 chunks)."""
    return pa.table({c: pa.chunked_array(df[c]) for c in df.columns if c not in exclude})


def may_be_nonfinite(column: pa.ChunkedArray) -> bool:
    """False only when every value of a float64 column, null slots included, is finite.

    One sum over each chunk's value buffer (no copy, no mask): a NaN or an infinity makes the sum
    non-finite, and a finite sum means none was there. The garbage a null slot may hold, or a sum
    that overflows, can only answer True, which costs a read, never a missed finding."""
    for chunk in column.chunks:
        if len(chunk) == 0:
            continue
        buf = chunk.buffers()[1]
        if buf is None:
            return True
        values = np.frombuffer(buf, dtype=np.float64, count=len(chunk), offset=chunk.offset * 8)
        with np.errstate(over="ignore", invalid="ignore"):
            total = np.add.reduce(values)
        if not np.isfinite(total):
            return True
    return False


class RanksWriter:
    """Appends each window's rows to ranks.parquet on a background thread (pyarrow releases the
    GIL while encoding), so writing overlaps reading the next window. At most one window waits.

    On close the file's key-value metadata lists the float columns that may hold NaN/inf
    (contract.RANKS_NONFINITE_KEY): the nonfinite finding reads only those."""

    def __init__(self, path: str):
        from concurrent.futures import ThreadPoolExecutor

        self.path = path
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kforge-ranks-writer")
        self.pending = None
        self.writer = None
        self.schema: pa.Schema | None = None  # the file's: the first table's
        self.nonfinite: set[str] = set()

    def _write(self, table: pa.Table) -> None:
        if self.writer is None:
            # Dictionary encoding pays off only for the repetitive key columns; floats rarely repeat.
            # lz4: a third faster to write than zstd here, for files ~20% larger. Min/max
            # statistics only for the keys readers filter on, and batches of 64k rows (not 1k):
            # together a fifth less CPU for the same data.
            keys = [c for c in ("step", "rank", "attempt") if c in table.schema.names]
            self.writer = pq.ParquetWriter(self.path, table.schema, compression="lz4", use_dictionary=keys,
                                           write_statistics=keys, write_batch_size=1 << 16)
        self.writer.write_table(table, row_group_size=ROW_GROUP_ROWS)

    def wait(self) -> None:
        """Until the pending window is written (re-raises a write error here)."""
        if self.pending is not None:
            self.pending.result()
            self.pending = None

    def put(self, table: pa.Table) -> None:
        # The cast and the NaN/inf check here, on the caller's thread, while the last window is
        # still being written: the writer's thread is the row pass's busiest (its bound on 2 cores).
        if self.schema is None:
            self.schema = table.schema
        table = table.cast(self.schema)
        for name, col in zip(table.column_names, table.columns):
            if name not in self.nonfinite and pa.types.is_float64(col.type) and may_be_nonfinite(col):
                self.nonfinite.add(name)
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
                self.writer.add_key_value_metadata({RANKS_NONFINITE_KEY: json.dumps(sorted(self.nonfinite))})
                self.writer.close()
