"""The hand-over between the training thread and the writer thread, with its two bounds.

* Back-pressure: when more than ``lag_rows`` rows are handed over and not yet processed by the
  writer (waiting here, or taken and being converted/written), ``put`` waits until the writer is
  back under it. A loop faster than the writer (back-to-back ``end_step``, very wide rows) thus
  runs at the writer's speed and loses nothing, and a SIGKILL loses at most those ``lag_rows``
  plus the window being filled.
* A stuck writer: one that has been on the same batch for ``stall_s`` seconds (a hung
  filesystem) is not waited for again until it finishes something; rows then queue here, at
  most ``max_rows`` of them, and older batches beyond that are dropped and counted.
"""

from __future__ import annotations

import collections
import threading
import time

from .warn import Warner

WARN_AFTER_WAIT_S = 1.0


class Inbox:
    def __init__(self, *, lag_rows: int, max_rows: int, stall_s: float, warn: Warner):
        self.lag_rows = lag_rows
        self.max_rows = max_rows
        self.stall_s = stall_s
        self._warn = warn
        # Re-entrant: a SIGTERM handler runs on the main thread, possibly inside put().
        self._cond = threading.Condition(threading.RLock())
        self._batches: list[tuple[list[tuple], int]] = []  # (rows, how many put() counted)
        # end_step appends without a lock, so a thread that read the recorder's buffer just before a
        # hand-over swapped it may append to that list after it was handed over, and taken. It sees the
        # swap after its append and hands the list in again (``late``): looked at again at the next take,
        # however many takes ago it was taken. Not seen (the swap came after its check, so its append came
        # before the swap, which follows the list's put), its row is in a list put already: waiting
        # here, or taken since with no other list put after it (a put needs the hand-over's lock, held
        # from that put to the swap), so the newest lists taken are all the next take must look at
        # again. A few are kept (``_taken``): only a writer that is stuck while puts drop the oldest
        # batches (each dropped list goes here too) could push one out, and those rows are dropped anyway.
        self._taken: collections.deque[list[tuple]] = collections.deque(maxlen=16)
        self._late: list[list[tuple]] = []  # lists handed in again by ``late`` since the last take
        self.waiting_rows = 0  # here, not yet taken by the writer
        self.pending_rows = 0  # here + taken and not yet done
        self._busy_since = time.monotonic()  # when the writer last took or finished a batch
        self.dropped = 0
        self.waited_s = 0.0  # total time put() waited for the writer

    # -- training thread -------------------------------------------------------------------
    def put(self, rows: list[tuple]) -> None:
        with self._cond:
            if not self.pending_rows:  # the writer was idle: the stall clock starts now
                self._busy_since = time.monotonic()
            self._batches.append((rows, len(rows)))
            self.waiting_rows += len(rows)
            self.pending_rows += len(rows)
            if self.pending_rows > self.lag_rows:
                self._wait_for_writer()
            self._drop_oldest_past_bound()

    def _wait_for_writer(self) -> None:
        t0 = time.monotonic()
        while self.pending_rows > self.lag_rows:
            busy_for = time.monotonic() - self._busy_since
            if busy_for >= self.stall_s:
                self._warn("stuck", f"the writer thread has been on one write for {busy_for:.1f} s (a hung filesystem?): "
                           f"end_step no longer waits for it; up to {self.max_rows} rows queue, older ones are "
                           "dropped (counted, reported at close)")
                break
            self._cond.wait(self.stall_s - busy_for)
        self.waited_s += time.monotonic() - t0
        if self.waited_s >= WARN_AFTER_WAIT_S:  # short waits are normal back-pressure, not news
            self._warn("behind", f"the writer thread is behind (rows arrive faster than it converts and writes them): "
                       f"end_step has waited {self.waited_s:.1f} s for it so far, each time {self.lag_rows} rows were "
                       "pending; nothing is dropped (the total wait is in end.json, writer_wait_s)")

    def _drop_oldest_past_bound(self) -> None:
        while self.waiting_rows > self.max_rows and len(self._batches) > 1:
            old, n = self._batches.pop(0)
            del old[:n]  # the writer never takes them (rows appended later stay, for the next take)
            self._taken.append(old)
            self.waiting_rows -= n
            self.pending_rows -= n
            self.dropped += n

    def late(self, rows: list[tuple]) -> None:
        """``rows``, handed over before, got a row after (Recorder.end_step saw its buffer swapped): its
        rows not taken yet are taken at the next take (a list taken twice gives its rows once)."""
        with self._cond:
            self._late.append(rows)

    # -- writer thread ---------------------------------------------------------------------
    def take(self) -> list[tuple]:
        """Every row handed over so far, oldest first (one part file: a slow write means bigger parts)."""
        with self._cond:
            batches, self._batches, self.waiting_rows = self._batches, [], 0
            self._busy_since = time.monotonic()
            taken = (*self._taken, *self._late)
            self._late = []
            self._taken.extend(batch for batch, _ in batches)
        rows: list[tuple] = []
        counted = sum(n for _, n in batches)  # what put() counted: waiting_rows and pending_rows hold these
        for batch in (*taken, *(batch for batch, _ in batches)):
            # Copy, then exactly that many off the front: a row appended in between stays for the
            # next take. The training thread keeps the last list it handed over (ShardWriter.submit,
            # to know it again): emptied here, its rows (and the tensors they hold) are freed by this
            # thread once written, not by end_step at the next hand-over: 500 held tensors of a
            # 100-step window cost that end_step 18 µs. Empty, it is still ignored if handed again.
            if batch:
                n = len(batch)
                rows += batch[:n]
                del batch[:n]
        if len(rows) != counted:  # late rows (see _taken): counted now, so that done() balances
            with self._cond:
                self.pending_rows += len(rows) - counted
        return rows

    def done(self, n: int) -> None:
        """The writer finished ``n`` taken rows (written, kept for a retry, or dropped)."""
        with self._cond:
            self.pending_rows -= n
            self._busy_since = time.monotonic()
            self._cond.notify_all()
