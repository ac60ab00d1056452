"""Writing ranks.parquet: each window's rows appended on a background thread while the next window
is read (docs/CONTRACT.md, "Ingested outputs")."""

from __future__ import annotations

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq


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
