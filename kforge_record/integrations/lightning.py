"""Record a Lightning run: ``cb = KforgeCallback("runs/my-run"); Trainer(callbacks=[cb], logger=cb.logger)``.

The callback records on every rank (Lightning calls callbacks on every process) and numbers steps
as ``trainer.global_step`` after the optimizer step (1 for the first):

* step time and phases, host wall time: ``data`` (from the end of the previous batch to
  ``on_train_batch_start``: Lightning fetches the batch before that hook), ``fwd_bwd`` (to
  ``on_before_optimizer_step``: training_step and backward of every micro-batch), ``optimizer``
  (from there to the end of the batch: the optimizer step and zero_grad). Validation runs after
  the batch end and is left out of the step time.
* loss: the sum over the step's micro-batches of ``training_step``'s loss as Lightning hands it to
  ``on_train_batch_end`` (already divided by ``accumulate_grad_batches``): the mean micro-batch
  loss, a tensor kept without a sync. lr: the first optimizer's ``param_groups[0]["lr"]`` at
  ``on_before_optimizer_step``. grad norm: ``trainer.callback_metrics[grad_norm_key]`` when you log
  it (``self.log("grad_norm", ...)``). tokens: ``tokens_per_step=`` (per rank) or the ``numel`` of
  the integer ids in each batch (a tensor, a dict's ``input_ids``, a tuple's first item).
* ``cb.logger`` (a Lightning ``Logger`` on the same Recorder) records what ``self.log`` sends to
  loggers, at the step the callback numbers (``trainer.global_step`` at that moment), and
  ``log_hyperparams`` (``save_hyperparameters()``) as the run's hparams. Without it only the
  LightningModule's ``hparams`` are recorded.
"""

from __future__ import annotations

import os
import warnings

from kforge_record.integrations._common import Phases, need, number, plain, tokens_in
from kforge_record.recorder import Recorder

_pl = need("lightning.pytorch", "lightning")
Callback = _pl.Callback
Logger = _pl.loggers.Logger


class KforgeLogger(Logger):
    """The Lightning ``Logger`` half of ``KforgeCallback`` (get it as ``cb.logger``)."""

    def __init__(self, callback: "KforgeCallback"):
        super().__init__()
        self._cb = callback

    @property
    def name(self) -> str:
        return "kforge"

    @property
    def version(self) -> str:
        return os.path.basename(os.path.abspath(self._cb.run_dir))

    @property
    def save_dir(self) -> str:
        return self._cb.run_dir

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        params = vars(params) if hasattr(params, "__dict__") and not isinstance(params, dict) else params
        self._cb.hparams.update(plain(params))
        if self._cb.recorder is not None:
            warnings.warn("kforge: hyperparameters logged after training started are not recorded "
                          "(meta.json is written at the start)", RuntimeWarning, stacklevel=2)

    def log_metrics(self, metrics, step=None) -> None:
        cb = self._cb
        if cb.recorder is None or cb.trainer is None:
            return
        vals = {k: number(x) for k, x in metrics.items() if k != "epoch" and number(x) is not None}
        if "epoch" in metrics:
            vals["lightning/epoch"] = metrics["epoch"]
        fixed = {k: vals.pop(k) for k in ("loss", "grad_norm", "lr", "tokens") if k in vals}
        if vals or fixed:
            cb.recorder.log(cb.trainer.global_step, **fixed, **vals)


class KforgeCallback(Callback):
    """A Lightning ``Callback`` recording the run with a kforge ``Recorder`` on every rank.

    ``recorder_kwargs`` go to ``Recorder`` (``model=`` for FLOPs: Lightning knows no model shape).
    """

    def __init__(self, run_dir: str | os.PathLike, *, tokens_per_step: int | None = None,
                 grad_norm_key: str = "grad_norm", **recorder_kwargs):
        self.run_dir = os.fspath(run_dir)
        self.recorder: Recorder | None = None
        self.trainer = None
        self.hparams: dict = {}
        self._kw = recorder_kwargs
        self._tokens_per_step = tokens_per_step
        self._grad_norm_key = grad_norm_key
        self._logger = None
        self._phases: Phases | None = None
        self._reset_step()

    @property
    def logger(self) -> KforgeLogger:
        if self._logger is None:
            self._logger = KforgeLogger(self)
        return self._logger

    def _reset_step(self) -> None:
        self._loss = None
        self._tokens = None
        self._lr = None

    def on_train_start(self, trainer, pl_module):
        self.trainer = trainer
        if self.recorder is None:
            kw = dict(self._kw)
            kw.setdefault("rank", trainer.global_rank)
            kw.setdefault("world_size", trainer.world_size)
            kw.setdefault("local_rank", trainer.local_rank)
            kw.setdefault("hparams", {**plain(getattr(pl_module, "hparams", None)), **self.hparams})
            self.recorder = Recorder(self.run_dir, **kw)
            self._phases = Phases(self.recorder)
        self._step = trainer.global_step
        self.recorder.start_step()
        self._phases.enter("data")

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self._phases is None:
            return
        self._phases.enter("fwd_bwd")
        if self._tokens_per_step is None:
            got = tokens_in(batch)  # numel: host-side, no sync
            if got is not None:
                self._tokens = (self._tokens or 0) + got

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if self._phases is None:
            return
        self._phases.enter("optimizer")
        if self._lr is None:
            try:
                self._lr = optimizer.param_groups[0]["lr"]
            except (AttributeError, IndexError, KeyError, TypeError):
                pass

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.recorder is None:
            return
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if number(loss) is not None:
            loss = loss.detach() if hasattr(loss, "detach") else loss
            self._loss = loss if self._loss is None else self._loss + loss  # on the device: no sync
        if trainer.global_step == self._step:  # accumulating: no optimizer step in this batch
            self._phases.enter("data")
            return
        self._phases.leave()
        self._step = trainer.global_step
        gn = number(trainer.callback_metrics.get(self._grad_norm_key))
        tokens = self._tokens_per_step if self._tokens_per_step is not None else self._tokens
        self.recorder.end_step(self._step, loss=self._loss, grad_norm=gn, lr=self._lr, tokens=tokens)
        self._reset_step()
        self._phases.enter("data")

    def on_validation_start(self, trainer, pl_module):
        if self._phases is not None:
            self._phases.leave()

    def on_validation_end(self, trainer, pl_module):
        if self.recorder is not None:  # (the sanity check runs before on_train_start: no recorder yet)
            self.recorder.start_step()  # validation is not part of the next step
            self._phases.enter("data")

    def on_train_end(self, trainer, pl_module):
        if self.recorder is not None:
            self._phases.leave()
            self.recorder.close()
            self.recorder = None
