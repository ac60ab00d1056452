"""The hang watch: a rank that ends no step for ``hang_after_s`` seconds leaves its evidence.

A thread of its own (``kforge-record-hang``), waking once a second, reads the heartbeat's last
step time (heartbeat.py: the loop pays nothing more). When no step has ended for the threshold,
the rank on its own (no collective: the network may be the fault) writes once per stall, into
its attempt folder (docs/hangs.md, docs/CONTRACT.md):

* ``hang-N.json``: the last ended step, the phase it is in (and for how long), the Python stacks
  of all its threads, the threshold used;
* ``fr-hang-N-rank-R.pkl``: PyTorch's flight-recorder dump, when torch.distributed is initialised
  and ``TORCH_FR_BUFFER_SIZE`` (or ``TORCH_NCCL_TRACE_BUFFER_SIZE``) is set;
* the rows of every step it ended (a flush), which the kill that follows would lose.

A loop thread that holds the GIL (a C call that never releases it) stops this thread too. For
that case ``faulthandler.dump_traceback_later`` is kept armed to fire ``GRACE_S`` after the
threshold: CPython's C watchdog then writes every thread's stack into ``hang-stacks.txt``
without the GIL. It is re-armed from this thread only when its deadline comes within
``REARM_MARGIN_S`` (at most once a second), and cancelled while the evidence above is written.
faulthandler has one such timer per process: the first Recorder with the watch on owns it.

``hang_after_s=None`` (the default) is adaptive: ``max(FLOOR_S, STEP_FACTOR x`` the median step
time seen ``)``; a number fixes it; ``0`` turns the watch off. ``hang_allow_s`` (phase name ->
seconds) lets a known long phase (a checkpoint, an eval) run that long from its start, whatever the
threshold; the threshold then counts from the phase's end (or its allowance's), not from the step
before it: the watch reads the open phases' start times once a tick, the loop pays nothing. Never raises into training.
"""

from __future__ import annotations

import bisect
import contextlib
import faulthandler
import os
import sys
import threading
import time
import traceback
from collections import deque

from .atomic import atomic_write_bytes, write_json_atomic
from .schema import SCHEMA_VERSION, STACKS_FILE

FLOOR_S = 300.0  # the adaptive threshold's floor: slow first steps, evals and checkpoints stay under it
STEP_FACTOR = 10.0  # ... or this many median steps, when steps are slower than 30 s
TICK_S = 1.0  # how often the watch looks
GRACE_S = 2.0  # faulthandler fires this long after the threshold: the Python watch writes first when it can
REARM_MARGIN_S = 3.0  # re-arm faulthandler when its deadline comes this close
MAX_FRAMES = 200  # per thread, innermost kept
_faulthandler_owner: list = []  # the one HangWatch that arms faulthandler in this process


def evidence_name(n: int) -> str:
    return f"hang-{n}.json"


def fr_dump_name(n: int, rank: int) -> str:
    return f"fr-hang-{n}-rank-{rank}.pkl"


class HangWatch:
    """Watches one recorder's heartbeat; see the module doc. ``rec`` is the Recorder."""

    def __init__(self, rec, hang_after_s: float | None, allow: dict[str, float] | None = None):
        self._rec = rec
        self._fixed = hang_after_s
        self._allow = allow or {}
        self._dir = rec.attempt_dir
        self._warn = rec._warn
        self._loop_thread = threading.get_ident()  # the thread that built the recorder: the training loop's
        self._start = time.monotonic()
        self._seen_at = self._start  # when this watch last saw the heartbeat move (monotonic: a stall is
        # measured by this clock, never against the loop's step times, so a clock jump is no stall)
        self._seen_t = 0.0  # the heartbeat time last seen
        self._seen_step: int | None = None
        self._intervals: list[float] = []  # sorted step times observed (seconds per step), at most 256
        self._recent: deque = deque(maxlen=256)
        self._stalled_at = -1.0  # the _seen_at whose stall was written (once per stall)
        self._quiet_from = 0.0  # the latest end seen of an allowed phase (or of its allowance), monotonic
        self._n = 0
        self._armed_until = 0.0  # when (monotonic) the faulthandler timer fires; 0: not armed
        self._stacks = None
        self._stop = threading.Event()
        self._own_fh = False
        self._fh_lock = threading.Lock()  # arm/cancel vs a fork (below)
        self._fork_deadline = 0.0
        if not _faulthandler_owner:
            _faulthandler_owner.append(self)
            self._own_fh = self._open_stacks()
            if self._own_fh:
                self._arm(self.threshold() + GRACE_S, self._start)
        self._thread = threading.Thread(target=self._run, name="kforge-record-hang", daemon=True)
        self._thread.start()

    # -- threshold ----------------------------------------------------------------------------
    def threshold(self) -> float:
        if self._fixed is not None:
            return self._fixed
        if not self._intervals:
            return FLOOR_S
        return max(FLOOR_S, STEP_FACTOR * self._intervals[len(self._intervals) // 2])

    def _note_step(self, t: float, step: int) -> None:
        if self._seen_t and self._seen_step is not None and step > self._seen_step:
            per = (t - self._seen_t) / (step - self._seen_step)
            if len(self._recent) == self._recent.maxlen:
                old = self._recent[0]
                del self._intervals[bisect.bisect_left(self._intervals, old)]
            self._recent.append(per)
            bisect.insort(self._intervals, per)
        self._seen_t, self._seen_step = t, step

    # -- the thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(TICK_S):
            try:
                self.check(time.monotonic())
            except Exception as e:  # noqa: BLE001 - the watch must never take anything down
                self._warn(f"hang:{type(e).__name__}", f"the hang watch failed ({e!r}); it goes on")

    def check(self, now: float) -> bool:
        """One look at monotonic time ``now`` (the thread's, every TICK_S): True when it wrote a stall's evidence."""
        hb_step, hb_time = self._rec._hb_step, self._rec._hb_time
        t, step = hb_time[2], hb_step[1]
        if t and t != self._seen_t:
            self._note_step(t, step)
            self._seen_at = now
        last = self._seen_at  # no step yet: the first one counts from construction
        allowed = self._allowed_until(now) if self._allow else 0.0
        if allowed:  # an allowed phase is open: the threshold counts again from its end (seen a tick late at
            # most) or from the end of its allowance, not from the step before it
            self._quiet_from = max(self._quiet_from, min(now, allowed) + TICK_S)
        deadline = max(last, self._quiet_from) + self.threshold()
        if now < deadline:
            # faulthandler's timer: past an open allowed phase's allowance (its body may hold the GIL, and
            # this thread with it), else the stall deadline; moved in when an allowance ended early
            fh = max(deadline, allowed + self.threshold())
            if self._own_fh and (self._armed_until - now < REARM_MARGIN_S or self._armed_until > fh + GRACE_S + TICK_S):
                self._arm(fh + GRACE_S - now, now)
            return False
        if self._stalled_at == last:
            return False  # written already for this stall: once per stall
        self._stalled_at = last
        self._disarm()
        self._write(now - last, t or None, step if t else None)
        return True

    def allowance(self, name: str) -> float | None:
        """Seconds phase ``name`` may last (hang_allow_s); None: no allowance (phase.new_phase)."""
        return self._allow.get(name)

    def allowed_phase_entered(self, allow: float) -> None:
        """From the loop's thread, entering an allowed phase: faulthandler's timer past its allowance."""
        now = time.monotonic()
        until = now + allow + self.threshold() + GRACE_S
        if self._own_fh and until > self._armed_until:
            self._arm(until - now, now)

    def allowed_phase_left(self) -> None:
        """From the loop's thread, leaving an allowed phase: the threshold counts again from now."""
        self._quiet_from = max(self._quiet_from, time.monotonic())

    def _allowed_until(self, now: float) -> float:
        """The latest (monotonic) end of an allowance of an open phase named in hang_allow_s; 0: none."""
        t = time.perf_counter()  # (a Phase's _t0 is perf_counter time: converted to now's clock)
        try:
            return max((now - (t - p._t0) + self._allow[name] for name, p in list(self._rec._phase_objs.items())
                        if p._t0 and name in self._allow), default=0.0)
        except Exception:  # noqa: BLE001 - a dict changing under us: no allowance this tick
            return 0.0

    def _arm(self, timeout: float, now: float) -> None:
        with self._fh_lock:
            if not self._own_fh:
                return
            try:
                faulthandler.dump_traceback_later(timeout, repeat=False, file=self._stacks)
                self._armed_until = now + timeout
            except Exception as e:  # noqa: BLE001
                self._own_fh = False
                self._warn("hang-faulthandler", f"faulthandler could not be armed ({e!r}): a rank holding the GIL "
                           "will leave no stacks")

    def _disarm(self) -> None:
        with self._fh_lock:
            if self._own_fh and self._armed_until:
                with contextlib.suppress(Exception):
                    faulthandler.cancel_dump_traceback_later()
                self._armed_until = 0.0

    # A forked child inherits faulthandler's armed state but not its C thread: at exit CPython then
    # waits for that thread forever (3.11). So the timer is cancelled before every fork (a DataLoader's
    # workers) and re-armed after it in the parent: ~0.1 ms a fork (bench_hang_watch.py's re-arm).
    def before_fork(self) -> None:
        self._fh_lock.acquire()
        self._fork_deadline = self._armed_until
        if self._own_fh and self._armed_until:
            with contextlib.suppress(Exception):
                faulthandler.cancel_dump_traceback_later()
            self._armed_until = 0.0

    def after_fork_in_parent(self) -> None:
        self._fh_lock.release()
        if self._fork_deadline:
            now = time.monotonic()
            self._arm(max(0.1, self._fork_deadline - now), now)

    def after_fork_in_child(self) -> None:
        self._fh_lock = threading.Lock()
        self._own_fh = False
        self._stop.set()

    def _open_stacks(self) -> bool:
        """Open hang-stacks.txt (appended to by faulthandler only) with a header naming the loop thread."""
        try:
            self._stacks = open(os.path.join(self._dir, STACKS_FILE), "a", encoding="utf-8")  # noqa: SIM115
            self._stacks.write(f"# kforge hang stacks: rank {self._rec.rank}, loop thread 0x{self._loop_thread:016x}\n")
            self._stacks.flush()
            return True
        except OSError as e:
            self._warn("hang-stacks", f"could not open {STACKS_FILE} ({e!r}): a rank holding the GIL will leave no stacks")
            return False

    # -- the evidence -------------------------------------------------------------------------
    def _write(self, stalled_s: float, last_t: float | None, step: int | None) -> None:
        self._n += 1
        rec = self._rec
        phase, phase_s, open_phases = self._phase(time.perf_counter())
        doc = {
            "schema_version": SCHEMA_VERSION, "n": self._n, "rank": rec.rank, "pid": os.getpid(),
            "host": rec._meta.get("host"), "written_at": time.time(), "last_step": step, "last_step_time": last_t,
            "stalled_s": round(stalled_s, 3), "threshold_s": self.threshold(), "allow_s": self._allow or None,
            "adaptive": self._fixed is None, "phase": phase, "phase_s": phase_s, "open_phases": open_phases,
            "loop_thread": self._loop_thread, "threads": _threads(),
        }
        write_json_atomic(os.path.join(self._dir, evidence_name(self._n)), doc)
        self._fr_dump(self._n, rec.rank)
        self._flush_rows()

    def _phase(self, t_now: float) -> tuple[str | None, float | None, list[str]]:
        """(innermost open phase, seconds in it, every open phase outermost first): a Phase is open
        while its _t0 is set (phase.py clears it at exit)."""
        try:
            opened = sorted((p._t0, name) for name, p in list(self._rec._phase_objs.items()) if p._t0)
        except Exception:  # noqa: BLE001 - a dict changing under us: no phase rather than none at all
            return None, None, []
        if not opened:
            return None, None, []
        return opened[-1][1], round(t_now - opened[-1][0], 3), [n for _, n in opened]

    def _fr_dump(self, n: int, rank: int) -> None:
        if not (os.environ.get("TORCH_FR_BUFFER_SIZE") or os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE")):
            return
        dist = sys.modules.get("torch.distributed")
        try:
            if dist is None or not dist.is_available() or not dist.is_initialized():
                return
            data = sys.modules["torch"]._C._distributed_c10d._dump_fr_trace()
            atomic_write_bytes(os.path.join(self._dir, fr_dump_name(n, rank)), bytes(data))
        except Exception as e:  # noqa: BLE001
            self._warn("hang-fr", f"the flight-recorder dump failed ({e!r}); the stall's other evidence is written")

    def _flush_rows(self) -> None:
        """Hand the buffered rows to the writer (the recorder's lock for at most a second: the loop
        may hold it) and wait for the write."""
        rec = self._rec
        if not rec._lock.acquire(timeout=1.0):
            return
        try:
            if rec._closed:
                return
            rec._writer.submit(rec._rows)
            rec._rows = []
        finally:
            rec._lock.release()
        rec._writer.flush([], 30.0)

    def close(self) -> None:
        """Stop the thread and faulthandler's timer; an empty stacks file goes."""
        self._stop.set()
        if self._own_fh:
            self._disarm()
            _faulthandler_owner.clear()
            with contextlib.suppress(Exception):
                path = self._stacks.name
                self._stacks.close()
                with open(path, "rb") as f:
                    only_header = f.read(4096).count(b"\n") <= 1 and not f.read(1)
                if only_header:
                    os.remove(path)
            self._own_fh = False

    def forked(self) -> None:
        """In a forked child (the recorder's at-fork hook): this thread is not there, nor the timer."""
        self._stop.set()
        self._own_fh = False


def _before_fork() -> None:
    for w in _faulthandler_owner:
        w.before_fork()


def _after_fork_in_parent() -> None:
    for w in _faulthandler_owner:
        w.after_fork_in_parent()


def _after_fork_in_child() -> None:
    for w in _faulthandler_owner:
        w.after_fork_in_child()
    _faulthandler_owner.clear()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)


def _threads() -> list[dict]:
    """Every thread's Python stack, innermost frame last: ``{"id", "name", "daemon", "frames": [[file, line, func]]}``."""
    names = {t.ident: t for t in threading.enumerate()}
    me = threading.get_ident()
    out = []
    for ident, frame in sys._current_frames().items():
        if ident == me:
            continue
        t = names.get(ident)
        frames = [[f.filename, f.lineno, f.name] for f in traceback.extract_stack(frame)][-MAX_FRAMES:]
        out.append({"id": ident, "name": t.name if t else None, "daemon": t.daemon if t else None, "frames": frames})
    return out
