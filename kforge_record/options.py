"""The Recorder's options, validated once at construction (a bad one raises, naming it)."""

from __future__ import annotations

import operator
import os
from dataclasses import dataclass

from . import env
from .checks import check_flag, check_int, check_positive
from .model import ModelSpec

STEP_MIN, STEP_MAX = -(2**63), 2**63 - 1
# A part write costs a few ms whatever its size (two fsyncs): 256 rows of slack let a writer keep
# up with steps down to ~20 us even when every window is one step.
MIN_LAG_ROWS = 256


@dataclass(frozen=True, kw_only=True)
class RecorderOptions:
    model: ModelSpec | None
    hparams: dict
    tags: tuple[str, ...]
    peak_tflops: float | None
    counts_tokens: bool
    flush_every_steps: int
    flush_every_s: float
    memory_every_steps: int
    max_backlog_rows: int
    close_timeout_s: float
    merge_parts: bool = True  # the writer merges its part files (compact.py); False: one file per flush
    hw_every_s: float = 5.0  # GPU telemetry every so many seconds on its own thread (hw.py); 0: off
    hang_after_s: float | None = None  # the hang watch (hang.py): None adaptive, 0 off, else fixed seconds

    @classmethod
    def from_arguments(cls, *, model, hparams, tags, peak_tflops, counts_tokens, flush_every_steps,
                       flush_every_s, memory_every_steps, max_backlog_rows, close_timeout_s,
                       merge_parts=True, hw_every_s=5.0, hang_after_s=None) -> "RecorderOptions":
        """The Recorder's keyword arguments as given (dicts, lists, ints where floats will do) to options."""
        model = _model(model)
        if hparams is not None and not isinstance(hparams, dict):
            raise TypeError(f"hparams: must be a dict, got {type(hparams).__name__}")
        if isinstance(tags, str) or not all(isinstance(t, str) for t in tags):
            raise TypeError("tags: must be a list of strings")
        if peak_tflops is not None:
            check_positive("peak_tflops", peak_tflops, "a positive finite number")
        for name, flag in (("counts_tokens", counts_tokens), ("merge_parts", merge_parts)):
            check_flag(name, flag)
        check_int("flush_every_steps", flush_every_steps, 1)
        check_int("memory_every_steps", memory_every_steps, 0)
        check_int("max_backlog_rows", max_backlog_rows, 1)
        check_positive("flush_every_s", flush_every_s, "a positive number of seconds", finite=False)
        check_positive("close_timeout_s", close_timeout_s, "a positive number of seconds", finite=False)
        if hw_every_s != 0:
            check_positive("hw_every_s", hw_every_s, "0 (off) or a positive finite number of seconds")
        if isinstance(hang_after_s, bool) or (hang_after_s is not None and hang_after_s != 0):
            check_positive("hang_after_s", hang_after_s, "None (adaptive), 0 (off) or a positive finite number of seconds")
        return cls(model=model, hparams=hparams or {}, tags=tuple(tags),
                   peak_tflops=None if peak_tflops is None else float(peak_tflops), counts_tokens=counts_tokens,
                   flush_every_steps=flush_every_steps, flush_every_s=float(flush_every_s),
                   memory_every_steps=memory_every_steps, max_backlog_rows=max_backlog_rows,
                   close_timeout_s=close_timeout_s, merge_parts=merge_parts, hw_every_s=float(hw_every_s),
                   hang_after_s=None if hang_after_s is None else float(hang_after_s))

    @property
    def lag_rows(self) -> int:
        """Rows handed to the writer and not yet written before end_step waits for it: two windows
        (the one being written and the next), at least MIN_LAG_ROWS (so that with tiny windows
        the writer can catch up by merging them into bigger parts), at most max_backlog_rows."""
        return min(max(2 * self.flush_every_steps, MIN_LAG_ROWS), self.max_backlog_rows)


def _model(model) -> ModelSpec | None:
    if model is None or isinstance(model, ModelSpec):
        return model
    if isinstance(model, dict):
        return ModelSpec.from_dict(model)
    raise TypeError(f"model: must be a dict or ModelSpec, got {type(model).__name__}")


def checked_run_dir(run_dir) -> str:
    run_dir = os.fspath(run_dir)
    if not run_dir:
        raise ValueError("run_dir: must be a non-empty path")
    return run_dir


def rank_and_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """The given rank and world size, else what the process says (see env.detect_rank_world), validated."""
    if rank is None or world_size is None:  # given both: nothing to ask (an adapter that detected them itself)
        det_rank, det_world = env.detect_rank_world()
        rank = det_rank if rank is None else rank
        world_size = det_world if world_size is None else world_size
    check_int("rank", rank, 0)
    check_int("world_size", world_size, 1)
    if rank >= world_size:
        raise ValueError(f"rank {rank} is not below world_size {world_size}")
    return rank, world_size


def as_step(step) -> int | None:
    """A step given as an int or another integer type (numpy) as int; None for anything else: None,
    "5", 2.0, True (a bool is a bug, not step 1), a tensor (its value would need a device sync), or
    an int outside int64 (the step column's type)."""
    if isinstance(step, bool) or not (isinstance(step, int) or type(step).__module__ == "numpy"):
        return None
    try:
        i = operator.index(step)
    except TypeError:
        return None
    return i if STEP_MIN <= i <= STEP_MAX else None
