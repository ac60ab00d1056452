"""What a window's result weighs when it is shipped to the driver (``kforge-ingest --dask``).

distributed ships a task's result to the client pickled (protocol 5, buffers out of band; a
``WindowRows`` is a plain dataclass, so no special serializer applies), and the scheduler's own
``nbytes`` of a result is ``dask.sizeof``, which for a dataclass is ``sys.getsizeof`` (a few
hundred bytes whatever it holds). So the worker pickles each part of the result once more the
same way and counts the bytes (out-of-band Arrow buffers are not copied: cheap), and the driver
adds the windows up (``Funnel``): the rows for ranks.parquet, the per-step rows, the ended rows'
periods (``WindowRows.ends``, 16 bytes a row) and the rest, beside the rows' own Arrow bytes.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, fields

__all__ = ["DriverBytes", "Funnel", "WindowBytes", "shipped_bytes", "window_bytes"]


def shipped_bytes(obj) -> int:
    """Bytes of ``obj`` pickled as distributed ships it (protocol 5, out-of-band buffers counted)."""
    buffers: list[pickle.PickleBuffer] = []
    head = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    return len(head) + sum(b.raw().nbytes for b in buffers)


@dataclass(frozen=True)
class WindowBytes:
    """One window's result as shipped, and what it cost its worker."""

    rows: int  # the rows for ranks.parquet
    steps: int  # one row per step
    periods: int  # the ended rows' steps and periods (WindowRows.ends)
    other: int  # the rest: rank ids, repeats, warnings, read counts
    rows_arrow: int  # the rows' own Arrow bytes (pa.Table.nbytes), the ratio's denominator
    n_rows: int
    cpu_s: float  # the worker process's CPU time over the window (all its threads: polars' too)
    wall_s: float


def window_bytes(result, *, cpu_s: float, wall_s: float) -> WindowBytes:
    """The WindowBytes of a ``window.WindowRows`` (on the worker, before it is shipped)."""
    total = shipped_bytes(result)
    rows = 0 if result.rows is None else shipped_bytes(result.rows)
    steps = 0 if result.steps is None else shipped_bytes(result.steps)
    periods = shipped_bytes(result.ends) if result.ends else 0
    return WindowBytes(rows=rows, steps=steps, periods=periods, other=max(0, total - rows - steps - periods),
                       rows_arrow=0 if result.rows is None else result.rows.nbytes,
                       n_rows=0 if result.rows is None else result.rows.num_rows, cpu_s=cpu_s, wall_s=wall_s)


@dataclass(frozen=True)
class DriverBytes:
    """What the driver received for one run's windows (``IngestResult.driver``), summed.

    ``driver_s``: the driver's time on the results outside waiting for workers (writing the rows
    into ranks.parquet's writer, adding the steps and periods up)."""

    windows: int
    rows: int
    steps: int
    periods: int
    other: int
    rows_arrow: int
    n_rows: int
    worker_cpu_s: float
    worker_wall_s: float
    driver_s: float

    @property
    def received(self) -> int:
        return self.rows + self.steps + self.periods + self.other

    @property
    def fraction(self) -> float | None:
        """Bytes received over the rows' Arrow bytes (None: no rows)."""
        return self.received / self.rows_arrow if self.rows_arrow else None

    def to_dict(self) -> dict:
        """JSON-able, for ``kforge-ingest --json`` (``driver``): the fields, ``received`` and ``fraction``."""
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "received": self.received,
                "fraction": self.fraction}


class Funnel:
    """The windows of one run added up on the driver, window after window."""

    def __init__(self):
        self.parts: list[WindowBytes] = []
        self.driver_s = 0.0

    def add(self, w: WindowBytes) -> None:
        self.parts.append(w)

    def total(self) -> DriverBytes | None:
        """The sums (None: no window came back)."""
        if not self.parts:
            return None
        return DriverBytes(windows=len(self.parts), **{k: sum(getattr(w, k) for w in self.parts) for k in (
            "rows", "steps", "periods", "other", "rows_arrow", "n_rows")},
            worker_cpu_s=sum(w.cpu_s for w in self.parts), worker_wall_s=sum(w.wall_s for w in self.parts),
            driver_s=self.driver_s)
