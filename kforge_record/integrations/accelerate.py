"""Record through Accelerate's tracking API: ``Accelerator(log_with=KforgeTracker("runs/my-run"))``.

``accelerator.log(values, step=step)`` ends step ``step`` (its step time runs from the previous
step's first log call, or from ``tracker.start_step()``) and records ``loss``, ``grad_norm``,
``lr`` (or ``learning_rate``) and ``tokens`` in their columns, every other number under its own
name. Further calls for the same step (an eval after the training values) fill that step
(``Recorder.log``): log the training values first. ``tracker.phase(name)`` is ``Recorder.phase``.

Ranks: the tracker sets ``main_process_only = False``, but ``Accelerator.init_trackers`` and
``Accelerator.log`` themselves run on the main process only (accelerate 1.x), so through the
Accelerator only rank 0 records. To record every rank, call the tracker itself on every rank
(``tracker.log(values, step=step)``) instead of ``accelerator.log``; it starts its Recorder at the
first call when Accelerate never called ``start()`` there.
"""

from __future__ import annotations

import os

from kforge_record.integrations._common import need, number, plain
from kforge_record.recorder import Recorder

GeneralTracker = need("accelerate.tracking", "accelerate").GeneralTracker

_FIXED = {"loss": "loss", "grad_norm": "grad_norm", "lr": "lr", "learning_rate": "lr", "tokens": "tokens"}


class KforgeTracker(GeneralTracker):
    """An Accelerate ``GeneralTracker`` writing kforge shards; ``recorder_kwargs`` go to ``Recorder``."""

    name = "kforge"
    requires_logging_directory = False
    main_process_only = False

    def __init__(self, run_dir: str | os.PathLike, **recorder_kwargs):
        super().__init__()
        self.run_dir = os.fspath(run_dir)
        self._kw = recorder_kwargs
        self._hparams: dict = {}
        self.recorder: Recorder | None = None
        self._last_step = None

    @property
    def tracker(self) -> Recorder | None:
        return self.recorder

    def store_init_configuration(self, values: dict) -> None:
        self._hparams.update(plain(values))
        # Accelerate calls start() before this; meta.json is written when the first step ends.

    def _ensure(self) -> Recorder:
        if self.recorder is None:
            kw = dict(self._kw)
            kw.setdefault("hparams", self._hparams)
            if "rank" not in kw:
                try:
                    from accelerate.state import PartialState

                    state = PartialState()
                    kw.update(rank=state.process_index, world_size=state.num_processes,
                              local_rank=state.local_process_index)
                except Exception:  # no Accelerate state: the Recorder detects rank and world size itself
                    pass
            self.recorder = Recorder(self.run_dir, **kw)
        return self.recorder

    def start_step(self) -> None:
        """Optional: mark the start of a step (else a step runs from the previous step's end)."""
        self._ensure().start_step()

    def phase(self, name: str):
        return self._ensure().phase(name)

    def log(self, values: dict, step: int | None = None, **kwargs) -> None:
        rec = self._ensure()
        if step is None:
            step = 1 if self._last_step is None else self._last_step + 1
        fixed, extra = {}, {}
        for k, v in values.items():
            if (v := number(v)) is None:
                continue
            if k in _FIXED:
                fixed[_FIXED[k]] = v
            else:
                extra[k] = v
        if step == self._last_step:
            rec.log(step, **fixed, **extra)
        else:
            rec.end_step(step, **fixed, **extra)
            self._last_step = step

    def finish(self) -> None:
        if self.recorder is not None:
            self.recorder.close()
