"""Everything off the training thread: turning buffered rows into Arrow, atomic part files, backlog.

The training thread only hands over lists of rows (``submit``). A single daemon thread converts
them and writes each flush as one complete Parquet file (temp name, fsync, rename, fsync dir).
Write failures never propagate: rows stay in a bounded backlog and are retried at the next flush;
past the bound the oldest rows are dropped and counted.
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
import time
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .atomic import atomic_path, write_json_atomic
from .schema import (
    END_FILE,
    FIXED_COLUMNS,
    FIXED_NAMES,
    META_FILE,
    PARQUET_META_KEY,
    SCHEMA_VERSION,
    part_file_name,
)

_N_FIXED = len(FIXED_COLUMNS)
_FIXED_SET = frozenset(FIXED_NAMES)


class _Warner:
    """Warn once per kind of problem, so a failing disk does not flood the job's log."""

    def __init__(self, where: str):
        self.where = where
        self.seen: set[str] = set()

    def __call__(self, kind: str, message: str) -> None:
        if kind in self.seen:
            return
        self.seen.add(kind)
        warnings.warn(f"kforge_record ({self.where}): {message}", RuntimeWarning, stacklevel=2)


def _to_host(rows: list[tuple], warn: _Warner) -> tuple[list[list], dict[str, list]]:
    """Columns of Python values from buffered rows; device tensors copied in one batch per dtype.

    This is the only place the recorder touches tensor values, and it runs on the writer thread:
    ``torch.stack(...).cpu()`` here waits for the kernels that produced the values (blocking this
    thread, not the training thread).
    """
    fixed = [list(col) for col in zip(*[r[:_N_FIXED] for r in rows])] if rows else [[] for _ in FIXED_COLUMNS]
    extra_names: dict[str, None] = {}
    for r in rows:
        if r[_N_FIXED]:
            extra_names.update(dict.fromkeys(r[_N_FIXED]))
    extras = {name: [None] * len(rows) for name in extra_names if name not in _FIXED_SET}
    for name in extra_names:
        if name in _FIXED_SET:
            warn(f"reserved:{name}", f"scalar name {name!r} is reserved for a fixed column; its values are dropped")
    for i, r in enumerate(rows):
        if r[_N_FIXED]:
            for name, v in r[_N_FIXED].items():
                col = extras.get(name)
                if col is not None:
                    col[i] = v
    torch = sys.modules.get("torch")
    if torch is not None:
        _resolve_tensors(torch, list(FIXED_NAMES) + list(extras), fixed + list(extras.values()), warn)
    return fixed, extras


class Held:
    """A tensor kept by reference at end_step, with its version counter at that moment.

    Keeping a reference (not a copy) is what makes end_step free of syncs and kernel launches; the
    version counter tells us at flush time if the loop changed the tensor in place since.
    """

    __slots__ = ("tensor", "version")

    def __init__(self, tensor):
        self.tensor = tensor
        self.version = tensor._version


def _resolve_tensors(torch, names: list[str], columns: list[list], warn: _Warner) -> None:
    groups: dict[tuple, list[tuple[list, int]]] = {}
    for name, col in zip(names, columns):
        if Held not in set(map(type, col)):  # C-level scan: most columns hold plain numbers
            continue
        for i, v in enumerate(col):
            if type(v) is not Held:
                continue
            t = v.tensor
            if t._version != v.version:
                warn(f"inplace:{name}", f"the tensor logged as {name!r} was modified in place after end_step; "
                     "those values are recorded as null (log a .clone() of tensors you update in place)")
                col[i] = None
            elif t.numel() != 1:
                warn("shape", f"a tensor of shape {tuple(t.shape)} was logged as {name!r}; only 1-element tensors are recorded")
                col[i] = None
            elif t.device.type == "cpu":
                col[i] = t.item()
            else:
                col[i] = t
                groups.setdefault((t.device, t.dtype), []).append((col, i))
    synced = set()
    for (device, dtype), places in groups.items():
        if device not in synced:
            # The values may come from any CUDA stream of the loop; this thread's stream would not
            # wait for those. Waiting for the whole device here blocks only this writer thread.
            torch.cuda.synchronize(device)
            synced.add(device)
        # One kernel and one device-to-host copy per (device, dtype), whatever the row count.
        host = torch.stack([col[i].reshape(()) for col, i in places]).cpu().tolist()
        for (col, i), value in zip(places, host):
            col[i] = value


def _float_or_none(v, name: str, warn: _Warner):
    if v is None or type(v) is float:
        return v
    try:
        if isinstance(v, (str, bytes)):  # float("1.5") would parse it: a string is not a metric
            raise TypeError
        return float(v)
    except (TypeError, ValueError, OverflowError):
        warn(f"value:{name}", f"value {v!r} for {name!r} is not a number; recorded as null")
        return None


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _int_or_none(v, name: str, warn: _Warner):
    if v is None:
        return v
    try:
        if isinstance(v, (str, bytes)):
            raise TypeError
        if type(v) is int or isinstance(v, np.integer):
            i = int(v)
        else:
            f = float(v)
            if not f.is_integer():  # tokens=7.9 is a bug upstream, not 7 tokens
                raise ValueError
            i = int(f)
        if not _INT64_MIN <= i <= _INT64_MAX:
            raise OverflowError
        return i
    except (TypeError, ValueError, OverflowError):
        warn(f"value:{name}", f"value {v!r} for {name!r} is not a 64-bit integer; recorded as null")
        return None


# Types pyarrow converts exactly as we want, a whole column at a time in C; anything else
# (strings, tensors that could not be resolved, floats in an integer column) goes value by value.
_INTS = frozenset({type(None), int, np.int64, np.int32, np.int16, np.int8, np.uint8, np.uint16, np.uint32})
_FLOATS = _INTS | {float, bool, np.float64, np.float32, np.float16, np.bool_}


def _column(values: list, name: str, int64: bool, warn: _Warner) -> pa.Array:
    typ = pa.int64() if int64 else pa.float64()
    if set(map(type, values)) <= (_INTS if int64 else _FLOATS):
        try:
            return pa.array(values, type=typ)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            pass  # a value out of range: sorted out one by one below
    conv = _int_or_none if int64 else _float_or_none
    return pa.array([conv(v, name, warn) for v in values], type=typ)


def rows_to_table(rows: list[tuple], warn: _Warner) -> pa.Table:
    fixed, extras = _to_host(rows, warn)
    arrays = [_column(values, name, typ == "int64", warn) for (name, typ), values in zip(FIXED_COLUMNS, fixed)]
    arrays += [_column(values, name, False, warn) for name, values in extras.items()]
    return pa.Table.from_arrays(arrays, names=list(FIXED_NAMES) + list(extras))


class ShardWriter:
    """Owns one attempt directory and the thread that writes into it."""

    def __init__(self, attempt_dir: str, meta: dict, *, max_backlog_rows: int, where: str):
        self.attempt_dir = attempt_dir
        self.meta = meta
        self.max_backlog_rows = max_backlog_rows
        self.warn = _Warner(where)
        self._dropped_in_writer = 0
        self._dropped_in_inbox = 0  # updated under _inbox_lock by the training thread
        self.rows_written = 0
        self.parts_written = 0
        self.last_step: int | None = None
        self._backlog: list[pa.Table] = []
        self._next_part = 0
        # Rows travel through the inbox (a list of row lists, bounded by max_backlog_rows: a hung
        # write cannot make it grow); the queue only carries wake-ups and control messages.
        self._inbox: list[list[tuple]] = []
        self._inbox_rows = 0
        self._inbox_lock = threading.Lock()
        self._last_submitted: list[tuple] | None = None
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._stopped = threading.Event()
        self._lock = threading.Lock()  # one write at a time
        self._thread = threading.Thread(target=self._run, name="kforge-record-writer", daemon=True)
        self._thread.start()

    @property
    def dropped_rows(self) -> int:
        return self._dropped_in_writer + self._dropped_in_inbox

    # -- called from the training thread (or a signal handler on it) ---------------------------
    def submit(self, rows: list[tuple]) -> None:
        """Hand over a list of rows. Handing the same list twice (a signal handler that flushed
        while a hand-over was under way) is a no-op, so no row is ever written twice."""
        if not rows or rows is self._last_submitted or self._stopped.is_set():
            return
        self._last_submitted = rows
        with self._inbox_lock:
            self._inbox.append(rows)
            self._inbox_rows += len(rows)
            while self._inbox_rows > self.max_backlog_rows and len(self._inbox) > 1:
                old = self._inbox.pop(0)  # the writer is stuck: drop the oldest window, counted
                self._inbox_rows -= len(old)
                self._dropped_in_inbox += len(old)
        self._queue.put(("rows", None))

    def update_meta(self, meta: dict) -> None:
        self._queue.put(("meta", meta))

    def flush(self, rows: list[tuple], timeout: float | None) -> bool:
        """Hand over ``rows`` and wait until they are written (or have failed). True when done in time."""
        return self._request(rows, "sync", None, timeout)

    def close(self, rows: list[tuple], *, reason: str, timeout: float | None) -> bool:
        return self._request(rows, "close", reason, timeout)

    def _request(self, rows, kind, reason, timeout) -> bool:
        done = threading.Event()
        self.submit(rows)
        self._queue.put((kind, (reason, done)))
        # Wait, but give up at once if the writer has stopped (a close() won the race).
        deadline = None if timeout is None else time.monotonic() + timeout
        while not done.wait(0.05):
            if self._stopped.is_set() or (deadline is not None and time.monotonic() > deadline):
                return done.is_set() or self._stopped.is_set()
        return True

    def wait_closed(self, timeout: float | None) -> bool:
        return self._stopped.wait(timeout)

    # -- writer thread -----------------------------------------------------------------------
    def write_meta(self) -> None:
        os.makedirs(self.attempt_dir, exist_ok=True)
        write_json_atomic(os.path.join(self.attempt_dir, META_FILE), self.meta)

    def _drain_inbox(self) -> list[tuple]:
        with self._inbox_lock:
            batches, self._inbox, self._inbox_rows = self._inbox, [], 0
        return [row for batch in batches for row in batch]

    def _run(self) -> None:
        while True:
            messages = [self._queue.get()]
            while True:
                try:
                    messages.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            # Everything handed over so far goes out as one part file: while a slow write ran,
            # several windows may have arrived, and a slow disk then means bigger files.
            rows = self._drain_inbox()
            if rows:
                self._handle("rows", rows)
            for kind, payload in messages:
                if kind != "rows" and self._handle(kind, payload) == "stop":
                    self._stopped.set()
                    return

    def _bound(self, rows: list[tuple]) -> list[tuple]:
        """Rows waiting to be written never exceed max_backlog_rows: the oldest go first, counted."""
        waiting = len(rows) + sum(t.num_rows for t in self._backlog)
        excess = waiting - self.max_backlog_rows
        if excess <= 0:
            return rows
        self.warn("behind", f"more than {self.max_backlog_rows} rows waiting for the disk: dropping the oldest (counted)")
        self._trim_backlog(extra=len(rows))
        excess = len(rows) + sum(t.num_rows for t in self._backlog) - self.max_backlog_rows
        if excess > 0:
            self._dropped_in_writer += excess
            rows = rows[excess:]
        return rows

    def _handle(self, kind: str, payload):
        try:
            if kind == "rows":
                rows = self._bound(payload)
                try:
                    self._take(rows)
                except Exception as e:  # rows that cannot become a table are lost: count them
                    self._dropped_in_writer += len(rows)
                    self.warn(f"convert:{type(e).__name__}",
                              f"{len(rows)} rows could not be converted and were dropped (counted): {e!r}")
                self._write_backlog()
            elif kind == "meta":
                self.meta = payload
                self._guarded("meta", self.write_meta)
            elif kind == "sync":
                payload[1].set()
            elif kind == "close":
                reason, done = payload
                self._write_backlog()
                if self._backlog:  # the last try failed too: these rows are lost, and counted
                    self._dropped_in_writer += sum(t.num_rows for t in self._backlog)
                    self._backlog.clear()
                self._guarded("end", lambda: self._write_end(reason))
                if self.dropped_rows:
                    self.warn("dropped-final", f"{self.dropped_rows} rows were dropped in all "
                              "(write errors, a stuck disk or unconvertible values)")
                done.set()
                return "stop"
        except Exception as e:  # never let the thread die: later flushes must still run
            self.warn(f"internal:{type(e).__name__}", f"unexpected error while recording: {e!r}")
            if kind in ("sync", "close"):
                payload[1].set()
            if kind == "close":
                return "stop"
        return None

    def _take(self, rows: list[tuple]) -> None:
        table = rows_to_table(rows, self.warn)
        if table.num_rows:
            self.last_step = table.column("step")[-1].as_py()
        self._backlog.append(table)

    def _trim_backlog(self, *, extra: int = 0) -> None:
        """Keep at most max_backlog_rows (with `extra` newer rows to come), dropping and counting the oldest."""
        excess = sum(t.num_rows for t in self._backlog) + extra - self.max_backlog_rows
        while excess > 0 and self._backlog:
            head = self._backlog[0]
            if head.num_rows <= excess:
                self._backlog.pop(0)
                self._dropped_in_writer += head.num_rows
                excess -= head.num_rows
            else:
                self._backlog[0] = head.slice(excess)
                self._dropped_in_writer += excess
                excess = 0
        if self.dropped_rows:
            self.warn("dropped", f"backlog over {self.max_backlog_rows} rows: dropping the oldest (counted, reported at close)")

    def _guarded(self, what: str, fn) -> bool:
        try:
            fn()
            return True
        except OSError as e:
            self.warn(
                f"oserror:{what}:{e.errno}",
                f"could not write {what} in {self.attempt_dir}: {e.strerror or e}; keeping rows and retrying at the next flush",
            )
            return False

    def _write_backlog(self) -> None:
        if not self._backlog:
            return
        with self._lock:
            table = pa.concat_tables(self._backlog, promote_options="default") if len(self._backlog) > 1 else self._backlog[0]
            if self._guarded("part file", lambda: self._write_part(table)):
                self._backlog.clear()
                self.rows_written += table.num_rows
                self.parts_written += 1
            else:
                self._trim_backlog()

    def _write_part(self, table: pa.Table) -> None:
        if not os.path.exists(os.path.join(self.attempt_dir, META_FILE)):
            self.write_meta()  # first write, or the directory vanished under us
        kv = {
            "schema_version": SCHEMA_VERSION,
            "rank": self.meta.get("rank"),
            "attempt_id": self.meta.get("attempt_id"),
            "dropped_rows_total": self.dropped_rows,
        }
        table = table.replace_schema_metadata({PARQUET_META_KEY: json.dumps(kv).encode()})
        name = part_file_name(self._next_part)
        path = os.path.join(self.attempt_dir, name)
        with atomic_path(path, tmp=os.path.join(self.attempt_dir, f".{name}.tmp")) as tmp:
            pq.write_table(table, tmp, compression="zstd")
        self._next_part += 1

    def _write_end(self, reason: str) -> None:
        write_json_atomic(
            os.path.join(self.attempt_dir, END_FILE),
            {
                "schema_version": SCHEMA_VERSION,
                "end_time": time.time(),
                "reason": reason,
                "rows_written": self.rows_written,
                "parts_written": self.parts_written,
                "dropped_rows_total": self.dropped_rows,
                "last_step": self.last_step,
            },
        )
