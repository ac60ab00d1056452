"""GPU telemetry of this rank's own GPU, sampled on a daemon thread of its own, never in ``end_step``.

Every ``hw_every_s`` seconds the sampling thread ("kforge-record-hw", started only when
``hw_every_s > 0``) reads NVML (the optional ``nvidia-ml-py`` package, ``pip install kforge[gpu]``,
imported here lazily) for this rank's GPU: utilisation, temperature, power, SM clock and the
clock-throttle reasons bitmask. It hands each reading (wall time, values) over under a lock that it
never holds inside an NVML call. The writer thread places it on the step that had ended when it was
taken (the last ``end_step`` row whose ``time`` is at or before it): its values go into that row as
the columns of ``HW_COLUMNS``. That row may still be in the training thread's buffer when the
reading is taken, so a reading waits here until a row that ended after it arrives (or the writer
closes); when the step it belongs to was written already, it goes out as a row of its own for that
step, which ingest coalesces into the step's row (like a ``Recorder.log`` row). Several readings of
one step keep the last. Null elsewhere, and on machines without NVML.

Not on the writer thread, on purpose: NVML hangs on sick nodes (a GPU off the bus); there it stops every flush, then the loop.
A reading whose NVML calls have not returned after ``hang_bound_s`` is given up: the writer warns
once and takes no more readings from the thread, and close() waits for it at most ``JOIN_S`` (a
daemon: a hung one dies with the process). Readings handed over before are kept.

It samples only once the process uses CUDA (a CPU job has no GPU of its own; asked again at each
due time until it does). Without NVML then (package missing, no driver) it turns itself off with
one warning. A reading that fails (a field the GPU does not support) is null, warned once per field.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from .schema import HW_COLUMNS
from .warn import Warner

_N_FIXED = 10  # the fixed columns of a buffered row, then its scalars and its phases (convert.py)
# Readings waiting for a row that ended after them: a loop that stops ending steps (a hang, a long
# eval) would pile them up, all for the same step, where only the last is kept anyway.
MAX_PENDING = 256
# A healthy NVML call takes milliseconds, nvmlInit up to a few seconds (a node without persistence
# mode loads the driver state of every GPU): 10 s is well past that. And a call longer than two
# sampling intervals has cost two readings already, so a slow interval never looks hung by itself.
HANG_S = 10.0
# What close() waits for a reading under way (a healthy one is done in milliseconds).
JOIN_S = 1.0


def hang_bound_s(every_s: float) -> float:
    """Seconds after which one NVML call still under way is taken as hung."""
    return max(HANG_S, 2 * every_s)


class HwSampler:
    """Samples one GPU every ``every_s`` seconds (0: never) on a thread of its own (``start``); the
    writer thread places the readings on rows (``attach``, and ``drain`` at close)."""

    def __init__(self, every_s: float, warn: Warner, device_of, *, rank: int | None = None):
        self.every_s = every_s
        self._warn = warn
        self._device_of = device_of  # () -> (uses CUDA, its device index or None, local rank or None)
        self._rank = rank
        self._nvml = None
        self._handle = None
        self._state = "off" if not every_s else "new"  # the sampling thread's: new -> on | off
        self._lock = threading.Lock()  # guards _pending and _gave_up; never held inside an NVML call
        self._pending: list[tuple[float, dict]] = []  # (wall time, values), oldest first
        self._gave_up = False  # a call hung: no more readings are taken from the thread
        self._call_since: float | None = None  # monotonic start of the reading's NVML calls under way (None: none)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last: tuple[int, float] | None = None  # (step, time) of the last end_step row seen
        self.samples = 0

    # -- the sampling thread ------------------------------------------------------------------
    def start(self) -> None:
        """Start the sampling thread (only when sampling is on; once)."""
        if self.every_s and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="kforge-record-hw", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        due = time.monotonic() + self.every_s
        while not self._stop.wait(max(0.0, due - time.monotonic())):
            due = time.monotonic() + self.every_s  # a late reading is not made up for by a burst
            if not self.sample():
                return

    def sample(self) -> bool:
        """Take one reading now, on the calling thread (never raises). False once telemetry is off."""
        try:
            self._call_since = time.monotonic()
            try:
                if self._state == "new":
                    self._start()
                values = self._read() if self._state == "on" else None
            finally:
                self._call_since = None
            if values:
                with self._lock:  # stamped and handed over at once: attach() sees readings in time order
                    if self._gave_up or self._stop.is_set():
                        return False
                    self._pending.append((time.time(), values))
                    self.samples += 1
                    if len(self._pending) > MAX_PENDING:
                        del self._pending[0]
        except Exception as e:  # the sampling thread must end quietly
            self._warn(f"hw:{type(e).__name__}", f"GPU telemetry failed and is off ({e!r})")
            self._state = "off"
        return self._state != "off" and not self._gave_up

    def _start(self) -> None:
        """NVML on this rank's GPU, once the process uses CUDA (until then: asked again next time)."""
        uses_cuda, index, local_rank = self._device_of()
        if not uses_cuda:
            return
        try:
            nvml = sys.modules.get("pynvml")
            if nvml is None:
                import pynvml as nvml  # nvidia-ml-py: kforge[gpu]
            nvml.nvmlInit()
            # The device the loop used (meta.json); unknown (memory sampling off): the launcher's local rank
            self._handle = _handle(nvml, index if index is not None else local_rank)
            self._nvml, self._state = nvml, "on"
        except Exception as e:  # ImportError, NVMLError (no driver, no such GPU): said once
            self._state = "off"
            self._warn("hw:off", f"GPU telemetry is off: NVML is not usable here ({type(e).__name__}: {e}); "
                       "pip install 'kforge[gpu]' (nvidia-ml-py) to record the hw/ columns, or hw_every_s=0")

    def _read(self) -> dict:
        nvml, h = self._nvml, self._handle
        reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        getters = (
            lambda: float(nvml.nvmlDeviceGetUtilizationRates(h).gpu),
            lambda: float(nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)),
            lambda: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0,  # mW
            lambda: float(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)),
            lambda: int(reasons(h)),
        )
        out = {}
        for name, get in zip(HW_COLUMNS, getters):
            try:
                out[name] = get()
            except Exception as e:  # not supported on this GPU: that column stays null
                self._warn(f"hw:{name}", f"GPU telemetry: {name} cannot be read here ({type(e).__name__}: {e}); recorded as null")
        return out

    # -- the writer thread: placing readings on rows --------------------------------------------
    def attach(self, rows: list[tuple]) -> list[tuple]:
        """``rows`` (the next ones to write, in order) with each pending reading placed on the
        step that had ended when it was taken; rows of their own for steps written already."""
        self._check_hung()
        with self._lock:  # readings handed over later were stamped after every row here ended
            pending, self._pending = self._pending, []
        if not pending:
            if self.every_s:
                self._note_last(rows)
            return rows
        joined: dict[int, dict] = {}  # index in rows -> the last reading that belongs to it
        extra: dict[int, tuple] = {}
        placed, last_i = 0, None  # last_i: the last end_step row of this batch seen (None: self._last)
        for i, row in enumerate(rows):
            if row[2] is None:  # a Recorder.log row: it ends no step
                continue
            while placed < len(pending) and pending[placed][0] < row[1]:
                self._place(joined, extra, last_i, pending[placed])
                placed += 1
            last_i = i
            self._last = (row[0], row[1])
        if placed < len(pending):  # taken after the last row here ended: they wait, oldest first
            with self._lock:
                self._pending[:0] = pending[placed:]
                del self._pending[:-MAX_PENDING]
        if not joined and not extra:
            return rows
        out = list(rows)
        for i, values in joined.items():  # a value the step set itself wins
            row = out[i]
            out[i] = (*row[:_N_FIXED], {**values, **(row[_N_FIXED] or {})}, row[_N_FIXED + 1])
        return [*extra.values(), *out]

    def drain(self) -> list[tuple]:
        """At close: stop the sampling thread (waiting at most ``JOIN_S`` for a reading under way),
        then every pending reading on the last step seen, as rows of their own."""
        self._stop.set()
        if self._thread is not None and not self._gave_up:  # given up: hung, nothing to wait for
            self._thread.join(JOIN_S)
        self._check_hung()
        with self._lock:
            pending, self._pending = self._pending, []
        extra: dict[int, tuple] = {}
        for reading in pending:
            self._place({}, extra, None, reading)
        return list(extra.values())

    def _check_hung(self) -> None:
        """Give up on the sampling thread, once, when its NVML call under way has run past the bound."""
        since = self._call_since
        if since is None or self._gave_up:
            return
        hung_s = time.monotonic() - since
        if hung_s < hang_bound_s(self.every_s):
            return
        with self._lock:
            self._gave_up = True
        self._warn("hw:hung", f"GPU telemetry: NVML call hung for {hung_s:.1f} s on rank {self._rank}; "
                   "telemetry off, training and recording go on")

    def _place(self, joined: dict, extra: dict, last_i: int | None, reading: tuple[float, dict]) -> None:
        t, values = reading
        if last_i is not None:  # a row of this batch: the values join it (the later reading wins)
            joined[last_i] = values
        elif self._last is not None:  # written already: a row of its own (the later reading wins)
            step = self._last[0]
            extra[step] = (step, t, None, None, None, None, None, None, None, None, dict(values), None)
        # else: taken before any step ended; it belongs to none

    def _note_last(self, rows: list[tuple]) -> None:
        for row in reversed(rows):
            if row[2] is not None:
                self._last = (row[0], row[1])
                return


def _handle(nvml, index: int | None):
    """The NVML handle of CUDA device ``index`` of this process (None: the first visible one).
    CUDA numbers the devices it can see (CUDA_VISIBLE_DEVICES), NVML every device of the host:
    the device's UUID says which it is; without it, CUDA_VISIBLE_DEVICES does."""
    index = index or 0
    torch = sys.modules.get("torch")
    try:
        uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None) if torch is not None else None
        if uuid is not None:
            text = str(uuid)
            return nvml.nvmlDeviceGetHandleByUUID(text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}")
    except Exception:  # an older torch, a CPU build: by index below
        pass
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if index < len(visible):
        v = visible[index]
        return nvml.nvmlDeviceGetHandleByIndex(int(v)) if v.isdigit() else nvml.nvmlDeviceGetHandleByUUID(v)
    return nvml.nvmlDeviceGetHandleByIndex(index)
