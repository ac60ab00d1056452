"""The in-loop recorder. Its hot path (``end_step``) reads two clocks and appends a tuple, lock-free.

Where a GPU synchronisation can happen, exactly:

* never in ``start_step``, ``phase``, ``end_step`` or ``log``: tensors are kept as (detached)
  references, and CUDA memory counters are the caching allocator's host-side statistics;
* on the writer thread at each flush: the device's own synchronize (never ``torch.cuda`` for another
  device type), then one ``torch.stack(values).cpu()`` per device and dtype (blocking that thread);
* in ``flush()`` and ``close()`` (also at exit and on SIGTERM), which wait for the writer, and so
  for that copy, on the calling thread.

Several threads may call ``end_step``/``log``/``flush`` on one Recorder (an eval thread logging while the loop runs).
``end_step`` takes no lock: one ``list.append`` adds its row; a row appended to a buffer just handed over is taken at the
writer's next take (inbox.py), an empty buffer is never handed over. Hand-overs, ``log``, ``flush`` and ``close`` take a
lock, re-entrant for the SIGTERM handler (it runs on the main thread inside whatever it interrupted). Phase timers take no
lock (phase.py): one phase name, one thread at a time; step times (``start_step``) are for one loop thread.
"""

from __future__ import annotations

import atexit
import datetime as _dt
import os
import threading
import time
from time import perf_counter

from . import env, heartbeat, lifecycle
from .convert import capture, capture_all, rows_to_table, safe_repr
from .hang import HangWatch
from .model import ModelSpec
from .options import STEP_MAX, STEP_MIN, RecorderOptions, as_step, checked_run_dir, rank_and_world
from .phase import NO_PHASE, Phase, new_phase, take_pending
from .schema import SCHEMA_VERSION, phase_column, rank_dir_name
from .warn import Warner
from .writer import ShardWriter, claim_attempt_dir

_NO_MEM = (None, None, None)


class Recorder:
    """Append per-step training facts to rank-local Parquet shards under ``run_dir``.

    >>> rec = Recorder("runs/my-run", model={"flops_per_token": 6e9}, hparams={"lr": 3e-4})
    >>> for step in range(1, 4):
    ...     rec.start_step()
    ...     with rec.phase("fwd_bwd"):
    ...         loss = 1.0 / step
    ...     rec.end_step(step, loss=loss, lr=3e-4, tokens=4096)
    >>> rec.close()

    Construction validates everything and may raise (``NAME: must be ..., got VALUE``, as ingest's
    options say it); after that no method raises into the loop.

    Args:
        run_dir: the run's folder; this rank writes ``run_dir/rank-NNNNN/ATTEMPT/``.
        model: for MFU, a ModelSpec or its keywords (``flops_per_token``, ``n_params`` or the shape).
        hparams: the run's hyperparameters (a JSON-able dict), shown and compared by the dashboard.
        tags: labels of the run (strings), for grouping and filtering runs.
        peak_tflops: peak dense TFLOPS per GPU, beating ingest's device table (``--peak-tflops`` beats both).
        counts_tokens: False on ranks that repeat a replica's tokens (tensor/pipeline parallel peers).
        flush_every_steps: write a part file every so many steps...
        flush_every_s: ...or at the first call after so many seconds (there is no timer thread).
        memory_every_steps: sample CUDA memory every so many steps (1: every step; 0: never).
        max_backlog_rows: rows kept for a writer that cannot write (a hung filesystem), then dropped and counted.
        close_timeout_s: the longest ``close()`` waits for the writer.
        rank: this process's rank (default: torch.distributed, else RANK, else SLURM_PROCID).
        world_size: the job's ranks (default: as ``rank``, from WORLD_SIZE or SLURM_NTASKS).
        local_rank: the rank on its host, for the GPU it uses (default: LOCAL_RANK, else SLURM_LOCALID).
        install_sigterm_handler: flush (and close, unless the job handles it) on SIGTERM (Slurm preemption).
        merge_parts: the writer merges its part files into bigger ones; False: one file per flush.
        hw_every_s: GPU telemetry (NVML) every so many seconds on a thread of its own; 0: off.
        hang_after_s: no step ended for so long is a stall: each rank leaves its rows, step, phase, stacks and
            flight-recorder dump once (docs/hangs.md); None: adaptive, max(300 s, 10 x the median step); 0: off.
        hang_allow_s: phase name -> seconds it may last without a stall called (``{"checkpoint": 1800}``).
    """

    def __init__(
        self, run_dir: str | os.PathLike, *,
        model: dict | ModelSpec | None = None, hparams: dict | None = None, tags: list[str] | tuple[str, ...] = (),
        peak_tflops: float | None = None, counts_tokens: bool = True,
        flush_every_steps: int = 100, flush_every_s: float = 30.0, memory_every_steps: int = 10,
        max_backlog_rows: int = 100_000, close_timeout_s: float = 60.0,
        rank: int | None = None, world_size: int | None = None, local_rank: int | None = None,
        install_sigterm_handler: bool = True, merge_parts: bool = True, hw_every_s: float = 5.0,
        hang_after_s: float | None = None, hang_allow_s: dict[str, float] | None = None,
    ):
        self._pid = os.getpid()
        self._closed = True  # until construction succeeds, nothing to close
        self.run_dir = checked_run_dir(run_dir)
        self._opts = RecorderOptions.from_arguments(
            model=model, hparams=hparams, tags=tags, peak_tflops=peak_tflops, counts_tokens=counts_tokens,
            flush_every_steps=flush_every_steps, flush_every_s=flush_every_s, memory_every_steps=memory_every_steps,
            max_backlog_rows=max_backlog_rows, close_timeout_s=close_timeout_s, merge_parts=merge_parts,
            hw_every_s=hw_every_s, hang_after_s=hang_after_s, hang_allow_s=hang_allow_s)
        self.model = self._opts.model
        self.rank, self.world_size = rank_and_world(rank, world_size)
        if os.path.exists(self.run_dir) and not os.path.isdir(self.run_dir):
            raise NotADirectoryError(f"run_dir: {self.run_dir} exists and is not a directory")
        now = _dt.datetime.now(_dt.timezone.utc)
        launch = env.launch_info()
        rank_dir = os.path.join(self.run_dir, rank_dir_name(self.rank))
        self.attempt_id = claim_attempt_dir(rank_dir, env.make_attempt_id(now, launch), pid=self._pid,
                                            stamp=now.strftime("%H%M%S%f"))
        self.attempt_dir = os.path.join(rank_dir, self.attempt_id)
        self._cuda = env.cuda_in_use()
        self._meta = self._initial_meta(now, launch, local_rank)
        self._init_loop_state()
        self._hb_step, self._hb_time = heartbeat.open_heartbeat(self.attempt_dir, self._warn)
        self._start_writer()
        self._hang = None if self._opts.hang_after_s == 0 else HangWatch(self, self._opts.hang_after_s, self._opts.hang_allow_s)
        self._closed = False
        self._register(install_sigterm_handler)

    def _initial_meta(self, now: _dt.datetime, launch: dict, local_rank: int | None) -> dict:
        o = self._opts
        return {
            "schema_version": SCHEMA_VERSION,
            "run_name": os.path.basename(os.path.abspath(self.run_dir)),
            "rank": self.rank,
            "world_size": self.world_size,
            "local_rank": env.detect_local_rank() if local_rank is None else local_rank,
            "host": env.hostname(),
            "pid": self._pid,
            "attempt_id": self.attempt_id,
            "launch": launch,
            "start_time": now.timestamp(),
            "process_start_time": env.process_start_time(),
            "process": env.process_identity(),
            "device": env.device_info(),
            "versions": env.versions(),
            "counts_tokens": o.counts_tokens,
            "model": o.model.to_dict() if o.model else None,
            "peak_tflops": o.peak_tflops,
            "hparams": o.hparams,
            "tags": list(o.tags),
            "flush_every_steps": o.flush_every_steps,
            "flush_every_s": o.flush_every_s,
            "memory_every_steps": o.memory_every_steps,
            "hw_every_s": o.hw_every_s,
            "hang_after_s": o.hang_after_s, "hang_allow_s": o.hang_allow_s,  # None: adaptive (hang.py), 0: off
            "fr": env.flight_recorder_env(),  # where PyTorch's own dumps go (ingest reads them too)
        }

    def _init_loop_state(self) -> None:
        o = self._opts
        self._flush_every_steps = o.flush_every_steps
        self._flush_every_s = o.flush_every_s
        self._mem_every = o.memory_every_steps
        self._close_timeout_s = o.close_timeout_s
        # The run's name beside the rank: a process may hold two recorders (train and eval runs)
        self._where = f"rank {self.rank}, run {os.path.basename(os.path.normpath(self.run_dir))!r}"
        self._warn = Warner(self._where)
        self._lock = threading.RLock()
        self._rows: list[tuple] = []
        self._pending: list[tuple[str, float]] = []  # (column, seconds) from phase timers (phase.py)
        self._taker = [None]  # the token a phase-time taker holds (phase.take_pending)
        self._phase_objs: dict[str, Phase] = {}
        self._names_ok: set[str] = set()  # scalar names checked once, then accepted at C speed
        self._t_step = perf_counter()  # start of the current step (start_step or previous end_step)
        self._flush_due = self._t_step + self._flush_every_s
        self._mem_left = 1 if self._mem_every else -1  # end_steps to the next memory sample (never 0: never)

    def _start_writer(self) -> None:
        self._writer = ShardWriter(self.attempt_dir, self._meta, max_backlog_rows=self._opts.max_backlog_rows,
                                   lag_rows=self._opts.lag_rows, where=self._where, merge_parts=self._opts.merge_parts,
                                   hw_every_s=self._opts.hw_every_s)
        self._writer.write_meta()  # synchronously: a bad path fails at construction, loudly
        # pyarrow's first pa.array() imports pandas when present (~0.2 s holding the GIL): paid here, not by the writer.
        rows_to_table([(0, 0.0, None, None, None, None, None, None, None, None, None, None)], self._warn)

    def _register(self, install_sigterm_handler: bool) -> None:
        lifecycle.LIVE.add(self)
        atexit.register(self._close_at_exit)  # strong: a recorder dropped without close() still flushes
        if install_sigterm_handler and not lifecycle.install_sigterm_handler():
            lifecycle.install_at_first_main_call(self)  # built off the main thread

    # -- hot path ----------------------------------------------------------------------------
    def start_step(self) -> None:
        """Mark the start of a step. Optional: without it a step runs from the previous end_step."""
        self._t_step = perf_counter()

    def phase(self, name: str):
        """``with rec.phase("data"):`` times a named phase into column ``time/data_s``.

        Host wall time: with CUDA's asynchronous launches it measures what the host waited for.
        A name that is not a non-empty string without NUL is refused (warned once): nothing is timed.
        """
        try:
            p = self._phase_objs.get(name)
            if p is None:
                if not isinstance(name, str) or not name or "\0" in name:
                    self._warn(f"phase:{safe_repr(name)}", f"phase name {safe_repr(name)} is not a non-empty string "
                               "without NUL characters; that phase is not timed")
                    return NO_PHASE
                p = self._phase_objs[name] = new_phase(self._pending, phase_column(name), perf_counter, self._hang, name)
            return p
        except Exception:  # an unhashable name (a list): never a TypeError into the loop
            self._warn(f"phase:{type(name).__name__}", f"phase name {safe_repr(name)} is not a string; that phase is not timed")
            return NO_PHASE

    def end_step(self, /, step: int, loss=None, grad_norm=None, lr=None, tokens=None, **scalars) -> None:
        """Record one step. Values: Python numbers, numpy scalars or 1-element tensors (any device)."""
        # No lock and no _captured() call on this path (hand-overs take the lock: _handoff): cold, 0.81-0.86x
        # f738344's median µs a step in 4 runs (27.0 vs 31.5): python benchmarks/bench_record_cold.py --ref f738344
        try:
            t = perf_counter()
            step_time = t - self._t_step
            self._t_step = t
            if step.__class__ is not int or not 0 <= step < 1 << 30:  # small ints compare fastest; others: below
                step = self._checked_step(step, "end_step")
                if step is None:
                    take_pending(self._pending, self._taker)  # they belong to the refused step: dropped
                    return
            if loss.__class__ is not float and loss is not None:
                loss = capture(loss)
            if grad_norm.__class__ is not float and grad_norm is not None:
                grad_norm = capture(grad_norm)
            if lr.__class__ is not float and lr is not None:
                lr = capture(lr)
            if tokens.__class__ is not int and tokens is not None:
                tokens = capture(tokens)
            if scalars:
                if not self._names_ok.issuperset(scalars):
                    scalars = self._checked_names(scalars)
                for v in scalars.values():
                    if v.__class__ is not float and v is not None:
                        capture_all(scalars)
                        break
            else:
                scalars = None
            phases = self._pending
            if phases:
                phases = take_pending(phases, self._taker)
            else:
                phases = None
            left = self._mem_left - 1
            if left:
                self._mem_left = left
                row = (step, time.time(), step_time, loss, grad_norm, lr, tokens, None, None, None, scalars, phases)
            else:
                self._mem_left = self._mem_every
                mem = self._memory() or _NO_MEM
                row = (step, time.time(), step_time, loss, grad_norm, lr, tokens, *mem, scalars, phases)
            rows = self._rows
            rows.append(row)
            self._hb_step[1] = step  # the heartbeat (heartbeat.py): two stores, no syscall
            self._hb_time[2] = row[1]
            if len(rows) >= self._flush_every_steps or t >= self._flush_due or rows is not self._rows:  # (handed over)
                self._handoff(t, rows)
        except Exception as e:  # the loop must go on
            self._warn(f"end_step:{type(e).__name__}", f"end_step failed and the step was not recorded: {e!r}")

    def log(self, /, step: int, loss=None, grad_norm=None, lr=None, tokens=None, **scalars) -> None:
        """Values for a step that already ended (or not yet): an eval loss, or the loss, grad norm,
        lr and tokens that the loop knows only after ``end_step`` (a framework's logging hook).
        Ingest fills them into the step's ``end_step`` row; a value set by both keeps the
        ``end_step`` one, and among several ``log`` calls the last written wins (with a warning)."""
        try:
            with self._lock:
                if step.__class__ is not int or not 0 <= step < 1 << 30:
                    step = self._checked_step(step, "log")
                    if step is None:
                        return
                loss, grad_norm, lr, tokens, scalars = self._captured(loss, grad_norm, lr, tokens, scalars)
                self._rows.append((step, time.time(), None, loss, grad_norm, lr, tokens, None, None, None, scalars, None))
                t = perf_counter()
                if len(self._rows) >= self._flush_every_steps or t >= self._flush_due:
                    self._handoff(t)
        except Exception as e:
            self._warn(f"log:{type(e).__name__}", f"log failed: {e!r}")

    def _captured(self, loss, grad_norm, lr, tokens, scalars: dict) -> tuple:
        """(loss, grad_norm, lr, tokens, scalars or None) as a row holds them, as end_step has them inline:
        floats (ints for tokens) and None as they are, anything else captured (convert.capture)."""
        if scalars:
            if not self._names_ok.issuperset(scalars):
                scalars = self._checked_names(scalars)
            capture_all(scalars)
        return (loss if loss is None or loss.__class__ is float else capture(loss),
                grad_norm if grad_norm is None or grad_norm.__class__ is float else capture(grad_norm),
                lr if lr is None or lr.__class__ is float else capture(lr),
                tokens if tokens is None or tokens.__class__ is int else capture(tokens), scalars or None)

    def _checked_step(self, step, call: str) -> int | None:
        """``step`` as an int; None, warned and counted, when it is not one (see options.as_step)."""
        if step.__class__ is int and STEP_MIN <= step <= STEP_MAX:  # negative, or from 2**30 on
            return step
        i = as_step(step)
        if i is None:
            self._writer.count_rejected(1)
            self._warn(f"step:{call}", f"{call}: step {safe_repr(step)} is not an integer in the int64 range; "
                       "the row is dropped (counted in dropped_rows). Pass the step as an int.")
        return i

    def _checked_names(self, scalars: dict) -> dict:
        """``scalars`` without the names no reader can take ("" and names with NUL), warned once each."""
        kept = {}
        for name, v in scalars.items():
            if name in self._names_ok or (isinstance(name, str) and name and "\0" not in name):
                self._names_ok.add(name)
                kept[name] = v
            else:
                self._warn(f"name:{name!r}", f"scalar name {name!r} is not allowed (empty, or holds a NUL character); "
                           "its values are dropped")
        return kept

    def _handoff(self, t: float, rows: list | None = None) -> None:
        with self._lock:  # end_step's hand-over takes it here; log's holds it already (re-entrant)
            if rows is not None and rows is not self._rows:  # end_step appended to a list handed over: Inbox.late
                return self._writer.inbox.late(rows)
            self._flush_due = t + self._flush_every_s
            if self._closed:
                self._warn("after-close", "end_step after close(): these steps are not recorded")
                self._rows = []
            elif os.getpid() != self._pid:
                self._warn("forked", f"end_step/log in a forked child (pid {os.getpid()}) of the process that built the "
                           "Recorder: not recorded (a child never writes its parent's shard; build a Recorder in the child)")
                self._rows = []
            elif self._rows:
                # Submit, then empty the buffer (a signal handler's flush in between submits the same list, which
                # the writer ignores); an empty one stays, so a row appended to it late is in the next hand-over.
                self._writer.submit(self._rows)
                self._rows = []

    def _memory(self):
        if not self._cuda:
            self._cuda = env.cuda_in_use()
            if not self._cuda:
                return None
            self._meta = {**self._meta, "device": env.device_info()}
            self._writer.update_meta(self._meta)  # CUDA came up after construction: record the device
        return env.cuda_memory()

    @property
    def dropped_rows(self) -> int:
        """Rows lost so far: disk errors, a stuck writer, unconvertible windows, refused steps (in part files, end.json)."""
        return self._writer.dropped_rows

    def flush(self) -> None:
        """Write everything buffered now and wait for it (the caller's thread waits; see module doc)."""
        if self._closed or os.getpid() != self._pid:
            return
        try:
            with self._lock:
                if self._rows:  # (an empty buffer stays: see _handoff)
                    self._writer.submit(self._rows)
                    self._rows = []
                self._flush_due = perf_counter() + self._flush_every_s
            if not self._writer.flush([], self._close_timeout_s):
                self._warn("flush-timeout", f"flush did not finish within {self._close_timeout_s}s; continuing")
        except Exception as e:
            self._warn(f"flush:{type(e).__name__}", f"flush failed: {e!r}")

    def close(self, *, reason: str = "close") -> None:
        """Flush, write end.json and stop the writer. Idempotent; also runs at exit and on SIGTERM."""
        with self._lock:
            if self._closed or os.getpid() != self._pid:  # a forked child (DataLoader worker) writes nothing
                return
            self._closed = True
        try:
            if self._hang is not None:
                self._hang.close()
            self._finish(reason)
        finally:
            lifecycle.LIVE.discard(self)
            atexit.unregister(self._close_at_exit)

    def _finish(self, reason: str) -> None:
        """Hand over what is buffered and have the writer write end.json and stop. Safe to re-enter from a signal
        handler that interrupted a close(): the writer takes the first close and answers the second at once."""
        try:
            with self._lock:
                self._writer.submit(self._rows)
                self._rows = []
            if not self._writer.close([], reason=reason, timeout=self._close_timeout_s):
                self._warn("close-timeout", f"close did not finish within {self._close_timeout_s}s; rows may be lost")
        except Exception as e:
            self._warn(f"close:{type(e).__name__}", f"close failed: {e!r}")

    def _forked(self) -> None:
        """In a forked child: no parent rows, a fresh lock (one held at the fork by a thread not in the child stays held)."""
        self._lock = threading.RLock()
        self._rows = []
        del self._pending[:]  # the same list: the phase timers hold it
        self._taker = [None]  # a token held at the fork by a thread that is not in the child
        self._hb_step, self._hb_time = heartbeat.detached()  # never the parent's heartbeat
        if self._hang is not None:
            self._hang.forked()

    def _close_at_exit(self) -> None:
        self.close(reason="exit")

    def __enter__(self) -> "Recorder":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.close(reason="close" if exc_type is None else f"exception:{exc_type.__name__}")
        return False

