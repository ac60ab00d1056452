"""The writer thread: everything that touches the disk, off the training thread.

The training thread only hands over lists of rows (``submit``, through the ``Inbox``). A single
daemon thread converts them (``convert.rows_to_table``) and writes each batch as one complete
Parquet file, published under a name no other file has (temp name, fsync, exclusive link, fsync
dir). Write failures never propagate: rows stay in a bounded backlog and are retried at the
next flush; past the bound the oldest rows are dropped and counted.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq

from . import env
from .atomic import atomic_path, write_json_atomic
from .compact import Compactor
from .convert import rows_to_table
from .hw import HwSampler
from .inbox import Inbox
from .leftovers import clean_attempt_dir, clean_rank_dir
from .schema import END_FILE, META_FILE, PARQUET_META_KEY, SCHEMA_VERSION, is_part_file, part_file_name, taken_attempt_id
from .warn import Warner

# A writer on the same batch this long is taken as stuck (a hung filesystem): the loop stops
# waiting for it (see inbox.py). A healthy write of a few windows takes milliseconds.
STALL_S = 2.0


def claim_attempt_dir(rank_dir: str, attempt_id: str, *, pid: int, stamp: str) -> str:
    """Create this process's attempt folder and return its name. ``mkdir`` is the claim: exactly one
    process gets a given name, so two processes that both believe they are the same rank of one
    launch (a misconfigured launcher) get a folder each and never write into each other's."""
    os.makedirs(rank_dir, exist_ok=True)
    for n in range(1000):
        name = attempt_id if n == 0 else taken_attempt_id(attempt_id, pid, stamp, n - 1)
        try:
            os.mkdir(os.path.join(rank_dir, name))
            return name
        except FileExistsError:
            continue
    raise FileExistsError(f"{rank_dir}: could not claim an attempt folder for {attempt_id}")


class ShardWriter:
    """Owns one attempt directory and the thread that writes into it."""

    def __init__(self, attempt_dir: str, meta: dict, *, max_backlog_rows: int, lag_rows: int, where: str,
                 merge_parts: bool = True, hw_every_s: float = 0.0):
        self.attempt_dir = attempt_dir
        self.meta = meta
        self.max_backlog_rows = max_backlog_rows
        self.warn = Warner(where)
        self._compactor = Compactor(attempt_dir, self.warn, enabled=merge_parts)  # bounded files per folder
        # GPU telemetry, sampled on a thread of its own (a hung NVML call must not stop the writes: hw.py)
        self._hw = HwSampler(hw_every_s, self.warn, self._device, rank=meta.get("rank"))
        self._dropped = {"disk": 0, "unconvertible": 0, "rejected": 0}  # "stuck" is the inbox's
        self.rows_written = 0
        self.parts_written = 0
        self.last_step: int | None = None
        self._backlog: list[pa.Table] = []  # converted rows whose write failed, retried next flush
        self._next_part = 0
        self.inbox = Inbox(lag_rows=lag_rows, max_rows=max_backlog_rows, stall_s=STALL_S, warn=self.warn)
        self._last_submitted: list[tuple] | None = None
        self._queue: queue.SimpleQueue = queue.SimpleQueue()  # wake-ups and control messages
        self._stopped = threading.Event()
        self._handlers = {"meta": self._on_meta, "sync": self._on_sync, "close": self._on_close, "tidy": self._on_tidy}
        self._thread = threading.Thread(target=self._run, name="kforge-record-writer", daemon=True)
        self._queue.put(("tidy", None))  # first: what killed merges left in earlier attempts of this rank
        self._thread.start()
        self._hw.start()

    @property
    def dropped_rows(self) -> int:
        return sum(self._dropped.values()) + self.inbox.dropped

    def dropped_by_reason(self) -> dict[str, int]:
        return {**self._dropped, "stuck": self.inbox.dropped}

    # -- called from the training thread (or a signal handler on it) ---------------------------
    def submit(self, rows: list[tuple]) -> None:
        """Hand over a list of rows. Handing the same list twice (a signal handler that flushed
        while a hand-over was under way) is a no-op, so no row is ever written twice."""
        if not rows or rows is self._last_submitted or self._stopped.is_set():
            return
        self._last_submitted = rows
        self.inbox.put(rows)
        self._queue.put(("rows", None))

    def count_rejected(self, n: int) -> None:
        """Rows refused at the call (a bad step): never written, counted with the dropped ones."""
        self._dropped["rejected"] += n

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

    def _run(self) -> None:
        while True:
            messages = [self._queue.get()]
            while True:
                try:
                    messages.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            self._write_inbox()
            for kind, payload in messages:
                if kind != "rows" and self._guard_thread(kind, payload):
                    self._stopped.set()
                    return

    def _write_inbox(self) -> None:
        """Everything handed over so far goes out as one part file: while a slow write ran, several
        windows may have arrived, and a slow disk then means bigger files."""
        rows = self.inbox.take()
        if not rows:
            return
        try:
            self._guard_thread("rows", rows)
        finally:
            self.inbox.done(len(rows))

    def _guard_thread(self, kind: str, payload) -> bool:
        """Run one message's handler; True when the thread is to stop. Never lets the thread die:
        later flushes must still run."""
        try:
            if kind == "rows":
                self._on_rows(payload)
                return False
            return self._handlers[kind](payload)
        except Exception as e:
            self.warn(f"internal:{type(e).__name__}", f"unexpected error while recording: {e!r}")
            if kind in ("sync", "close"):
                payload[1].set()
            return kind == "close"

    def _device(self) -> tuple[bool, int | None, int | None]:
        """(uses CUDA, its device index, local rank): which GPU the telemetry samples (hw.py)."""
        dev = self.meta.get("device") or {}
        cuda = dev.get("type") == "cuda" or env.cuda_in_use()
        return cuda, dev.get("index"), self.meta.get("local_rank")

    def _on_rows(self, rows: list[tuple]) -> None:
        rows = self._bound(self._hw.attach(rows))
        try:
            self._take(rows)
        except Exception as e:  # rows that cannot become a table are lost: count them
            self._dropped["unconvertible"] += len(rows)
            self.warn(f"convert:{type(e).__name__}", f"{len(rows)} rows could not be converted and were dropped (counted): {e!r}")
        self._write_backlog()

    def _on_meta(self, meta: dict) -> bool:
        self.meta = meta
        self._guarded("meta", self.write_meta)
        return False

    def _on_tidy(self, _payload) -> bool:
        # Earlier attempts' folders only: this one is new (leftovers.py says what goes, and when).
        clean_rank_dir(os.path.dirname(self.attempt_dir), own=os.path.basename(self.attempt_dir), warn=self.warn)
        return False

    def _on_sync(self, payload) -> bool:
        payload[1].set()
        return False

    def _on_close(self, payload) -> bool:
        reason, done = payload
        tail = self._hw.drain()  # telemetry read after the last rows: on the last step
        if tail:
            self._on_rows(tail)
        self._write_backlog()
        # A replaced part this writer failed to remove (compact.py). Temp files stay: another
        # writer in this folder (a name found taken) may own one.
        clean_attempt_dir(self.attempt_dir, warn=self.warn, writer_gone=False)
        if self._backlog:  # the last try failed too: these rows are lost, and counted
            self._dropped["disk"] += sum(t.num_rows for t in self._backlog)
            self._backlog.clear()
        self._guarded("end", lambda: self._write_end(reason))
        if self.dropped_rows:
            self.warn("dropped-final", f"{self.dropped_rows} rows were dropped in all {self.dropped_by_reason()}")
        done.set()
        return True

    def _bound(self, rows: list[tuple]) -> list[tuple]:
        """Rows waiting for a failing disk never exceed max_backlog_rows: the oldest go first, counted.
        (Rows arriving while nothing failed are bounded by the inbox, not here.)"""
        excess = len(rows) + sum(t.num_rows for t in self._backlog) - self.max_backlog_rows
        if not self._backlog or excess <= 0:
            return rows
        self._trim_backlog(extra=len(rows))
        excess = len(rows) + sum(t.num_rows for t in self._backlog) - self.max_backlog_rows
        if excess > 0:
            self._dropped["disk"] += excess
            rows = rows[excess:]
        return rows

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
            n = min(head.num_rows, excess)
            self._backlog[0:1] = [] if n == head.num_rows else [head.slice(n)]
            self._dropped["disk"] += n
            excess -= n
        if self._dropped["disk"]:
            self.warn("dropped", f"more than {self.max_backlog_rows} rows wait for a disk that fails: "
                      "dropping the oldest (counted, reported at close)")

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
        table = pa.concat_tables(self._backlog, promote_options="default") if len(self._backlog) > 1 else self._backlog[0]
        path = []
        if self._guarded("part file", lambda: path.append(self._write_part(table))):
            self._backlog.clear()
            self.part_written(path[0], table)
        else:
            self._trim_backlog()

    def part_written(self, path: str, table: pa.Table) -> None:
        """Called once after every part file published (``path``, durable, holding ``table``): the
        one place to hook work that follows a write."""
        self.rows_written += table.num_rows
        self.parts_written += 1
        self._compactor.part_written(self._next_part - 1, table.num_rows, table)  # merges; never raises

    def _write_part(self, table: pa.Table) -> str:
        if not os.path.exists(os.path.join(self.attempt_dir, META_FILE)):
            self.write_meta()  # first write, or the directory vanished under us
        kv = {
            "schema_version": SCHEMA_VERSION,
            "rank": self.meta.get("rank"),
            "attempt_id": self.meta.get("attempt_id"),
            "dropped_rows_total": self.dropped_rows,
        }
        table = table.replace_schema_metadata({PARQUET_META_KEY: json.dumps(kv).encode()})
        while True:
            name = part_file_name(self._next_part)
            path = os.path.join(self.attempt_dir, name)
            try:
                with atomic_path(path, tmp=os.path.join(self.attempt_dir, f".{name}.tmp"), exclusive=True) as tmp:
                    # No dictionary pages: metrics rarely repeat, and with hundreds of columns the
                    # dictionary attempt is a third of the write time.
                    pq.write_table(table, tmp, compression="zstd", use_dictionary=False)
            except FileExistsError:  # never overwrite a part file, whoever wrote it
                self.warn("part-taken", f"{path} exists already (another writer in this folder?): "
                          "left as it is, rows written under the next free name")
                self._next_part = self._next_free_index()
                continue
            self._next_part += 1
            return path

    def _next_free_index(self) -> int:
        taken = [int(n[len("part-"):-len(".parquet")]) for n in os.listdir(self.attempt_dir)
                 if is_part_file(n) and n[len("part-"):-len(".parquet")].isdigit()]
        return max([self._next_part, *taken]) + 1

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
                "dropped_rows_by_reason": self.dropped_by_reason(),
                "writer_wait_s": round(self.inbox.waited_s, 6),
                "last_step": self.last_step,
            },
        )
