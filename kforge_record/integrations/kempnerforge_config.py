"""What the KempnerForge drop-in reads from KempnerForge's own ``JobConfig``: the model shape for
FLOPs (as KempnerForge derives it), the logging interval, and where records go by default.

Only fields KempnerForge documents are read (``config.model.*``, ``config.train.seq_len``,
``config.metrics.log_interval``/``wandb_run_name``, ``config.checkpoint.dir``), by attribute or
by key, so a plain dict of the TOML's sections works too. KempnerForge itself is never imported here.
"""

from __future__ import annotations

import math
import os

from kforge_record.model import ModelSpec

ENV_DIR = "KFORGE_DIR"  # the run folder, when set: wins over the folder derived from checkpoint.dir
RECORDS_SUBDIR = "kforge"  # <checkpoint.dir>/kforge/<run name>: beside the checkpoints, on storage every rank sees
DEFAULT_LOG_INTERVAL = 10  # KempnerForge's MetricsConfig.log_interval default
_PLAIN_MLP = ("gelu", "relu")  # KempnerForge builds a 2-matrix MLP for these, SwiGLU (3) for silu


class ShapeError(ValueError):
    """Why the model shape cannot be derived from the config (the warning says it)."""


def field(obj, name: str):
    """``obj.name`` or ``obj[name]``; None when absent."""
    if obj is None:
        return None
    if isinstance(obj, dict):
        return obj.get(name)
    return getattr(obj, name, None)


def _count(model, name: str, default: int | None = None) -> int:
    v = field(model, name)
    if v is None and default is not None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ShapeError(f"config.model.{name} is {v!r}, not a positive integer")
    return v


def _multiplier(model, name: str) -> float:
    v = field(model, name)
    v = 1.0 if v is None else v  # KempnerForge's default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ShapeError(f"config.model.{name} is {v!r}, not a positive number")
    return float(v)


def ffn_width(model) -> int:
    """KempnerForge's ``computed_ffn_hidden_dim``: ``ffn_hidden_dim`` when set, else Llama's
    4·dim·2/3·ffn_dim_multiplier truncated to an int and rounded up to a multiple of 256."""
    given = field(model, "computed_ffn_hidden_dim")  # KempnerForge's own property, when the config has it
    if isinstance(given, int) and not isinstance(given, bool):
        return given
    if field(model, "ffn_hidden_dim") is not None:
        return _count(model, "ffn_hidden_dim")
    raw = int(4 * _count(model, "dim") * (2 / 3) * _multiplier(model, "ffn_dim_multiplier"))
    return 256 * math.ceil(raw / 256)


def expert_width(model, ffn: int) -> int:
    """KempnerForge's ``computed_expert_ffn_hidden_dim``: ffn·moe_expert_ffn_multiplier truncated,
    rounded to the nearest multiple of 16, at least 16 (= ffn with the default multiplier 1.0)."""
    given = field(model, "computed_expert_ffn_hidden_dim")
    if isinstance(given, int) and not isinstance(given, bool):
        return given
    raw = int(ffn * _multiplier(model, "moe_expert_ffn_multiplier"))
    return max(16, 16 * round(raw / 16))


def _mlp(model) -> str | None:
    act = field(model, "activation")
    act = None if act is None else str(getattr(act, "value", act))  # a StrEnum or its TOML string
    if act in (None, "silu"):
        return None  # SwiGLU, ModelSpec's default
    if act in _PLAIN_MLP:
        return "gelu"  # ModelSpec's name for a plain two-matrix MLP, whatever its activation
    raise ShapeError(f"config.model.activation is {act!r}: neither silu (SwiGLU) nor gelu/relu (two matrices)")


def _moe(model, ffn: int) -> dict:
    experts = field(model, "num_experts")
    if experts is None or experts == 0:
        return {}
    shape = {"moe_num_experts": _count(model, "num_experts"), "moe_top_k": _count(model, "moe_top_k", 2),
             "moe_frequency": _count(model, "moe_frequency", 1)}
    shared = field(model, "moe_shared_experts")
    if shared:
        if isinstance(shared, bool) or not isinstance(shared, int) or shared < 0:
            raise ShapeError(f"config.model.moe_shared_experts is {shared!r}, not an integer >= 0")
        shape["moe_shared_experts"] = shared
    width = expert_width(model, ffn)
    if width != ffn:
        shape["moe_ffn_hidden_dim"] = width
    return shape


def _seq_len(config, model) -> int:
    seq = field(field(config, "train"), "seq_len")
    if seq is None:  # as KempnerForge's estimate: the model's max_seq_len when no training length is given
        seq = field(model, "max_seq_len")
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        raise ShapeError(f"config.train.seq_len (or config.model.max_seq_len) is {seq!r}, not a positive integer")
    return seq


def model_shape(config) -> ModelSpec:
    """The model as KempnerForge's ``estimate_model_flops_per_token`` sees it; raises ShapeError
    naming the field when it cannot be derived."""
    model = field(config, "model")
    if model is None:
        raise ShapeError("the config has no model section (config.model)")
    n_heads = _count(model, "n_heads")
    shape = {"n_layers": _count(model, "n_layers"), "dim": _count(model, "dim"), "n_heads": n_heads,
             "n_kv_heads": _count(model, "n_kv_heads", n_heads),  # None: as many K/V heads as heads
             "vocab_size": _count(model, "vocab_size"), "seq_len": _seq_len(config, model)}
    shape["ffn_hidden_dim"] = ffn_width(model)
    mlp = _mlp(model)
    if mlp is not None:
        shape["mlp"] = mlp
    shape.update(_moe(model, shape["ffn_hidden_dim"]))
    try:
        return ModelSpec(**shape)
    except ValueError as e:
        raise ShapeError(str(e)) from None


def log_interval(config) -> int:
    """``config.metrics.log_interval`` (KempnerForge's default 10 when absent)."""
    v = field(field(config, "metrics"), "log_interval")
    if v is None:
        return DEFAULT_LOG_INTERVAL
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"config.metrics.log_interval: must be a positive integer, got {v!r}")
    return v


def _safe_name(name: str) -> str:
    name = name.replace(os.sep, "_").replace("/", "_").strip()
    return "" if name in (".", "..") else name


def default_run_dir(config) -> tuple[str, str]:
    """(run folder, how it was chosen) when ``run_dir=`` is not given: ``$KFORGE_DIR``, else
    ``<checkpoint.dir>/kforge/<name>`` with name = ``metrics.wandb_run_name`` or the checkpoint
    folder's own name. Raises ValueError saying what to set when neither is there."""
    env_dir = os.environ.get(ENV_DIR)
    if env_dir:
        return os.path.abspath(env_dir), f"${ENV_DIR}"  # absolute: the job may chdir later
    ckpt = field(field(config, "checkpoint"), "dir")
    if isinstance(ckpt, str) and ckpt.strip():
        wandb_name = field(field(config, "metrics"), "wandb_run_name")
        name = _safe_name(wandb_name) if isinstance(wandb_name, str) else ""
        how = "checkpoint.dir and metrics.wandb_run_name" if name else "checkpoint.dir"
        name = name or os.path.basename(os.path.normpath(os.path.abspath(ckpt)))
        return os.path.abspath(os.path.join(ckpt, RECORDS_SUBDIR, name)), how
    raise ValueError(f"run_dir: where should kforge record? Give MetricsTracker(config, ..., run_dir='runs/my-run') "
                     f"or set the environment variable {ENV_DIR}=runs/my-run (the config has no checkpoint.dir "
                     "to put the records beside)")
