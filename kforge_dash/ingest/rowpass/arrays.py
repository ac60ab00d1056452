"""numpy -> Arrow without ``pa.array``: on its first numpy (or list) argument pyarrow checks for
pandas objects, which imports pandas (~0.2 s of an ingest's start, for nothing ingest uses)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

_TYPES = {np.dtype(np.float64): pa.float64(), np.dtype(np.int64): pa.int64(), np.dtype(np.uint32): pa.uint32(),
          np.dtype(np.int32): pa.int32(), np.dtype(np.float32): pa.float32()}


def np_array(values: np.ndarray, mask: np.ndarray | None = None) -> pa.Array:
    """``pa.array(values, mask=mask)`` (``mask`` True: null) for 1-d numeric numpy arrays; other
    inputs go to pa.array itself."""
    values = np.asarray(values)
    typ = _TYPES.get(values.dtype)
    if typ is None or values.ndim != 1:
        return pa.array(values, mask=mask)
    values = np.ascontiguousarray(values)
    if mask is None:
        return pa.Array.from_buffers(typ, len(values), [None, pa.py_buffer(values)], null_count=0)
    valid = ~np.asarray(mask, dtype=bool)
    nulls = len(values) - int(np.count_nonzero(valid))
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    return pa.Array.from_buffers(typ, len(values), [bitmap, pa.py_buffer(values)], null_count=nulls)
