"""KempnerForge's ``MetricsTracker``, recorded by kforge: swap one import, nothing else.

    # from kempnerforge.metrics.tracker import MetricsTracker
    from kforge_record.integrations.kempnerforge import MetricsTracker

    tracker = MetricsTracker(config, num_gpus=world_size)       # as before
    tracker.init_backends(config)
    tracker.start_step(); ...; m = tracker.end_step(step, loss, grad_norm, lr, tokens_in_step)
    tracker.log_eval({"eval/loss": v}, step); tracker.close()

Records go to ``run_dir=`` when given, else to ``$KFORGE_DIR``, else to
``<checkpoint.dir>/kforge/<metrics.wandb_run_name or the checkpoint folder's name>`` (beside the
checkpoints: every rank sees that storage, and an auto-resume from the same checkpoints records
into the same run). Rank 0 prints where, once.

The model shape for FLOPs comes from ``config.model`` as KempnerForge derives it (its
``computed_ffn_hidden_dim``, the MoE fields) and ``config.train.seq_len``; ``model=`` overrides;
a config it cannot read is warned about, naming the field. ``tokens_in_step`` counts every GPU,
as KempnerForge passes it, so only rank 0 counts it (``counts_tokens``). ``gpu_peak_tflops``
becomes ``peak_tflops``; other keywords go to ``Recorder``.

On log steps ``end_step`` returns KempnerForge's own ``StepMetrics`` (so its ``scripts/train.py``
still logs MoE, VLM and per-dataset metrics) and rank 0 prints KempnerForge's line; see
``MetricsTracker.end_step``. The recorded rows stay raw; tokens/s, MFU, memory and EMAs of the
record are derived at ingest.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from time import perf_counter
from types import SimpleNamespace

from kforge_record import env
from kforge_record.integrations._common import plain
from kforge_record.integrations.kempnerforge_config import ShapeError, default_run_dir, field, log_interval, model_shape
from kforge_record.integrations.kempnerforge_replicas import NoReplicas, local_params, replica_name
from kforge_record.model import flops_per_token
from kforge_record.recorder import Recorder
from kforge_record.warn import Warner


def _as_dict(obj) -> dict:
    if obj is None:
        return {}
    if isinstance(obj, dict):
        return obj
    if dataclasses.is_dataclass(obj):
        return dataclasses.asdict(obj)
    return dict(getattr(obj, "__dict__", {}))


def _kempnerforge(warn: Warner):
    """KempnerForge's own StepMetrics, line formatter, logger and memory/peak helpers, imported
    now (at construction, not at import of this module); None, warned, when it is not installed."""
    try:
        from kempnerforge.metrics.logger import format_metrics, get_logger
        from kempnerforge.metrics.memory import get_memory_stats, get_memory_utilization
        from kempnerforge.metrics.mfu import get_gpu_peak_tflops
        from kempnerforge.metrics.tracker import StepMetrics
    except Exception as e:  # not installed, or a KempnerForge without these names
        warn("no-kempnerforge", f"KempnerForge's metrics modules cannot be imported ({e!r}): end_step returns None "
             "and prints no per-step line; the record is not affected")
        return None
    return SimpleNamespace(StepMetrics=StepMetrics, format_metrics=format_metrics,
                           logger=get_logger("kempnerforge.metrics.tracker"), memory_stats=get_memory_stats,
                           memory_utilization=get_memory_utilization, peak_tflops=get_gpu_peak_tflops)


def _rank_world(kw: dict, warn: Warner) -> int:
    """This process's rank (and world size into ``kw`` when torch.distributed cannot say it)."""
    if kw.get("rank") is not None:
        return kw["rank"]
    try:
        return env.detect_rank_world()[0]
    except Exception as e:  # torch.distributed says initialized but cannot answer
        rank, world = (_env_int(k, d) for k, d in (("RANK", 0), ("WORLD_SIZE", 1)))
        warn("rank", f"torch.distributed could not give the rank and world size ({e!r}); "
             f"using RANK/WORLD_SIZE from the environment: rank {rank} of {world}")
        kw["rank"] = rank
        kw.setdefault("world_size", world)
        return rank


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name) or default)
    except ValueError:
        return default


def _number(v) -> float:
    """A loss/grad norm/lr as a Python float: ``.item()`` of a tensor (a device sync), NaN for None."""
    if v is None:
        return float("nan")
    item = getattr(v, "item", None)
    return float(item() if callable(item) else v)


class MetricsTracker:
    """``MetricsTracker(config, num_gpus=1, gpu_peak_tflops=None, *, run_dir=None, **recorder_kwargs)``.

    KempnerForge's signature; ``run_dir`` defaults as the module says. ``_backends`` is kept (always
    empty: kforge has no live backends, ``kforge-ingest`` writes TensorBoard and W&B afterwards).
    """

    def __init__(self, config=None, num_gpus: int = 1, gpu_peak_tflops: float | None = None, *,
                 run_dir: str | os.PathLike | None = None, **recorder_kwargs):
        self._warn = Warner("kempnerforge")
        how = "run_dir="
        if not run_dir:
            run_dir, how = default_run_dir(config)
        self.log_interval = log_interval(config)
        kw = dict(recorder_kwargs)
        if gpu_peak_tflops:  # KempnerForge reads 0/None as "detect it"
            kw.setdefault("peak_tflops", gpu_peak_tflops)
        if "model" not in kw:
            try:
                kw["model"] = model_shape(config)
            except ShapeError as e:
                self._warn("model", f"no model shape recorded, so MFU will be null: {e} "
                           "(pass model={...} to MetricsTracker to give it)")
        kw.setdefault("hparams", plain(_as_dict(config)))
        rank = _rank_world(kw, self._warn)
        kw.setdefault("counts_tokens", rank == 0)  # tokens_in_step is already the sum over GPUs
        self.num_gpus = num_gpus
        self._kf = _kempnerforge(self._warn)
        self._peak = gpu_peak_tflops or (self._kf.peak_tflops() if self._kf else None)  # as KempnerForge does
        self.recorder = Recorder(run_dir, **kw)
        self._backends: list = []
        self._fpt = flops_per_token(self.recorder.model)[0]
        self._config = config
        self._replicas = None  # (model, every, checksum name): watch_replicas
        self._t_start = perf_counter()
        if self.recorder.rank == 0:
            metrics = field(config, "metrics")
            live = [n for n in ("wandb", "tensorboard") if field(metrics, f"enable_{n}") is True]
            self._say(f"kforge: recording to {os.path.abspath(self.recorder.run_dir)} (from {how}); "
                      f"after the job: kforge-ingest {self.recorder.run_dir}"
                      + (f" (it writes the {' and '.join(live)} logs: nothing is sent live)" if live else ""))

    def _say(self, line: str) -> None:
        if self._kf is not None:
            self._kf.logger.info(line)
        else:
            print(line, file=sys.stderr, flush=True)

    def init_backends(self, config=None) -> None:
        """Nothing to start: kforge writes its shards from the first step (kept for the call shape)."""

    def start_step(self) -> None:
        self._t_start = perf_counter()
        self.recorder.start_step()

    def phase(self, name: str):
        """``with tracker.phase("data"):`` (kforge only): a phase timer of the current step."""
        return self.recorder.phase(name)

    def watch_replicas(self, model, every: int | None = None) -> bool:
        """(kforge only) Record ``model``'s parameter checksum (kforge_record.replica.param_checksum: one
        memory-bound read of the parameters on their device, no sync) every ``every`` steps (default: the
        log interval), under the name of this rank's replica group in ``config.distributed``
        (kempnerforge_replicas.py), for ingest's ``replica_divergence`` check. False, warned, when the
        layout has no replicas to compare (plain FSDP: dp_replicate 1). Call it after the model is sharded."""
        try:
            name = replica_name(self._config, self.recorder.rank, self.recorder.world_size)
        except NoReplicas as e:
            self._warn("replicas", f"no parameter checksum recorded: {e}")
            return False
        self._replicas = (model, every or self.log_interval, name)
        return True

    def _checksum(self, step: int) -> dict:
        if self._replicas is None or step % self._replicas[1]:
            return {}
        from kforge_record.replica import param_checksum

        model, _, name = self._replicas
        try:
            value = param_checksum(local_params(model))
        except Exception as e:  # never into the loop
            self._warn(f"checksum:{type(e).__name__}", f"the parameter checksum could not be taken: {e!r}")
            return {}
        return {} if value is None else {name: value}

    def end_step(self, step: int, loss=None, grad_norm=None, lr=None, tokens_in_step=None, **scalars):
        """Record the step (raw values, no device sync). On a log step (``step % log_interval == 0``,
        and step 1) return KempnerForge's ``StepMetrics`` on every rank, filled as KempnerForge
        fills it from this rank's own step (time since ``start_step``, tokens/s, MFU with
        ``num_gpus`` and the peak, allocated/peak/reserved memory), and print its line on rank 0:
        that reads loss, grad norm and lr with ``.item()`` (a device sync) on log steps only, as
        KempnerForge itself does. Other steps: None. Never raises into the loop."""
        t = perf_counter()
        self.recorder.end_step(step, loss=loss, grad_norm=grad_norm, lr=lr, tokens=tokens_in_step,
                               **{**scalars, **self._checksum(step)})
        if self._kf is None:
            return None
        try:
            if step % self.log_interval and step != 1:
                return None
            return self._step_metrics(step, t - self._t_start, loss, grad_norm, lr, tokens_in_step)
        except Exception as e:  # the loop must go on
            self._warn(f"end_step:{type(e).__name__}", f"KempnerForge's StepMetrics could not be made: {e!r}")
            return None

    def _step_metrics(self, step: int, step_time: float, loss, grad_norm, lr, tokens):
        kf = self._kf
        tokens_per_sec = _number(tokens or 0) / step_time if step_time > 0 else 0.0
        mfu = 0.0
        if self._fpt and self._peak and self.num_gpus:
            mfu = self._fpt * tokens_per_sec / 1e12 / (self._peak * self.num_gpus)
        mem = kf.memory_stats()
        m = kf.StepMetrics(loss=_number(loss), grad_norm=_number(grad_norm), lr=_number(lr),
                           tokens_per_sec=tokens_per_sec, mfu=mfu, step_time_sec=step_time,
                           allocated_gb=mem["allocated_gb"], peak_gb=mem["peak_gb"], reserved_gb=mem["reserved_gb"],
                           total_gb=mem["total_gb"], mem_utilization=kf.memory_utilization())
        if self.recorder.rank == 0:
            kf.logger.info(kf.format_metrics(step, {
                "loss": f"{m.loss:.4f}", "lr": f"{m.lr:.2e}", "grad_norm": f"{m.grad_norm:.3f}",
                "tok/s": f"{m.tokens_per_sec:,.0f}", "mfu": f"{m.mfu:.1%}",
                "mem": f"{m.peak_gb:.1f}/{m.total_gb:.0f}GB", "step_time": f"{m.step_time_sec:.2f}s"}))
        return m

    def log_eval(self, metrics: dict, step: int) -> None:
        """Record ``metrics`` at ``step`` (eval, MoE, per-dataset values); rank 0 prints them as KempnerForge does."""
        try:
            self.recorder.log(step, **metrics)
            if self._kf is not None and self.recorder.rank == 0:
                self._kf.logger.info(self._kf.format_metrics(step, metrics))
        except Exception as e:  # a "step" key, a non-str key, an unprintable value: never into the loop
            self._warn(f"log_eval:{type(e).__name__}", f"log_eval failed: {e!r}")

    def close(self) -> None:
        self.recorder.close()
