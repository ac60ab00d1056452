"""Record a Hugging Face ``Trainer`` run: ``Trainer(..., callbacks=[KforgeCallback("runs/my-run")])``.

Every rank records (the Trainer calls callbacks on every process; its own W&B/TensorBoard
integrations return early off rank 0). Steps are numbered as the Trainer counts optimizer steps:
``state.global_step`` after the step, 1 for the first, the ``step`` of ``trainer.state.log_history``.

What comes from where, and what it costs:

* step time and phases from the hooks, host wall time: ``data`` (from the end of the previous step
  to ``on_step_begin``: fetching the batches of the step, plus the Trainer's logging of the previous
  step), ``fwd_bwd`` (to ``on_pre_optimizer_step``: every micro-batch's forward and backward, and
  gradient clipping), ``optimizer`` (to ``on_optimizer_step``). Evaluation and checkpointing are left
  out of the step time (the clock restarts after ``on_evaluate`` and ``on_save``).
* lr: the optimizer's ``param_groups[0]["lr"]`` at ``on_optimizer_step`` (a Python float, every
  step; the value the Trainer logs as ``learning_rate``).
* loss and grad norm: what the Trainer logs (``on_log``), so at its ``logging_steps`` and with its
  meaning: ``loss`` is the mean over the steps since the previous log and over processes. The
  Trainer gives callbacks no per-step loss; ``logging_steps=1`` makes it log every step (its own
  ``.item()`` per step). This callback adds no device sync of its own.
* tokens: ``tokens_per_step=`` (per rank per optimizer step) when given; else, with
  ``TrainingArguments(include_num_input_tokens_seen=...)``, the step's increase of
  ``state.num_input_tokens_seen`` (already summed over processes, so only rank 0 counts it:
  ``counts_tokens`` defaults to rank 0); else none (tokens/s and MFU then null).
* eval metrics at ``on_evaluate`` as ``eval/<name>`` (``eval_loss`` -> ``eval/loss``); any other
  number the Trainer logs per step as ``hf/<key>`` (``hf/epoch`` ...; not its end-of-training
  ``train_*`` summary).
* hparams: ``TrainingArguments.to_dict()`` plus ``model_config`` (the model's config dict); model
  shape for FLOPs: ``n_params`` (the model's parameters without embeddings, plus the output head
  when tied), ``n_layers``, ``dim`` from the config and ``seq_len=`` (default: the config's
  ``max_position_embeddings``/``n_positions``; give the real training length). ``model=`` in the
  recorder keywords replaces all of it.
"""

from __future__ import annotations

import os

from kforge_record.integrations._common import Phases, need, number, plain
from kforge_record.recorder import Recorder

TrainerCallback = need("transformers", "transformers").TrainerCallback

_HANDLED = frozenset({"loss", "grad_norm", "learning_rate"})


def _first(cfg, *names):
    for n in names:
        v = getattr(cfg, n, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def model_shape(model, seq_len: int | None = None) -> dict | None:
    """kforge's model description of a transformers model, for FLOPs (None when it cannot tell)."""
    cfg = getattr(model, "config", None)
    count = getattr(model, "num_parameters", None)
    if cfg is None or count is None:
        return None
    layers = _first(cfg, "num_hidden_layers", "n_layer", "num_layers")
    dim = _first(cfg, "hidden_size", "n_embd", "d_model")
    seq = seq_len or _first(cfg, "max_position_embeddings", "n_positions", "n_ctx")
    if not (layers and dim and seq):
        return None
    n = int(count(exclude_embeddings=True))
    vocab = _first(cfg, "vocab_size")
    if getattr(cfg, "tie_word_embeddings", False) and vocab:
        n += dim * vocab  # the output head is the (excluded) embedding matrix, but it is a matmul
    return {"n_params": n, "n_layers": layers, "dim": dim, "seq_len": seq}


def _counts_global_tokens(args) -> bool:
    return getattr(args, "include_num_input_tokens_seen", "no") not in ("no", False, None)


class KforgeCallback(TrainerCallback):
    """A ``TrainerCallback`` that records the run with a kforge ``Recorder`` on every rank.

    ``recorder_kwargs`` go to ``Recorder`` (``tags=``, ``peak_tflops=``, ``model=``, ...); rank, world
    size, hparams and model default from the Trainer. The Recorder starts at ``on_train_begin``
    (``self.recorder``) and closes at ``on_train_end``.
    """

    def __init__(self, run_dir: str | os.PathLike, *, tokens_per_step: int | None = None,
                 seq_len: int | None = None, **recorder_kwargs):
        if tokens_per_step is not None and (isinstance(tokens_per_step, bool) or not isinstance(tokens_per_step, int)
                                            or tokens_per_step < 1):
            raise ValueError(f"tokens_per_step: must be a positive integer, got {tokens_per_step!r}")
        self.run_dir = os.fspath(run_dir)
        self.recorder: Recorder | None = None
        self._tokens_per_step = tokens_per_step
        self._seq_len = seq_len
        self._kw = recorder_kwargs
        self._phases: Phases | None = None
        self._lr = None
        self._seen = 0

    def _start(self, args, model) -> None:
        kw = dict(self._kw)
        kw.setdefault("rank", args.process_index)
        kw.setdefault("world_size", args.world_size)
        kw.setdefault("local_rank", args.local_process_index)
        if "hparams" not in kw:
            cfg = getattr(model, "config", None)
            kw["hparams"] = {**plain(args.to_dict()), "model_config": plain(cfg.to_dict()) if cfg is not None else None}
        if "model" not in kw and "flops_per_token" not in kw:
            shape = model_shape(model, self._seq_len)
            if shape is not None:
                kw["model"] = shape
        if self._tokens_per_step is None and _counts_global_tokens(args):
            kw.setdefault("counts_tokens", args.process_index == 0)
        self.recorder = Recorder(self.run_dir, **kw)
        self._phases = Phases(self.recorder)

    # -- the step ----------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.recorder is None:
            self._start(args, model)
        self._seen = state.num_input_tokens_seen or 0
        self.recorder.start_step()
        self._phases.enter("data")

    def on_step_begin(self, args, state, control, **kwargs):
        if self._phases is not None:
            self._phases.enter("fwd_bwd")

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if self._phases is not None:
            self._phases.enter("optimizer")

    def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        if self._phases is None:
            return
        self._phases.leave()
        try:
            self._lr = optimizer.param_groups[0]["lr"]
        except (AttributeError, IndexError, KeyError, TypeError):
            self._lr = None

    def on_step_end(self, args, state, control, **kwargs):
        if self.recorder is None:
            return
        self._phases.leave()
        tokens = self._tokens_per_step
        if tokens is None and _counts_global_tokens(args):
            seen = state.num_input_tokens_seen or 0
            tokens, self._seen = seen - self._seen, seen
        self.recorder.end_step(state.global_step, lr=self._lr, tokens=tokens)
        self._lr = None
        self._phases.enter("data")

    # -- values the Trainer logs -------------------------------------------------------------
    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.recorder is None or not logs:
            return
        extras = {}
        for k, v in logs.items():
            # eval_* come at on_evaluate; train_* and total_flos are the end-of-training summary.
            if k in _HANDLED or k.startswith(("eval_", "train_", "total_flos")) or (v := number(v)) is None:
                continue
            extras[f"hf/{k}"] = v
        loss, gn = number(logs.get("loss")), number(logs.get("grad_norm"))
        if loss is not None or gn is not None or extras:
            self.recorder.log(state.global_step, loss=loss, grad_norm=gn, **extras)

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if self.recorder is None:
            return
        vals = {}
        for k, v in (metrics or {}).items():
            if (v := number(v)) is not None:
                vals["eval/" + (k[5:] if k.startswith("eval_") else k)] = v
        if vals:
            self.recorder.log(state.global_step, **vals)
        self._restart()

    def on_save(self, args, state, control, **kwargs):
        self._restart()

    def _restart(self) -> None:
        if self.recorder is not None:
            self.recorder.start_step()
            self._phases.restart()

    def on_train_end(self, args, state, control, **kwargs):
        if self.recorder is not None:
            self._phases.leave()
            self.recorder.close()
            self.recorder = None
