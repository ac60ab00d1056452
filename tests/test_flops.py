"""FLOPs per token and the peak table, against hand arithmetic."""

import pytest
from ingest_fixtures import LLAMA7B

from kforge_dash.ingest.inputs.flops import PEAK_TFLOPS, flops_per_token, peak_for_device


def test_llama7b_dense_shape_by_hand():
    L, D, F, V, S = 32, 4096, 11008, 32000, 4096
    per_layer = 4 * D * D + 3 * D * F  # Q, K, V, O (no GQA) + SwiGLU gate/up/down
    params = L * per_layer + D * V  # + output head; input embedding is a lookup, not a matmul
    assert params == 6_607_077_376  # the familiar "6.7B" minus the 131M input embedding
    fpt, source = flops_per_token(LLAMA7B)
    assert fpt == 6 * params + 12 * L * D * S
    assert "dense" in source


def test_gqa_shrinks_k_and_v_only():
    gqa = dict(LLAMA7B, n_kv_heads=8)
    full, _ = flops_per_token(LLAMA7B)
    small, _ = flops_per_token(gqa)
    D, L = 4096, 32
    # K and V each go from D x D to D x (8 heads x 128): 6 FLOPs per weight, 2 matrices, 32 layers.
    assert full - small == 6 * L * 2 * (D * D - D * 8 * 128)


def test_moe_shape_counts_only_active_experts():
    # Mixtral-like: 32 layers, every layer MoE, 8 experts, top-2, no shared expert.
    m = {"n_layers": 32, "dim": 4096, "n_heads": 32, "n_kv_heads": 8, "ffn_hidden_dim": 14336,
         "vocab_size": 32000, "seq_len": 4096, "moe_num_experts": 8, "moe_top_k": 2}
    D, F, L, S = 4096, 14336, 32, 4096
    attn = 2 * D * D + 2 * D * (8 * 128)
    per_layer = attn + 2 * 3 * D * F + D * 8  # two experts + router
    active = L * per_layer + D * 32000
    fpt, source = flops_per_token(m)
    assert fpt == 6 * active + 12 * L * D * S
    assert "moe" in source


def test_moe_every_other_layer_with_shared_expert():
    m = {"n_layers": 4, "dim": 64, "n_heads": 4, "n_kv_heads": 4, "ffn_hidden_dim": 128, "vocab_size": 100,
         "seq_len": 32, "moe_num_experts": 16, "moe_top_k": 2, "moe_shared_experts": 1, "moe_frequency": 2}
    attn, mlp = 4 * 64 * 64, 3 * 64 * 128
    dense_layer = attn + mlp
    moe_layer = attn + (2 + 1) * mlp + 64 * 16
    active = 2 * dense_layer + 2 * moe_layer + 64 * 100
    assert flops_per_token(m)[0] == 6 * active + 12 * 4 * 64 * 32


def test_n_params_and_explicit_flops():
    assert flops_per_token({"n_params": 1_000_000, "n_layers": 2, "dim": 8, "seq_len": 16}) == (
        6 * 1_000_000 + 12 * 2 * 8 * 16, "6*n_params+12*L*D*S")
    assert flops_per_token({"flops_per_token": 5e9}) == (5e9, "model.flops_per_token")
    assert flops_per_token(None) == (None, None)
    with pytest.raises(ValueError, match="seq_len"):
        flops_per_token({"n_params": 10, "n_layers": 2, "dim": 8})


def test_peak_table_exact_names_and_sources():
    assert peak_for_device("NVIDIA H100 80GB HBM3").tflops == 989
    assert peak_for_device("NVIDIA H100 PCIe").tflops == 756
    assert peak_for_device("NVIDIA H200").tflops == 989
    assert peak_for_device("NVIDIA A100-SXM4-80GB").tflops == 312
    for name, entry in PEAK_TFLOPS.items():
        assert entry.source.startswith("https://"), name
        assert entry.tflops > 0
    # Unknown, CPU, or a near miss: no guess.
    assert peak_for_device("NVIDIA H100") is None
    assert peak_for_device("x86_64") is None
    assert peak_for_device(None) is None
