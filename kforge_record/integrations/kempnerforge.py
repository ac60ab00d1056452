"""KempnerForge's ``MetricsTracker`` call shape, recorded by kforge: swap one import.

    # from kempnerforge.metrics.tracker import MetricsTracker
    from kforge_record.integrations.kempnerforge import MetricsTracker

    tracker = MetricsTracker(config, num_gpus=world_size, run_dir="runs/my-run")
    tracker.start_step(); ...; tracker.end_step(step, loss, grad_norm, lr, tokens_in_step)
    tracker.log_eval({"eval/loss": v}, step); tracker.close()

Nothing is computed in the loop (tokens/s, MFU, memory, EMAs come at ingest) and ``end_step``
returns None (the original returns its StepMetrics on logging steps). ``tokens_in_step`` counts
every GPU, as KempnerForge passes it, so only rank 0 counts it (``counts_tokens``). The model
shape for FLOPs is taken from ``config.model`` when it has the usual fields (``n_layers``, ``dim``,
``n_heads``, ``n_kv_heads``, ``ffn_hidden_dim``/``hidden_dim``, ``vocab_size``) and
``config.train.seq_len``; ``model=`` overrides. ``gpu_peak_tflops`` becomes ``peak_tflops``.
"""

from __future__ import annotations

import dataclasses
import os

from kforge_record.integrations._common import plain
from kforge_record.recorder import Recorder

_SHAPE = {"n_layers": ("n_layers", "num_layers"), "dim": ("dim", "hidden_size"), "n_heads": ("n_heads",),
          "n_kv_heads": ("n_kv_heads",), "ffn_hidden_dim": ("ffn_hidden_dim", "hidden_dim"),
          "vocab_size": ("vocab_size",)}


def _as_dict(obj) -> dict:
    if obj is None:
        return {}
    if isinstance(obj, dict):
        return obj
    if dataclasses.is_dataclass(obj):
        return dataclasses.asdict(obj)
    return dict(getattr(obj, "__dict__", {}))


def _shape(config) -> dict | None:
    model = _as_dict(getattr(config, "model", None))
    seq = getattr(getattr(config, "train", None), "seq_len", None)
    out = {key: next((model[n] for n in names if isinstance(model.get(n), int)), None) for key, names in _SHAPE.items()}
    if out["n_kv_heads"] is None:
        out["n_kv_heads"] = out["n_heads"]  # multi-head attention: as many K/V heads as heads
    if None in out.values() or not isinstance(seq, int):
        return None
    return {**out, "seq_len": seq}


class MetricsTracker:
    """``MetricsTracker(config, num_gpus=1, gpu_peak_tflops=None, *, run_dir=...)``; other keywords go to
    ``Recorder``. ``run_dir`` defaults to ``config.metrics.kforge_dir`` when the config has one."""

    def __init__(self, config=None, num_gpus: int = 1, gpu_peak_tflops: float | None = None, *,
                 run_dir: str | os.PathLike | None = None, **recorder_kwargs):
        run_dir = run_dir or getattr(getattr(config, "metrics", None), "kforge_dir", None)
        if not run_dir:
            raise ValueError("run_dir: give MetricsTracker(..., run_dir='runs/my-run') (or config.metrics.kforge_dir)")
        kw = dict(recorder_kwargs)
        if gpu_peak_tflops is not None:
            kw.setdefault("peak_tflops", gpu_peak_tflops)
        if "model" not in kw:
            shape = _shape(config)
            if shape is not None:
                kw["model"] = shape
        kw.setdefault("hparams", plain(_as_dict(config)))
        rank = kw.get("rank")
        if rank is None:
            from kforge_record import env

            rank = env.detect_rank_world()[0]
        kw.setdefault("counts_tokens", rank == 0)  # tokens_in_step is already the sum over GPUs
        self.num_gpus = num_gpus
        self.recorder = Recorder(run_dir, **kw)

    def init_backends(self, config=None) -> None:
        """Nothing to start: kforge writes its shards from the first step (kept for the call shape)."""

    def start_step(self) -> None:
        self.recorder.start_step()

    def phase(self, name: str):
        """``with tracker.phase("data"):`` (kforge only): a phase timer of the current step."""
        return self.recorder.phase(name)

    def end_step(self, step: int, loss=None, grad_norm=None, lr=None, tokens_in_step=None, **scalars) -> None:
        self.recorder.end_step(step, loss=loss, grad_norm=grad_norm, lr=lr, tokens=tokens_in_step, **scalars)

    def log_eval(self, metrics: dict, step: int) -> None:
        self.recorder.log(step, **metrics)

    def close(self) -> None:
        self.recorder.close()
