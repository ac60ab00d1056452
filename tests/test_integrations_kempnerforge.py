"""The KempnerForge drop-in against KempnerForge's stand-in (tests/standins) and its shipped model
shapes: construction without run_dir, the model shape and FLOPs/token as KempnerForge computes
them, end_step's StepMetrics and printed line on log steps, and a record that stays raw."""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
import sys

import polars as pl
import pytest
import torch
from ingest_fixtures import warns_each
from kempnerforge_fixtures import SHIPPED, kempnerforge_fixture, kf_estimate, router_flops  # noqa: F401  (the fixture)

from kforge_dash import ingest_run
from kforge_dash.ingest.inputs.flops import flops_per_token
from kforge_record.integrations.kempnerforge import MetricsTracker

LINE = re.compile(r"^\[rank 0\] INFO     \[step (\d+)\] loss=(\S+) \| lr=(\S+) \| grad_norm=(\S+) \| tok/s=(\S+) \| "
                  r"mfu=(\S+)% \| mem=0\.0/0GB \| step_time=(\S+)s$")


def _meta(run) -> dict:
    (path,) = glob.glob(os.path.join(run, "rank-*", "*", "meta.json"))
    return json.load(open(path))


def _job(kf, seq_len=512, log_interval=5, ckpt="checkpoints/debug", wandb_run_name=None, enable_wandb=False, **model):
    return kf.JobConfig(model=kf.ModelConfig(**(model or SHIPPED["debug"][0])), train=kf.TrainConfig(seq_len=seq_len),
                        checkpoint=kf.CheckpointConfig(dir=ckpt),
                        metrics=kf.MetricsConfig(log_interval=log_interval, wandb_run_name=wandb_run_name,
                                                 enable_wandb=enable_wandb))


# -- where records go ------------------------------------------------------------------------------


def test_without_run_dir_records_beside_the_checkpoints_and_says_where(kempnerforge, tmp_path, capsys):
    tracker = MetricsTracker(_job(kempnerforge), num_gpus=1)
    for step in range(1, 4):
        tracker.start_step()
        tracker.end_step(step, 3.0, 1.0, 3e-4, 2048)
    tracker.close()
    run = tmp_path / "checkpoints" / "debug" / "kforge" / "debug"
    said = [ln for ln in capsys.readouterr().out.splitlines() if "kforge: recording to" in ln]
    assert said == [f"[rank 0] INFO     kforge: recording to {run} (from checkpoint.dir); after the job: kforge-ingest {run}"]
    res = ingest_run(str(run))
    assert res.summary["run_name"] == "debug" and res.summary["steps"] == 3


def test_kforge_dir_wins_and_wandb_run_name_names_the_folder(kempnerforge, tmp_path, monkeypatch, capsys):
    named = MetricsTracker(_job(kempnerforge, ckpt="ck/7b", wandb_run_name="sweep/lr-3e-4", enable_wandb=True))
    named.close()
    run = tmp_path / "ck" / "7b" / "kforge" / "sweep_lr-3e-4"
    assert os.path.isdir(run / "rank-00000")
    assert capsys.readouterr().out.splitlines() == [
        f"[rank 0] INFO     kforge: recording to {run} (from checkpoint.dir and metrics.wandb_run_name); after the job: "
        f"kforge-ingest {run} (it writes the wandb logs: nothing is sent live)"]
    monkeypatch.setenv("KFORGE_DIR", "elsewhere/run-a")
    env = MetricsTracker(_job(kempnerforge, ckpt="ck/7b"))
    env.close()
    assert env.recorder.run_dir == str(tmp_path / "elsewhere" / "run-a")
    assert os.path.isdir(tmp_path / "elsewhere" / "run-a" / "rank-00000")


def test_no_place_to_record_says_what_to_set_and_no_config_field(kempnerforge):
    with pytest.raises(ValueError) as e:
        MetricsTracker(None)
    msg = str(e.value)
    assert "run_dir=" in msg and "KFORGE_DIR" in msg
    assert "config." not in msg and "kforge_dir" not in msg  # KempnerForge's TOML loader rejects unknown fields


def test_a_non_zero_rank_prints_nothing_returns_step_metrics_and_does_not_count_tokens(kempnerforge, tmp_path,
                                                                                        monkeypatch, capsys):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    from kempnerforge.metrics.tracker import StepMetrics

    tracker = MetricsTracker(_job(kempnerforge), num_gpus=2)
    tracker.start_step()
    got = tracker.end_step(1, 3.0, 1.0, 3e-4, 4096)  # train.py all-reduces on log steps: every rank must get one
    tracker.close()
    assert isinstance(got, StepMetrics) and got.loss == 3.0
    assert capsys.readouterr().out == ""
    meta = _meta(str(tmp_path / "checkpoints" / "debug" / "kforge" / "debug"))
    assert meta["rank"] == 1 and meta["counts_tokens"] is False


# -- the model shape and FLOPs per token -----------------------------------------------------------


def test_the_written_kempnerforge_numbers_are_its_formula():
    # the literals in SHIPPED against the documented formula, and the debug_moe figure
    for name, (model, seq_len, kf_flops) in SHIPPED.items():
        assert kf_estimate(model, seq_len) == kf_flops, name
    assert SHIPPED["debug_moe"][2] == 81_395_712


@pytest.mark.parametrize("name", list(SHIPPED))
def test_flops_per_token_of_every_shipped_config_is_kempnerforges_plus_the_router(kempnerforge, tmp_path, name):
    model, seq_len, kf_flops = SHIPPED[name]
    tracker = MetricsTracker(_job(kempnerforge, seq_len=seq_len, **model), run_dir=str(tmp_path / name))
    tracker.close()
    recorded = _meta(str(tmp_path / name))["model"]
    ours, source = flops_per_token(recorded)
    assert ours == kf_flops + router_flops(model)  # kforge counts the router's D·E per MoE layer, KempnerForge does not
    assert abs(ours / kf_flops - 1) < 1e-3
    assert ("moe" in source) == bool(model.get("num_experts"))


# A loop of no work: the FLOPs a step claims far exceed the peak over the few ms of wall clock the goodput
# timeline has, so the MFU waterfall says so (what this test checks is elsewhere).
@pytest.mark.filterwarnings("ignore:mfu_waterfall. the FLOPs done exceed the peak:UserWarning")
def test_moe_config_ingests_with_mfu(kempnerforge, tmp_path):
    model, seq_len, kf_flops = SHIPPED["debug_moe"]
    run = str(tmp_path / "moe")
    tracker = MetricsTracker(_job(kempnerforge, seq_len=seq_len, **model), num_gpus=1, gpu_peak_tflops=100.0, run_dir=run)
    for step in range(1, 4):
        tracker.start_step()
        tracker.end_step(step, 3.0, 1.0, 3e-4, 2048)
    tracker.close()
    res = ingest_run(run)
    assert res.summary["flops_per_token"] == kf_flops + 6 * 256 * 4 * 2 == 81_408_000
    df = pl.read_parquet(os.path.join(run, "ingested", "steps.parquet"))
    assert df["mfu"].to_list() == pytest.approx((81_408_000 * df["tokens_per_sec"] / 100e12).to_list())


def test_kempnerforge_width_rules(kempnerforge, tmp_path):
    """ffn_dim_multiplier rounding, fine-grained experts, shared experts and a plain (gelu) MLP."""
    kf = kempnerforge
    cfg = _job(kf, dim=2048, n_layers=4, n_heads=16, n_kv_heads=4, vocab_size=1000, ffn_dim_multiplier=1.3,
               num_experts=8, moe_top_k=2, moe_shared_experts=1, moe_expert_ffn_multiplier=0.5, activation="gelu")
    MetricsTracker(cfg, run_dir=str(tmp_path / "a")).close()
    m = _meta(str(tmp_path / "a"))["model"]
    # int(4*2048*2/3*1.3) = 7099 -> 7168 (next multiple of 256); experts: int(7168*0.5) = 3584 (a multiple of 16)
    assert (m["ffn_hidden_dim"], m["moe_ffn_hidden_dim"], m["moe_shared_experts"], m["mlp"]) == (7168, 3584, 1, "gelu")
    attn = 2 * 2048 * 2048 + 2 * 2048 * 4 * 128
    per_layer = attn + (2 + 1) * 2 * 2048 * 3584 + 2048 * 8  # top-2 + 1 shared expert, two matrices each, + router
    assert flops_per_token(m)[0] == 6 * (4 * per_layer + 2048 * 1000) + 12 * 4 * 2048 * 512


def test_the_configs_own_computed_width_wins(kempnerforge, tmp_path):
    @dataclasses.dataclass
    class Model(kempnerforge.ModelConfig):
        @property
        def computed_ffn_hidden_dim(self) -> int:  # a KempnerForge whose rounding changed
            return 1000

    cfg = kempnerforge.JobConfig(model=Model(dim=256, n_layers=2, n_heads=4, vocab_size=100))
    MetricsTracker(cfg, run_dir=str(tmp_path / "r")).close()
    assert _meta(str(tmp_path / "r"))["model"]["ffn_hidden_dim"] == 1000


@pytest.mark.parametrize("field, value, named", [
    ("dim", "256", "config.model.dim is '256'"),
    ("activation", "swish", "config.model.activation is 'swish'"),
    ("n_kv_heads", 3, "n_kv_heads 3 must divide n_heads 4"),
    ("ffn_dim_multiplier", 0.0, "config.model.ffn_dim_multiplier is 0.0"),
])
def test_a_shape_it_cannot_derive_is_warned_naming_the_cause(kempnerforge, tmp_path, field, value, named):
    model = dict(SHIPPED["debug"][0], **{field: value})
    with pytest.warns(RuntimeWarning, match=re.escape(named) + r".*MFU|MFU.*" + re.escape(named)):
        tracker = MetricsTracker(_job(kempnerforge, **model), run_dir=str(tmp_path / "r"))
    tracker.close()
    assert _meta(str(tmp_path / "r"))["model"] is None


# -- end_step: KempnerForge's StepMetrics and line on log steps, a raw record ----------------------


# A loop of no work: the FLOPs a step claims far exceed the peak over the few ms of wall clock the goodput
# timeline has, so the MFU waterfall says so (what this test checks is elsewhere).
@pytest.mark.filterwarnings("ignore:mfu_waterfall. the FLOPs done exceed the peak:UserWarning")
def test_end_step_returns_kempnerforges_step_metrics_on_log_steps_only(kempnerforge, tmp_path, capsys, monkeypatch):
    from kempnerforge.metrics.tracker import StepMetrics

    items = []
    real_item = torch.Tensor.item
    monkeypatch.setattr(torch.Tensor, "item", lambda t: items.append(1) or real_item(t))
    run = str(tmp_path / "r")
    model, seq_len, kf_flops = SHIPPED["debug"]
    tracker = MetricsTracker(_job(kempnerforge, seq_len=seq_len, log_interval=5), num_gpus=2, gpu_peak_tflops=50.0,
                             run_dir=run)
    losses, got = [3.0 - s / 16 for s in range(1, 13)], {}
    for step, loss in enumerate(losses, start=1):
        tracker.start_step()
        before = len(items)
        got[step] = tracker.end_step(step, torch.tensor(loss), torch.tensor(0.5), 3e-4, 8192)
        assert len(items) - before == (2 if step in (1, 5, 10) else 0)  # .item() on log steps only
    tracker.close()
    assert [s for s, m in got.items() if m is not None] == [1, 5, 10]
    for step in (1, 5, 10):
        m = got[step]
        assert type(m) is StepMetrics
        assert (m.loss, m.grad_norm, m.lr) == (pytest.approx(losses[step - 1]), 0.5, 3e-4)
        assert m.step_time_sec > 0 and m.tokens_per_sec == pytest.approx(8192 / m.step_time_sec)
        assert m.mfu == pytest.approx(kf_flops * m.tokens_per_sec / 1e12 / (2 * 50.0))
        assert (m.allocated_gb, m.peak_gb, m.total_gb) == (0, 0, 0)
    lines = [LINE.match(ln) for ln in capsys.readouterr().out.splitlines() if "[step " in ln]
    assert [int(x.group(1)) for x in lines] == [1, 5, 10]
    for x in lines:
        m = got[int(x.group(1))]
        assert x.group(2, 3, 4) == (f"{m.loss:.4f}", "3.00e-04", "0.500")
        assert x.group(5, 6, 7) == (f"{m.tokens_per_sec:,.0f}", f"{m.mfu * 100:.1f}", f"{m.step_time_sec:.2f}")
    df = pl.read_parquet(os.path.join(run, "rank-00000", "*", "*.parquet"))  # the record: every step, raw
    assert df["step"].to_list() == list(range(1, 13)) and df["loss"].to_list() == pytest.approx(losses)
    assert "tokens_per_sec" not in df.columns and "mfu" not in df.columns
    ingest_run(run)
    steps = pl.read_parquet(os.path.join(run, "ingested", "steps.parquet"))
    assert steps["tokens_per_sec"].to_list() == pytest.approx((steps["tokens"] / steps["step_time_s"]).to_list())


def test_log_eval_records_and_prints_and_never_raises(kempnerforge, tmp_path, capsys):
    run = str(tmp_path / "r")
    tracker = MetricsTracker(_job(kempnerforge), run_dir=run)
    tracker.start_step()
    tracker.end_step(1, 3.0, 1.0, 3e-4, 2048)
    tracker.log_eval({"moe/aux_loss": 0.25}, 1)
    with pytest.warns(RuntimeWarning, match="log_eval failed"):
        tracker.log_eval({"step": 2.0}, 1)  # a name that collides with the step argument
    tracker.close()
    assert "[rank 0] INFO     [step 1] moe/aux_loss=0.2500" in capsys.readouterr().out.splitlines()
    ingest_run(run)
    steps = pl.read_parquet(os.path.join(run, "ingested", "steps.parquet"))
    assert steps["moe/aux_loss"].to_list() == [0.25]


def test_without_kempnerforge_installed_end_step_returns_none_and_says_why(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "kempnerforge", None)  # import kempnerforge... raises ImportError
    with warns_each("KempnerForge's metrics modules cannot be imported", "no model shape recorded", category=RuntimeWarning):
        tracker = MetricsTracker(None, run_dir=str(tmp_path / "r"))
    tracker.start_step()
    assert tracker.end_step(1, 3.0, 1.0, 3e-4, 2048) is None
    tracker.close()
    assert ingest_run(str(tmp_path / "r")).summary["steps"] == 1
