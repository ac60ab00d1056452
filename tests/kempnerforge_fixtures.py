"""KempnerForge's stand-in (tests/standins) and its shipped model shapes, for the drop-in's tests.

``SHIPPED``: every distinct ``[model]`` shape and ``train.seq_len`` of KempnerForge's configs/
(train/*.toml and model/*.toml, read with the ``fetch`` tool), as written there (fields left out
take KempnerForge's defaults), with the FLOPs per token KempnerForge's
``estimate_model_flops_per_token`` gives for it, worked out by ``kf_estimate`` below: its documented
formula, 6·P_active + 12·L·D·S, written here independently of kforge's code.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

STANDINS = Path(__file__).resolve().parent / "standins"

_L7 = dict(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim_multiplier=1.3)
_MOE = dict(dim=2048, n_layers=24, n_heads=16, n_kv_heads=4, vocab_size=128256, ffn_dim_multiplier=1.3,
            num_experts=8, moe_top_k=2, moe_frequency=1)
# name -> (model fields, train.seq_len, KempnerForge's FLOPs/token)
SHIPPED = {
    "debug": (dict(dim=256, n_layers=4, n_heads=4, n_kv_heads=4, vocab_size=32000), 512, 75_890_688),
    "debug_moe": (dict(dim=256, n_layers=4, n_heads=4, n_kv_heads=2, vocab_size=32000, num_experts=4, moe_top_k=2,
                       moe_frequency=2), 512, 81_395_712),
    "7b": (dict(_L7, vocab_size=128256), 4096, 51_470_401_536),  # also llama_7b, 7b_12gpu_tp4, 7b_16gpu_*, 7b_32gpu_fsdp
    "13b": (dict(dim=5120, n_layers=40, n_heads=40, n_kv_heads=8, vocab_size=128256, ffn_dim_multiplier=1.3), 4096,
            95_166_136_320),  # also llama_13b, 13b_32gpu_tp4_pp2
    "29b": (dict(dim=6144, n_layers=56, n_heads=48, n_kv_heads=8, vocab_size=128256, ffn_dim_multiplier=1.3), 4096,
            184_412_012_544),
    "70b": (dict(dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, vocab_size=128256, ffn_hidden_dim=28672), 4096,
            449_222_541_312),  # also llama_70b, 70b_32gpu_tp4_pp4
    "moe_24gpu": (_MOE, 4096, 18_185_453_568),  # also model/moe_small, moe_8gpu_stress, moe_ep_32gpu
    "hf_wikitext": (dict(dim=512, n_layers=8, n_heads=8, n_kv_heads=4, vocab_size=50257), 1024, 355_716_096),
    "vlm_7b": (dict(_L7, vocab_size=50257), 768, 44_319_006_720),  # also vlm_7b_ac, _moma, _mot
    "vlm_7b_cross_attn": (dict(_L7, vocab_size=50257), 512, 43_916_353_536),  # also vlm_7b_freeze_schedule
    "vlm_7b_siglip2": (dict(_L7, vocab_size=128256), 2304, 48_651_829_248),
    "vlm_7b_siglip2_cross_attn": (dict(_L7, vocab_size=128256), 2048, 48_249_176_064),
    "vlm_debug": (dict(dim=256, n_layers=4, n_heads=4, n_kv_heads=4, vocab_size=50257), 576, 104_719_872),
    "vlm_debug_moe": (dict(dim=256, n_layers=4, n_heads=4, n_kv_heads=2, vocab_size=50257, num_experts=4,
                           moe_frequency=2), 512, 109_438_464),
    "vlm_video_webvid": (dict(dim=1024, n_layers=12, n_heads=16, n_kv_heads=16, vocab_size=50257), 576, 1_318_557_696),
}


def kf_estimate(m: dict, seq_len: int) -> int:
    """KempnerForge's estimate_model_flops_per_token from its documentation: active parameters
    (Q, K, V, O; a SwiGLU MLP of 3·D·F with F = ffn_hidden_dim or 256·ceil(int(4·D·2/3·mult)/256);
    on every moe_frequency-th layer top_k + shared experts of the same width and no router; the
    output head) times 6, plus 12·L·D·S."""
    d, n_layers, heads = m["dim"], m["n_layers"], m["n_heads"]
    kv, head_dim = m.get("n_kv_heads") or heads, d // heads
    f = m.get("ffn_hidden_dim") or 256 * math.ceil(int(4 * d * (2 / 3) * m.get("ffn_dim_multiplier", 1.0)) / 256)
    attn = d * heads * head_dim + 2 * d * kv * head_dim + heads * head_dim * d
    mlp = 3 * d * f
    if m.get("num_experts", 0) > 0:
        moe = sum(1 for i in range(n_layers) if (i + 1) % m.get("moe_frequency", 1) == 0)
        experts = m.get("moe_top_k", 2) + m.get("moe_shared_experts", 0)
        active = (n_layers - moe) * (attn + mlp) + moe * (attn + experts * mlp)
    else:
        active = n_layers * (attn + mlp)
    return 6 * (active + m["vocab_size"] * d) + 12 * n_layers * d * seq_len


def router_flops(m: dict) -> int:
    """The router term kforge counts and KempnerForge leaves out: 6·D·E per MoE layer."""
    if not m.get("num_experts"):
        return 0
    return 6 * m["dim"] * m["num_experts"] * (m["n_layers"] // m.get("moe_frequency", 1))


def _forget() -> None:
    for name in [n for n in sys.modules if n == "kempnerforge" or n.startswith("kempnerforge.")]:
        del sys.modules[name]


@pytest.fixture(name="kempnerforge")
def kempnerforge_fixture(monkeypatch, tmp_path):
    """KempnerForge's stand-in importable for this test only, the working directory in tmp_path
    (records without run_dir= go to ./checkpoints/...), no KFORGE_DIR/RANK/WORLD_SIZE set.
    Yields the stand-in's config schema module."""
    _forget()
    monkeypatch.syspath_prepend(str(STANDINS))
    monkeypatch.chdir(tmp_path)
    for name in ("KFORGE_DIR", "RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    import kempnerforge.config.schema as schema

    yield schema
    _forget()
