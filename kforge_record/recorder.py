"""The in-loop recorder. Its hot path (``end_step``) only reads two clocks and appends a tuple.

Where a GPU synchronisation can happen, exactly:

* never in ``start_step``, ``phase``, ``end_step`` or ``log``: tensors are kept as (detached)
  references, and CUDA memory counters are the caching allocator's host-side statistics;
* on the writer thread at each flush, where ``torch.cuda.synchronize(device)`` then one
  ``torch.stack(values).cpu()`` per device and dtype wait for the kernels that produced the
  buffered values, on whatever stream (blocking only that thread);
* in ``flush()`` and ``close()`` (also at exit and on SIGTERM), which wait for the writer, and so
  for that copy, on the calling thread.
"""

from __future__ import annotations

import atexit
import datetime as _dt
import math
import os
import signal
import sys
import threading
import time
import weakref
from time import perf_counter

from . import env
from .model import ModelSpec
from .schema import SCHEMA_VERSION, phase_column, rank_dir_name
from .writer import Held, ShardWriter, _Warner, rows_to_table

_LIVE: "weakref.WeakSet[Recorder]" = weakref.WeakSet()
_PREVIOUS_SIGTERM = None
_SIGTERM_INSTALLED = False


class _Phase:
    """A reusable timer for one named phase; time spent inside adds up within a step."""

    __slots__ = ("_rec", "_key", "_t0")

    def __init__(self, rec: "Recorder", key: str):
        self._rec = rec
        self._key = key
        self._t0 = 0.0

    def __enter__(self):
        self._t0 = perf_counter()
        return self

    def __exit__(self, *exc):
        phases = self._rec._phases
        phases[self._key] = phases.get(self._key, 0.0) + (perf_counter() - self._t0)
        return False


def _capture(v):
    """Keep a value without forcing a sync. Tensors are detached (no autograd graph is held) and
    kept by reference with their version counter; numbers pass through."""
    if getattr(v, "requires_grad", None) is None:  # not a tensor
        return v
    return Held(v.detach() if v.requires_grad else v)


class Recorder:
    """Append per-step training facts to rank-local Parquet shards under ``run_dir``.

    >>> rec = Recorder("runs/my-run", model={"flops_per_token": 6e9}, hparams={"lr": 3e-4})
    >>> for step in range(1, 4):
    ...     rec.start_step()
    ...     with rec.phase("fwd_bwd"):
    ...         loss = 1.0 / step
    ...     rec.end_step(step, loss=loss, lr=3e-4, tokens=4096)
    >>> rec.close()

    Construction validates everything and may raise; after that no method raises into the loop.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        *,
        model: dict | ModelSpec | None = None,
        hparams: dict | None = None,
        tags: list[str] | tuple[str, ...] = (),
        peak_tflops: float | None = None,
        counts_tokens: bool = True,
        flush_every_steps: int = 100,
        flush_every_s: float = 30.0,
        memory_every_steps: int = 10,
        max_backlog_rows: int = 100_000,
        close_timeout_s: float = 60.0,
        rank: int | None = None,
        world_size: int | None = None,
        local_rank: int | None = None,
        install_sigterm_handler: bool = True,
    ):
        self._pid = os.getpid()
        self._closed = True  # until construction succeeds, nothing to close
        run_dir = os.fspath(run_dir)
        if not run_dir:
            raise ValueError("run_dir: must be a non-empty path")
        self.model = _validate_model(model)
        if hparams is not None and not isinstance(hparams, dict):
            raise TypeError(f"hparams: must be a dict, got {type(hparams).__name__}")
        if isinstance(tags, str) or not all(isinstance(t, str) for t in tags):
            raise TypeError("tags: must be a list of strings")
        if peak_tflops is not None and (
            isinstance(peak_tflops, bool) or not isinstance(peak_tflops, (int, float))
            or not math.isfinite(peak_tflops) or peak_tflops <= 0
        ):
            raise ValueError(f"peak_tflops: must be a positive finite number, got {peak_tflops!r}")
        if not isinstance(counts_tokens, bool):
            raise TypeError(f"counts_tokens: must be True or False, got {counts_tokens!r}")
        _check_int("flush_every_steps", flush_every_steps, 1)
        _check_int("memory_every_steps", memory_every_steps, 0)
        _check_int("max_backlog_rows", max_backlog_rows, 1)
        if isinstance(flush_every_s, bool) or not isinstance(flush_every_s, (int, float)) or not flush_every_s > 0:
            raise ValueError(f"flush_every_s: must be a positive number of seconds, got {flush_every_s!r}")
        det_rank, det_world = env.detect_rank_world()
        self.rank = det_rank if rank is None else rank
        self.world_size = det_world if world_size is None else world_size
        _check_int("rank", self.rank, 0)
        _check_int("world_size", self.world_size, 1)
        if self.rank >= self.world_size:
            raise ValueError(f"rank {self.rank} is not below world_size {self.world_size}")
        if os.path.exists(run_dir) and not os.path.isdir(run_dir):
            raise NotADirectoryError(f"run_dir: {run_dir} exists and is not a directory")

        now = _dt.datetime.now(_dt.timezone.utc)
        launch = env.launch_info()
        self.run_dir = run_dir
        attempt_id = env.make_attempt_id(now, launch)
        rank_dir = os.path.join(run_dir, rank_dir_name(self.rank))
        if os.path.exists(os.path.join(rank_dir, attempt_id)):
            # The same launch id met twice for one rank (a second Recorder in this process, or a
            # launcher that reused its counters): never write into another attempt's folder.
            attempt_id = f"{attempt_id}-p{self._pid}-{now.strftime('%H%M%S%f')}"
        self.attempt_id = attempt_id
        self.attempt_dir = os.path.join(rank_dir, attempt_id)
        self._cuda = env.cuda_in_use()
        meta = {
            "schema_version": SCHEMA_VERSION,
            "run_name": os.path.basename(os.path.abspath(run_dir)),
            "rank": self.rank,
            "world_size": self.world_size,
            "local_rank": env.detect_local_rank() if local_rank is None else local_rank,
            "host": env.hostname(),
            "pid": self._pid,
            "attempt_id": self.attempt_id,
            "launch": launch,
            "start_time": now.timestamp(),
            "process_start_time": env.process_start_time(),
            "device": env.device_info(),
            "versions": env.versions(),
            "counts_tokens": counts_tokens,
            "model": self.model.to_dict() if self.model else None,
            "peak_tflops": float(peak_tflops) if peak_tflops is not None else None,
            "hparams": hparams or {},
            "tags": list(tags),
            "flush_every_steps": flush_every_steps,
            "flush_every_s": float(flush_every_s),
            "memory_every_steps": memory_every_steps,
        }
        self._meta = meta
        self._flush_every_steps = flush_every_steps
        self._flush_every_s = float(flush_every_s)
        self._mem_every = memory_every_steps
        self._close_timeout_s = close_timeout_s
        self._warn = _Warner(f"rank {self.rank}")
        self._rows: list[tuple] = []
        self._phases: dict[str, float] = {}
        self._phase_objs: dict[str, _Phase] = {}
        self._t_step = perf_counter()  # start of the current step (start_step or previous end_step)
        self._last_flush = self._t_step
        self._n_steps = 0
        self._writer = ShardWriter(self.attempt_dir, meta, max_backlog_rows=max_backlog_rows, where=f"rank {self.rank}")
        # meta.json is written synchronously here, so a bad path fails at construction, loudly.
        self._writer.write_meta()
        # pyarrow's first pa.array() call imports pandas when present (~0.2 s holding the GIL);
        # pay it here, not on the writer thread in the middle of training.
        rows_to_table([(0, 0.0, None, None, None, None, None, None, None, None, None)], self._warn)
        self._closed = False
        _LIVE.add(self)
        # A strong reference: a recorder the loop dropped without close() still flushes at exit.
        atexit.register(self._close_at_exit)
        if install_sigterm_handler:
            _install_sigterm_handler()

    # -- hot path ----------------------------------------------------------------------------
    def start_step(self) -> None:
        """Mark the start of a step. Optional: without it a step runs from the previous end_step."""
        self._t_step = perf_counter()

    def phase(self, name: str) -> _Phase:
        """``with rec.phase("data"):`` times a named phase into column ``time/data_s``.

        Host wall time: with CUDA's asynchronous launches it measures what the host waited for.
        """
        p = self._phase_objs.get(name)
        if p is None:
            p = self._phase_objs[name] = _Phase(self, phase_column(name))
        return p

    def end_step(self, step: int, loss=None, grad_norm=None, lr=None, tokens=None, **scalars) -> None:
        """Record one step. Values: Python numbers, numpy scalars or 1-element tensors (any device)."""
        try:
            t = perf_counter()
            step_time = t - self._t_step
            self._t_step = t
            if loss is not None and loss.__class__ is not float:
                loss = _capture(loss)
            if grad_norm is not None and grad_norm.__class__ is not float:
                grad_norm = _capture(grad_norm)
            if lr is not None and lr.__class__ is not float:
                lr = _capture(lr)
            if tokens is not None and tokens.__class__ is not int:
                tokens = _capture(tokens)
            extras = None
            if self._phases:
                extras = self._phases
                self._phases = {}
            if scalars:
                for k, v in scalars.items():
                    if v is not None and v.__class__ is not float:
                        scalars[k] = _capture(v)
                if extras is None:
                    extras = scalars
                else:
                    extras.update(scalars)
            self._n_steps += 1
            mem = None
            if self._mem_every and self._n_steps % self._mem_every == 1 % self._mem_every:
                mem = self._memory()
            if mem is None:
                self._rows.append((step, time.time(), step_time, loss, grad_norm, lr, tokens, None, None, None, extras))
            else:
                self._rows.append((step, time.time(), step_time, loss, grad_norm, lr, tokens, *mem, extras))
            if len(self._rows) >= self._flush_every_steps or t - self._last_flush >= self._flush_every_s:
                self._handoff(t)
        except Exception as e:  # the loop must go on
            self._warn(f"end_step:{type(e).__name__}", f"end_step failed and the step was not recorded: {e!r}")

    def log(self, step: int, loss=None, grad_norm=None, lr=None, tokens=None, **scalars) -> None:
        """Values for a step that already ended (or not yet): an eval loss, or the loss, grad norm,
        lr and tokens that the loop knows only after ``end_step`` (a framework's logging hook).
        Ingest fills them into the step's ``end_step`` row; a value set by both keeps the
        ``end_step`` one, and among several ``log`` calls the last written wins (with a warning)."""
        try:
            fixed = [v if v is None or v.__class__ is float else _capture(v) for v in (loss, grad_norm, lr, tokens)]
            for k, v in scalars.items():
                if v is not None and v.__class__ is not float:
                    scalars[k] = _capture(v)
            self._rows.append((step, time.time(), None, *fixed, None, None, None, scalars))
            t = perf_counter()
            if len(self._rows) >= self._flush_every_steps or t - self._last_flush >= self._flush_every_s:
                self._handoff(t)
        except Exception as e:
            self._warn(f"log:{type(e).__name__}", f"log failed: {e!r}")

    def _handoff(self, t: float) -> None:
        self._last_flush = t
        if self._closed:
            self._warn("after-close", "end_step after close(): these steps are not recorded")
            self._rows = []
        elif os.getpid() == self._pid:
            # Submit, then empty the buffer: a signal handler flushing in between submits the same
            # list again, which the writer ignores, so no window is lost or written twice.
            self._writer.submit(self._rows)
            self._rows = []

    def _memory(self):
        if not self._cuda:
            self._cuda = env.cuda_in_use()
            if not self._cuda:
                return None
            self._meta = {**self._meta, "device": env.device_info()}
            self._writer.update_meta(self._meta)  # CUDA came up after construction: record the device
        cuda = sys.modules["torch"].cuda
        # Host-side allocator counters: no device synchronisation. Resetting the peak is what makes
        # mem_peak_bytes "peak since the previous sample"; it also resets what your own
        # torch.cuda.max_memory_allocated() reports (memory_every_steps=0 turns sampling off).
        stats = cuda.memory_stats_as_nested_dict()
        cuda.reset_peak_memory_stats()
        return (
            stats["allocated_bytes"]["all"]["current"],
            stats["allocated_bytes"]["all"]["peak"],
            stats["reserved_bytes"]["all"]["current"],
        )

    # -- lifecycle ---------------------------------------------------------------------------
    @property
    def dropped_rows(self) -> int:
        """Rows lost to disk errors so far (also written to every part file and to end.json)."""
        return self._writer.dropped_rows

    def flush(self) -> None:
        """Write everything buffered now and wait for it (the caller's thread waits; see module doc)."""
        if self._closed or os.getpid() != self._pid:
            return
        try:
            self._writer.submit(self._rows)
            self._rows = []
            self._last_flush = perf_counter()
            if not self._writer.flush([], self._close_timeout_s):
                self._warn("flush-timeout", f"flush did not finish within {self._close_timeout_s}s; continuing")
        except Exception as e:
            self._warn(f"flush:{type(e).__name__}", f"flush failed: {e!r}")

    def close(self, *, reason: str = "close") -> None:
        """Flush, write end.json and stop the writer. Idempotent; also runs at exit and on SIGTERM."""
        if self._closed or os.getpid() != self._pid:  # a forked child (DataLoader worker) writes nothing
            return
        self._closed = True
        try:
            self._finish(reason)
        finally:
            _LIVE.discard(self)
            atexit.unregister(self._close_at_exit)

    def _finish(self, reason: str) -> None:
        """Hand over what is buffered and have the writer write end.json and stop. Safe to re-enter
        from a signal handler that interrupted a close(): the writer takes the first close and
        answers the second at once."""
        try:
            self._writer.submit(self._rows)
            self._rows = []
            if not self._writer.close([], reason=reason, timeout=self._close_timeout_s):
                self._warn("close-timeout", f"close did not finish within {self._close_timeout_s}s; rows may be lost")
        except Exception as e:
            self._warn(f"close:{type(e).__name__}", f"close failed: {e!r}")

    def _close_at_exit(self) -> None:
        self.close(reason="exit")

    def __enter__(self) -> "Recorder":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.close(reason="close" if exc_type is None else f"exception:{exc_type.__name__}")
        return False


def _check_int(name: str, v, lo: int) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ValueError(f"{name}: must be an integer >= {lo}, got {v!r}")


def _validate_model(model) -> ModelSpec | None:
    if model is None or isinstance(model, ModelSpec):
        return model
    if isinstance(model, dict):
        return ModelSpec.from_dict(model)
    raise TypeError(f"model: must be a dict or ModelSpec, got {type(model).__name__}")


def _on_sigterm(signum, frame) -> None:
    prev = _PREVIOUS_SIGTERM
    if callable(prev) or prev == signal.SIG_IGN:
        # The job handles SIGTERM itself (often: finish the step, checkpoint, exit): flush what we
        # have and keep recording; exit or close() will close.
        for rec in list(_LIVE):
            rec.flush()
        if callable(prev):
            prev(signum, frame)
        return
    # Default action: the process dies of SIGTERM. Close every recorder first (also one whose
    # close() this signal interrupted), then die as the job would have, exit status and all.
    for rec in list(_LIVE):
        rec._closed = True
        rec._finish("sigterm")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _install_sigterm_handler() -> None:
    global _PREVIOUS_SIGTERM, _SIGTERM_INSTALLED
    if _SIGTERM_INSTALLED or threading.current_thread() is not threading.main_thread():
        return
    try:
        _PREVIOUS_SIGTERM = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, _on_sigterm)
        _SIGTERM_INSTALLED = True
    except (ValueError, OSError):
        pass


def _after_fork_in_child() -> None:
    # A forked child (DataLoader worker) must never write into its parent's shard.
    _LIVE.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
