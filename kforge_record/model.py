"""The model description recorded for FLOPs. Validated once, at construction."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

_SHAPE = ("n_layers", "dim", "n_heads", "n_kv_heads", "ffn_hidden_dim", "vocab_size", "seq_len")
_MOE = ("moe_num_experts", "moe_top_k", "moe_shared_experts", "moe_frequency")
MLP_KINDS = ("swiglu", "gelu")  # gated (3 matrices: gate, up, down) or plain (2: up, down, e.g. GPT-2)


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """What ingest needs to compute FLOPs per token. Give exactly one of:

    * ``flops_per_token``;
    * ``n_params`` with ``n_layers``, ``dim``, ``seq_len`` (6·N + 12·L·D·S);
    * the shape ``n_layers, dim, n_heads, n_kv_heads, ffn_hidden_dim, vocab_size, seq_len``,
      plus ``moe_num_experts, moe_top_k`` (and optionally ``moe_shared_experts``,
      ``moe_frequency``) for a mixture of experts, and ``mlp``: "swiglu" (the default: Llama,
      Mistral) or "gelu" (a plain two-matrix MLP: GPT-2, BERT), which the shape's FLOPs depend on.
    """

    flops_per_token: float | None = None
    n_params: float | None = None
    n_layers: int | None = None
    dim: int | None = None
    n_heads: int | None = None
    n_kv_heads: int | None = None
    ffn_hidden_dim: int | None = None
    vocab_size: int | None = None
    seq_len: int | None = None
    moe_num_experts: int | None = None
    moe_top_k: int | None = None
    moe_shared_experts: int | None = None
    moe_frequency: int | None = None
    mlp: str | None = None  # None reads as "swiglu"

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            _check_field(f.name, getattr(self, f.name))
        given = {f.name for f in dataclasses.fields(self) if getattr(self, f.name) is not None}
        if not given:
            raise ValueError("model: empty; give flops_per_token, or n_params with n_layers/dim/seq_len, or the shape")
        if self.flops_per_token is not None:
            return
        if self.n_params is not None:
            missing = [k for k in ("n_layers", "dim", "seq_len") if k not in given]
            if missing:
                raise ValueError(f"model: n_params also needs {', '.join(missing)} (for the attention term 12·L·D·S)")
            return
        self._check_shape(given)
        self._check_moe(given)

    def _check_shape(self, given: set[str]) -> None:
        missing = [k for k in _SHAPE if k not in given]
        if missing:
            raise ValueError(
                f"model: the shape is missing {', '.join(missing)} "
                "(or give flops_per_token, or n_params with n_layers/dim/seq_len)"
            )
        if self.n_heads and self.dim % self.n_heads:
            raise ValueError(f"model: dim {self.dim} is not divisible by n_heads {self.n_heads}")
        if self.n_kv_heads > self.n_heads or self.n_heads % self.n_kv_heads:
            raise ValueError(f"model: n_kv_heads {self.n_kv_heads} must divide n_heads {self.n_heads}")

    def _check_moe(self, given: set[str]) -> None:
        if not any(k in given for k in _MOE):
            return
        if self.moe_num_experts is None or self.moe_top_k is None:
            raise ValueError("model: a mixture of experts needs both moe_num_experts and moe_top_k")
        if self.moe_top_k > self.moe_num_experts:
            raise ValueError(f"model: moe_top_k {self.moe_top_k} exceeds moe_num_experts {self.moe_num_experts}")

    @classmethod
    def from_dict(cls, d: dict) -> "ModelSpec":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"model: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return cls(**d)

    def to_dict(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


def _check_field(name: str, v) -> None:
    """One field's type and range; None (not given) is always fine."""
    if v is None:
        return
    if name == "mlp":
        if v not in MLP_KINDS:
            raise ValueError(f"model: mlp must be one of {', '.join(map(repr, MLP_KINDS))}, got {v!r}")
        return
    if name in ("flops_per_token", "n_params"):  # large counts are often written 7e9
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"model: {name} must be a positive finite number, got {v!r}")
    elif isinstance(v, bool) or not isinstance(v, int) or v < (0 if name == "moe_shared_experts" else 1):
        raise ValueError(f"model: {name} must be a positive integer, got {v!r}")
