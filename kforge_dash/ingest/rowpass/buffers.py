"""numpy work space reused from one window (or batch, or findings window) to the next, and the one
way ingest copies a polars/Arrow column into it.

Fresh memory for every window (what Series.to_numpy gives on a chunked series) is page-faulted in
again each time, which cost more than the arithmetic; so each user keeps a ``Buffers`` (one per
thread) and asks it for arrays by role."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pyarrow as pa


class Buffers:
    """Window-sized numpy arrays kept from one window to the next, by role; a window's columns are
    copied into them from polars' chunks."""

    def __init__(self):
        self._b: dict[str, np.ndarray] = {}

    def get(self, role: str, dtype, shape: int | tuple[int, ...]) -> np.ndarray:
        """An array of ``shape`` (a length, or a tuple) for ``role``; the same memory each call, so
        what a role held before is overwritten: copy what must outlive it."""
        tup = isinstance(shape, tuple)
        n = math.prod(shape) if tup else int(shape)
        key = (role, np.dtype(dtype).str)
        b = self._b.get(key)
        if b is None or b.size < n:
            b = self._b[key] = np.empty(n, dtype)
        return b[:n].reshape(shape) if tup else b[:n]

    def flat(self, role: str, s: pl.Series) -> np.ndarray:
        """``s`` (no nulls) as one array of its own numpy type."""
        out = self.get(role, _NP.get(s.dtype) or s.get_chunks()[0].to_numpy().dtype, len(s))
        _copy_chunks(s, out)
        return out

    def column(self, role: str, s: pl.Series, fill=None) -> tuple[np.ndarray, np.ndarray | None]:
        """(values, has): ``s`` as one array, nulls set to ``fill``; has is None when no nulls."""
        dtype = _NP.get(s.dtype)
        if dtype is None or dtype is np.bool_:
            return self._column_by_polars(role, s, fill, dtype)
        n = len(s)
        v = self.get(role, dtype, n)
        if not s.null_count():
            _copy_chunks(s, v)
            return v, None
        has = self.get(role + "/has", np.bool_, n)
        _copy_with_validity(pa.chunked_array(s), v, has)
        missing = self.get(role + "/missing", np.bool_, n)  # (~has would be new pages each call)
        np.logical_not(has, out=missing)
        np.copyto(v, fill, where=missing)  # the values under nulls are arbitrary: overwrite them
        return v, has

    def _column_by_polars(self, role: str, s: pl.Series, fill, dtype) -> tuple[np.ndarray, np.ndarray | None]:
        """column() for booleans (bit-packed in Arrow) and types ingest does not make (no reuse)."""
        has = None
        if s.null_count():
            has = self.get(role + "/has", np.bool_, len(s))
            _copy_chunks(s.is_not_null(), has)
            s = s.fill_null(fill)
        if dtype is None:
            return s.to_numpy(), has
        v = self.get(role, dtype, len(s))
        _copy_chunks(s, v)
        return v, has


_NP = {pl.Float64: np.float64, pl.Int64: np.int64, pl.Boolean: np.bool_}


def _copy_chunks(s: pl.Series, out: np.ndarray) -> None:
    """Copy the chunks of ``s`` (no nulls) into ``out``; each chunk's to_numpy is a view."""
    chunks = s.get_chunks()
    if len(chunks) == 1:
        out[:] = chunks[0].to_numpy()
    else:
        np.concatenate([c.to_numpy() for c in chunks], out=out)


def _copy_with_validity(column: pa.ChunkedArray, out: np.ndarray, has: np.ndarray) -> None:
    """Copy the value buffers of a numeric column's chunks (what lies under a null included) into
    ``out``, and where each value is valid into ``has``, with no copy of the chunks first (polars'
    is_not_null and to_numpy made two: a boolean column, then bytes from its bits)."""
    at, size = 0, out.dtype.itemsize
    for ch in column.chunks:
        n = len(ch)
        if not n:
            continue
        valid, data = ch.buffers()
        out[at:at + n] = np.frombuffer(data, out.dtype, n, ch.offset * size)
        if valid is None or not ch.null_count:
            has[at:at + n] = True
        else:  # the validity bitmap, least significant bit first, from the chunk's bit offset
            lead = ch.offset % 8
            bits = np.frombuffer(valid, np.uint8, (lead + n + 7) // 8, ch.offset // 8)
            has[at:at + n] = np.unpackbits(bits, count=lead + n, bitorder="little")[lead:]
        at += n
