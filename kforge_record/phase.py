"""Phase timers: ``with rec.phase("data"):`` adds the time spent inside to the step's ``time/data_s``.

A timer's exit appends ``(column, seconds)`` to the recorder's one pending list, a single
``list.append`` (atomic, in CPython with or without a GIL), and takes no lock. ``end_step`` takes
what is pending with a copy and then a delete of exactly that many entries from the front, so an
exit on another thread in between lands in the next step, never nowhere and never twice; a token
(``take_pending``, not a lock) keeps two end_steps from taking the same entries. The
writer thread sums a step's entries per column (convert.py).
"""

from __future__ import annotations


class Phase:
    """A reusable timer for one named phase; time spent inside adds up within a step."""

    __slots__ = ("_pending", "_key", "_clock", "_t0")

    def __init__(self, pending: list, key: str, clock):
        self._pending = pending  # the recorder's list: the same object for its whole life
        self._key = key
        self._clock = clock  # the recorder's perf_counter (tests put a fake clock there)
        self._t0 = 0.0

    def __enter__(self):
        self._t0 = self._clock()
        return self

    def __exit__(self, et, ev, tb):
        self._pending.append((self._key, self._clock() - self._t0))
        self._t0 = 0.0  # closed: the hang watch (hang.py) tells an open phase by a set _t0
        return False


class AllowedPhase(Phase):
    """A phase named in ``hang_allow_s``: it tells the hang watch (hang.py) when it is entered (faulthandler's
    timer pushed past its allowance: its body may hold the GIL, a checkpoint's pickling, and the watch's
    thread with it) and left (the stall threshold counts again from there). Only these phases pay for it;
    a failing call times the phase all the same."""

    __slots__ = ("_watch", "_allow")

    def __init__(self, pending: list, key: str, clock, watch, allow: float):
        super().__init__(pending, key, clock)
        self._watch = watch
        self._allow = allow

    def __enter__(self):
        try:
            self._watch.allowed_phase_entered(self._allow)
        except Exception:  # noqa: BLE001 - never into the loop
            pass
        return super().__enter__()

    def __exit__(self, et, ev, tb):
        super().__exit__(et, ev, tb)
        try:
            self._watch.allowed_phase_left()
        except Exception:  # noqa: BLE001
            pass
        return False


def new_phase(pending: list, key: str, clock, watch, name: str) -> Phase:
    """The timer for phase ``name``: an AllowedPhase where the hang watch ``watch`` (None: off) allows it."""
    allow = watch.allowance(name) if watch is not None else None
    return Phase(pending, key, clock) if allow is None else AllowedPhase(pending, key, clock, watch, allow)


class NoPhase:
    """What ``phase()`` gives for a name it refuses: times nothing, never raises."""

    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, et, ev, tb):
        return False


NO_PHASE = NoPhase()


def take_pending(pending: list, taker: list) -> list | None:
    """The phase times pending now, taken off ``pending``: a copy, then exactly that many off the front.
    The one token in ``taker`` makes it exclusive without a lock (list.pop is atomic, with or without a
    GIL): an end_step on another thread (or in a signal handler) meanwhile takes none (None), and they
    land in its next. Cold, 3 phases: 23.2 µs a step, 25.8 with the lock: bench_record_cold.py --ref 63d8c82"""
    try:
        taker.pop()
    except IndexError:
        return None
    try:
        phases = pending[:]
        del pending[:len(phases)]
    finally:  # a KeyboardInterrupt in between: the token still goes back
        taker.append(None)
    return phases
