"""The recorder's lock-free fast path: the one thread that calls it goes without the lock.

Taking and releasing an uncontended ``threading.RLock`` costs 0.3 µs on this project's machines
(a fifth of ``end_step``), and nearly every training loop calls its recorder from one thread. So
the first thread to call ``end_step`` or ``log`` owns the recorder (``_owner``), and while it is
the only one (``_solo`` is its ident) its calls take no lock. The first call from any other
thread ends that for good: from then on every call takes the lock. (Phase timers take no part:
they append to a list, see phase.py.)

The hand-over, race-free under the GIL (where a thread's reads and writes of attributes happen
in program order, one thread at a time):

* the owner, on the fast path (``end_step``, ``log``): saves and sets ``_busy``, then reads
  ``_solo`` again; still its own: it runs the call unlocked and puts ``_busy`` back after
  (``finally``); cleared: it puts ``_busy`` back and takes the lock;
* another thread: clears ``_solo`` (under the lock, so that two first callers cannot both
  claim), then reads ``_busy`` and, while it is set, waits for the owner's call in flight; then
  it takes the lock. (Dekker's handshake: each writes its flag before it reads the other's, so at
  least one sees the other's write: either the owner takes the lock or the other thread waits
  for the owner's call to end; never both unlocked.)

``_busy`` is saved and put back, not just cleared, so that a call nested in the owner's own call
(a signal handler, a warning hook) leaves it set for the outer one. The owner never waits for
itself: a SIGTERM handler that flushes inside the owner's call takes the lock and goes on, as it
did when every call took the (re-entrant) lock. Without a GIL (free-threaded builds) nobody gets
the fast path. tests/test_record_threads.py holds each step of this open in turn.
"""

from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from threading import get_ident
from time import perf_counter

WAIT_POLL_S = 0.0001


def gil_enabled() -> bool:
    is_enabled = getattr(sys, "_is_gil_enabled", None)
    return True if is_enabled is None else bool(is_enabled())


def lock_for(rec, busy, *, claim: bool = True) -> threading.RLock:
    """``rec``'s lock, acquired, for a call off the fast path, after the hand-over above.

    ``busy``: the owner's saved ``_busy`` when it lost the fast path between its two checks (put
    back here), else None. ``claim``: a first call makes its thread the owner (end_step, log and
    claim; flush and close do not, so that a flush from the main thread does not
    take the fast path from a training thread that has not called yet)."""
    me = get_ident()
    if busy is not None:
        rec._busy = busy
    if rec._owner is None or (rec._solo is not None and rec._owner != me):
        with rec._lock:
            if rec._owner is None and claim:
                rec._owner = me
                rec._solo = me if gil_enabled() else None
            elif rec._owner != me:
                rec._solo = None  # a second thread: every call takes the lock from now on
    if rec._owner != me and rec._busy:
        _wait_for_owner(rec)
    lock = rec._lock
    lock.acquire()
    return lock


@contextmanager
def locked(rec, *, claim: bool = False):
    """``with locked(rec):`` for the calls that always take the lock (flush, close)."""
    lock = lock_for(rec, None, claim=claim)
    try:
        yield
    finally:
        lock.release()


def _wait_for_owner(rec) -> None:
    """Wait while the owner's unlocked call is in flight (microseconds; at most the back-pressure
    wait of a hand-over). Bounded, so that a call can never hang on a thread stuck elsewhere."""
    deadline = perf_counter() + rec._close_timeout_s
    while rec._busy and perf_counter() < deadline:
        time.sleep(WAIT_POLL_S)
    if rec._busy:
        rec._warn("owner-busy", f"the recorder's owning thread stayed inside one call for {rec._close_timeout_s}s; "
                  "another thread's call goes on without waiting for it")
