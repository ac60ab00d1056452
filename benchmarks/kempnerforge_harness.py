"""The harness module of benchmarks/side_by_side_kempnerforge.py, copied beside its copy of KempnerForge's
scripts/train.py as kf_harness.py (imported from there, where KempnerForge is on the path): CPU for the
three CUDA assumptions on its 2-rank path, the tee of its own tracker and kforge's drop-in, the jitter."""

import json
import logging
import os
import random
import time

import kempnerforge.distributed.setup as _setup
import kempnerforge.resilience.health as _health
import torch
from kempnerforge.metrics.tracker import _LoggingBackend

# CPU-only torch: the three CUDA assumptions on KempnerForge's 2-rank path
torch.cuda.set_device = lambda *a, **k: None
_init_device_mesh = _setup.init_device_mesh
_setup.init_device_mesh = lambda device_type, *a, **k: _init_device_mesh("cpu", *a, **k)


class _TorchOnCpu:
    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def tensor(*a, device=None, **k):
        return torch.tensor(*a, device="cpu" if device == "cuda" else device, **k)


_health.torch = _TorchOnCpu()


class JsonLines(_LoggingBackend):
    """What KempnerForge's tracker logs to its backends, one JSON line per logged step."""

    def __init__(self, path):
        self._f = open(path, "w")

    def log(self, metrics, step):
        self._f.write(json.dumps({"step": step, **metrics}) + "\n")

    def close(self):
        self._f.close()


class Tee:
    """KempnerForge's own tracker and kforge's drop-in at the same calls; returns KempnerForge's."""

    def __init__(self, own, kforge):
        self.own, self.kforge = own, kforge
        quiet = logging.getLogger("kf_harness.quiet")
        quiet.disabled = True
        if kforge._kf is not None:
            kforge._kf.logger = quiet  # rank 0 prints KempnerForge's own line once
        if int(os.environ.get("RANK", "0")) == 0:
            own._backends.append(JsonLines(os.environ["KF_OWN_LOG"]))
        self._jitter_s = float(os.environ.get("KFORGE_JITTER_MS", "0")) / 1000
        self._rng = random.Random(1000 + int(os.environ.get("RANK", "0")))  # torch's RNG untouched
        self.calls_s = 0.0  # time in kforge's start_step and end_step calls

    def init_backends(self, config):
        self.own.init_backends(config)
        self.kforge.init_backends(config)

    def start_step(self):
        self.own.start_step()
        t = time.perf_counter()
        self.kforge.start_step()
        self.calls_s += time.perf_counter() - t
        if self._jitter_s:
            time.sleep(self._rng.uniform(0, self._jitter_s))

    def end_step(self, step, loss, grad_norm, lr, tokens_in_step):
        t = time.perf_counter()
        self.kforge.end_step(step, loss, grad_norm, lr, tokens_in_step)
        self.calls_s += time.perf_counter() - t  # kforge's calls: inside KempnerForge's window
        return self.own.end_step(step, loss, grad_norm, lr, tokens_in_step)

    def log_eval(self, metrics, step):  # eval, MoE, per-dataset values (none in this config)
        self.kforge.log_eval(metrics, step)
        self.own.log_eval(metrics, step)

    def close(self):
        self.kforge.close()
        self.own.close()
        if int(os.environ.get("RANK", "0")) == 0:
            with open(os.environ["KF_OWN_LOG"] + ".calls", "w") as f:
                json.dump({"kforge_calls_s": self.calls_s}, f)
