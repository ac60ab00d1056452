"""Bad constructor arguments fail at construction, with a message naming the argument."""

import dataclasses

import pytest

from kforge_record import ModelSpec, Recorder

LLAMA_7B = dict(n_layers=32, dim=4096, n_heads=32, n_kv_heads=32, ffn_hidden_dim=11008, vocab_size=32000, seq_len=4096)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(model={"n_layer": 32}), ValueError, "unknown key.*n_layer"),
        (dict(model={"n_params": 7e9}), ValueError, "n_params also needs n_layers, dim, seq_len"),
        (dict(model={k: v for k, v in LLAMA_7B.items() if k != "vocab_size"}), ValueError, "missing vocab_size"),
        (dict(model={**LLAMA_7B, "n_kv_heads": 5}), ValueError, "n_kv_heads 5 must divide n_heads 32"),
        (dict(model={**LLAMA_7B, "moe_top_k": 2}), ValueError, "moe_num_experts and moe_top_k"),
        (dict(model={**LLAMA_7B, "moe_num_experts": 8, "moe_top_k": 9}), ValueError, "moe_top_k 9 exceeds"),
        (dict(model={"flops_per_token": -1.0}), ValueError, "flops_per_token must be a positive"),
        (dict(model={"flops_per_token": float("nan")}), ValueError, "flops_per_token"),
        (dict(model={}), ValueError, "model: empty"),
        (dict(model="llama"), TypeError, "model: must be a dict"),
        (dict(peak_tflops=0), ValueError, "peak_tflops"),
        (dict(flush_every_steps=0), ValueError, "flush_every_steps"),
        (dict(flush_every_s=-1), ValueError, "flush_every_s"),
        (dict(max_backlog_rows=0), ValueError, "max_backlog_rows"),
        (dict(close_timeout_s=True), ValueError, "close_timeout_s: must be a positive number of seconds, got True"),
        (dict(peak_tflops=True), ValueError, "peak_tflops: must be a positive finite number, got True"),
        (dict(rank=2, world_size=2), ValueError, "rank 2 is not below world_size 2"),
        (dict(rank=-1), ValueError, "rank"),
        (dict(tags="baseline"), TypeError, "tags"),
        (dict(hparams=[1, 2]), TypeError, "hparams"),
        (dict(counts_tokens="yes"), TypeError, "counts_tokens"),
    ],
)
def test_bad_arguments(tmp_path, kwargs, error, match):
    with pytest.raises(error, match=match):
        Recorder(tmp_path / "run", **kwargs)
    assert not (tmp_path / "run").exists(), "a rejected recorder leaves nothing on disk"


@pytest.mark.parametrize("model", [{"n_params": 7e9}, {}, {"n_layers": 32, "dim": 4096}], ids=["n_params", "empty", "shape"])
def test_an_incomplete_model_names_the_form_for_any_model(tmp_path, model):
    """A model that is not a transformer has no layers, width or sequence length to give: every refusal of an
    incomplete description names the form that fits it, and that form is accepted as written."""
    with pytest.raises(ValueError, match=r"model=dict\(flops_per_token=\.\.\.\)"):
        Recorder(tmp_path / "run", model=model)
    assert ModelSpec.from_dict(dict(flops_per_token=3 * 4.1e9)).to_dict() == {"flops_per_token": 3 * 4.1e9}


def test_run_dir_that_is_a_file(tmp_path):
    f = tmp_path / "run"
    f.write_text("x")
    with pytest.raises(NotADirectoryError, match="run"):
        Recorder(f)


def test_valid_model_descriptions_are_kept():
    assert ModelSpec(**LLAMA_7B).to_dict() == LLAMA_7B
    moe = ModelSpec(**LLAMA_7B, moe_num_experts=64, moe_top_k=6, moe_shared_experts=2, moe_frequency=1)
    assert moe.moe_top_k == 6
    assert ModelSpec(n_params=7_000_000_000, n_layers=32, dim=4096, seq_len=4096).n_params == 7_000_000_000
    with pytest.raises(dataclasses.FrozenInstanceError):
        moe.moe_top_k = 2  # frozen


def test_recorder_stays_light(tmp_path):
    """The training process gets pyarrow (and torch only if it already had it), nothing heavier."""
    import subprocess
    import sys

    code = f"""
import sys
from kforge_record import Recorder
with Recorder({str(tmp_path / 'run')!r}, rank=0, world_size=1) as rec:
    rec.end_step(1, loss=1.0)
heavy = [m for m in ("polars", "streamlit", "wandb", "tensorboard", "torch", "kforge_dash") if m in sys.modules]
print(heavy)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
