"""The model description recorded for FLOPs, validated once at construction, and the FLOPs per
token it gives (here, not in ingest, because an adapter's in-loop line needs it too)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

_SHAPE = ("n_layers", "dim", "n_heads", "n_kv_heads", "ffn_hidden_dim", "vocab_size", "seq_len")
_MOE = ("moe_num_experts", "moe_top_k", "moe_shared_experts", "moe_frequency", "moe_ffn_hidden_dim")
# What every refusal of an incomplete description suggests: the form that fits any model.
_ANY_MODEL = "for any model (a transformer or not) give model=dict(flops_per_token=...)"
MLP_KINDS = ("swiglu", "gelu")  # gated (3 matrices: gate, up, down) or plain (2: up, down, e.g. GPT-2)


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """What ingest needs to compute FLOPs per token. Give exactly one of:

    * ``flops_per_token``;
    * ``n_params`` with ``n_layers``, ``dim``, ``seq_len`` (6·N + 12·L·D·S);
    * the shape ``n_layers, dim, n_heads, n_kv_heads, ffn_hidden_dim, vocab_size, seq_len``,
      plus ``moe_num_experts, moe_top_k`` (and optionally ``moe_shared_experts``,
      ``moe_frequency``, and ``moe_ffn_hidden_dim``: each expert's width when it is not
      ``ffn_hidden_dim``, fine-grained experts) for a mixture of experts, and ``mlp``: "swiglu" (the default: Llama,
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
    moe_ffn_hidden_dim: int | None = None  # None: experts are ffn_hidden_dim wide
    mlp: str | None = None  # None reads as "swiglu"

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            _check_field(f.name, getattr(self, f.name))
        given = {f.name for f in dataclasses.fields(self) if getattr(self, f.name) is not None}
        if not given:
            raise ValueError(f"model: empty; {_ANY_MODEL}, or n_params with n_layers/dim/seq_len, or the shape")
        if self.flops_per_token is not None:
            return
        if self.n_params is not None:
            missing = [k for k in ("n_layers", "dim", "seq_len") if k not in given]
            if missing:
                raise ValueError(f"model: n_params also needs {', '.join(missing)} (for the attention term 12·L·D·S "
                                 f"of a transformer); {_ANY_MODEL}")
            return
        self._check_shape(given)
        self._check_moe(given)

    def _check_shape(self, given: set[str]) -> None:
        missing = [k for k in _SHAPE if k not in given]
        if missing:
            raise ValueError(
                f"model: the shape is missing {', '.join(missing)}; {_ANY_MODEL}, "
                "or n_params with n_layers/dim/seq_len"
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


def n_moe_layers(spec: ModelSpec) -> int:
    """Layers that carry experts: every ``moe_frequency``-th layer (the freq-th, 2·freq-th, …; 1 = all), n_layers // freq."""
    if spec.moe_num_experts is None:
        return 0
    freq = spec.moe_frequency or 1
    return spec.n_layers // freq


def active_params(spec: ModelSpec) -> int:
    """Parameters a token's matmuls touch: attention Q/K/V/O + MLP per layer + output head.

    The MLP is SwiGLU (gate, up, down: 3·D·F) unless the model says mlp="gelu" (up, down: 2·D·F);
    a GPT-2 MLP described as SwiGLU with ffn_hidden_dim=4·dim counts a third matrix it lacks.

    The input embedding is a lookup (no matmul) and norms are negligible, so both are left out.
    On an MoE layer a token goes through top-k routed experts plus the shared ones (each
    ``moe_ffn_hidden_dim`` wide, else ``ffn_hidden_dim``), and the router (D·E).
    """
    d, f = spec.dim, spec.ffn_hidden_dim
    head_dim = d // spec.n_heads
    attn = d * d + 2 * d * (spec.n_kv_heads * head_dim) + d * d  # Q, K, V (GQA), O
    matrices = 2 if spec.mlp == "gelu" else 3
    mlp = matrices * d * f
    expert = matrices * d * (spec.moe_ffn_hidden_dim or f)
    moe_layers = n_moe_layers(spec)
    dense_layers = spec.n_layers - moe_layers
    per_moe_layer = attn + ((spec.moe_top_k or 0) + (spec.moe_shared_experts or 0)) * expert
    if moe_layers:
        per_moe_layer += d * spec.moe_num_experts  # router
    return dense_layers * (attn + mlp) + moe_layers * per_moe_layer + d * spec.vocab_size


def flops_per_token(model: dict | ModelSpec | None) -> tuple[float | None, str | None]:
    """(FLOPs per token, which rule gave it) from a model description; (None, None) if absent.

    PaLM's estimate (Chowdhery et al. 2022, appendix B): 6·N for the weight matmuls (forward +
    backward) plus 12·L·D·S for attention scores and values.
    """
    if model is None:
        return None, None
    spec = model if isinstance(model, ModelSpec) else ModelSpec.from_dict(model)
    if spec.flops_per_token is not None:
        return float(spec.flops_per_token), "model.flops_per_token"
    attention = 12 * spec.n_layers * spec.dim * spec.seq_len
    if spec.n_params is not None:
        return float(6 * spec.n_params + attention), "6*n_params+12*L*D*S"
    kind = "moe" if spec.moe_num_experts is not None else "dense"
    kind += f", {spec.mlp} MLP" if spec.mlp is not None else ""
    return float(6 * active_params(spec) + attention), f"shape ({kind}): 6*P_active+12*L*D*S"
