"""Cross-rank reductions, restarts, MFU: shards from the real Recorder, expectations by hand."""

import glob
import json
import math
import os
import statistics

import pytest
from findings_fixtures import Clock, drive, install
from ingest_fixtures import LLAMA7B, close_all, ingest_whole_and_windowed, open_ranks, read_outputs, run_steps

from kforge_dash.ingest.options import IngestOptions, IngestWarning
from kforge_dash.ingest.run import ingest_run


def test_cross_rank_max_min_median_slowest_tokens(tmp_path, monkeypatch):
    run = str(tmp_path / "run")
    W = 4
    dt = {0: 0.50, 1: 0.75, 2: 0.25, 3: 0.5}  # rank 1 is the straggler; its lead varies by step below
    recs = open_ranks(run, W, model={"flops_per_token": 1e9}, peak_tflops=100.0)

    def step_time(r, s):
        return dt[r] + (0.5 if (r == 3 and s % 5 == 0) else 0.0)  # rank 3 stalls every 5th step

    def values(r, s):
        return {"loss": float(s + r), "grad_norm": None if r == 0 else 10.0 * r, "lr": 1e-3 * (r + 1),
                "tokens": 100 * (r + 1), "acc": float(r)}

    run_steps(monkeypatch, recs, range(1, 21), step_time=step_time, values=values)
    close_all(recs)
    ingest_run(run)
    steps, ranks, summary = read_outputs(run)

    assert steps["step"].to_list() == list(range(1, 21))
    assert ranks.height == 20 * W
    for row in steps.iter_rows(named=True):
        s = row["step"]
        times = {r: step_time(r, s) for r in range(W)}
        assert row["step_work_s"] == pytest.approx(max(times.values()))
        assert row["step_work_min_s"] == pytest.approx(min(times.values()))
        assert row["step_work_median_s"] == pytest.approx(statistics.median(times.values()))
        slowest = min(r for r in times if times[r] == max(times.values()))
        assert row["slowest_rank"] == slowest
        assert row["n_ranks"] == W
        assert row["tokens"] == sum(100 * (r + 1) for r in range(W))
        assert row["tokens_per_sec"] == pytest.approx(row["tokens"] / row["step_time_s"])  # the period
        assert row["loss"] == pytest.approx(sum(s + r for r in range(W)) / W)
        assert row["grad_norm"] == 10.0  # rank 0 reports none: the lowest reporting rank is 1
        assert row["lr"] == pytest.approx(1e-3)
        assert row["acc"] == pytest.approx(sum(range(W)) / W)
    assert summary["tokens"] == 20 * 1000
    assert summary["ranks"] == list(range(W))
    assert summary["restarts"] == []
    assert summary["wall_time_s"] == pytest.approx(sum(r["step_time_s"] for r in steps.iter_rows(named=True)))


def _ddp_steps(monkeypatch, run: str, world_size: int, steps, step_s: float, values, **kw) -> None:
    """Ranks stepping together on one fake clock (step times and end times alike), as under DDP:
    the job's step time (the period between step ends) is ``step_s``."""
    clock = install(monkeypatch, Clock())
    recs = open_ranks(run, world_size, **kw)
    drive(recs, steps, clock, phases=lambda r, s: [("fwd_bwd", step_s)], values=values)
    close_all(recs)


def test_mfu_llama7b_by_hand(tmp_path, monkeypatch):
    """8 H100s at a known throughput: 8 ranks x 4 x 4096 tokens per 2.0 s step."""
    run = str(tmp_path / "llama")
    W, seq, batch, step_s = 8, 4096, 4, 2.0
    _ddp_steps(monkeypatch, run, W, range(1, 6), step_s, lambda r, s: {"loss": 2.0, "tokens": batch * seq}, model=LLAMA7B)

    L, D, F, V = 32, 4096, 11008, 32000
    fpt = 6 * (L * (4 * D * D + 3 * D * F) + D * V) + 12 * L * D * seq
    tokens_per_sec = W * batch * seq / step_s
    expected = fpt * tokens_per_sec / (W * 989.0 * 1e12)
    assert 0.3 < expected < 0.5  # a plausible MFU, so the fixture itself is sane

    # This machine has no GPU: make meta.json say what torch reports on an H100 SXM node.
    for meta_path in glob.glob(os.path.join(run, "rank-*", "*", "meta.json")):
        with open(meta_path) as f:
            meta = json.load(f)
        meta["device"] = {"type": "cuda", "index": 0, "name": "NVIDIA H100 80GB HBM3", "total_memory_bytes": 85520809984}
        with open(meta_path, "w") as f:
            json.dump(meta, f)
    ingest_run(run)
    steps, _, summary = read_outputs(run)
    assert steps["tokens_per_sec"].to_list() == pytest.approx([tokens_per_sec] * 5)
    assert steps["mfu"].to_list() == pytest.approx([expected] * 5, rel=1e-12)
    assert summary["mean_mfu"] == pytest.approx(expected, rel=1e-12)
    assert summary["flops_per_token"] == fpt
    assert summary["peak_tflops"] == 989.0 and summary["peak_source"].startswith("table: NVIDIA H100 80GB HBM3 (https://")
    assert summary["device"]["name"] == "NVIDIA H100 80GB HBM3"


def test_mfu_moe_by_hand_with_flops_override_precedence(tmp_path, monkeypatch):
    run = str(tmp_path / "moe")
    moe = {"n_layers": 16, "dim": 2048, "n_heads": 16, "n_kv_heads": 4, "ffn_hidden_dim": 1024,
           "vocab_size": 50000, "seq_len": 2048, "moe_num_experts": 64, "moe_top_k": 6, "moe_shared_experts": 2}
    _ddp_steps(monkeypatch, run, 4, range(1, 4), 0.5, lambda r, s: {"loss": 1.0, "tokens": 8 * 2048},
               model=moe, peak_tflops=312.0)
    D, F, L, S = 2048, 1024, 16, 2048
    attn = 2 * D * D + 2 * D * (4 * 128)
    per_layer = attn + (6 + 2) * 3 * D * F + D * 64
    fpt = 6 * (L * per_layer + D * 50000) + 12 * L * D * S
    tps = 4 * 8 * 2048 / 0.5
    ingest_run(run)
    steps, _, summary = read_outputs(run)
    assert steps["mfu"].to_list() == pytest.approx([fpt * tps / (4 * 312.0 * 1e12)] * 3, rel=1e-12)
    assert summary["peak_source"] == "meta.json peak_tflops"
    # --flops-per-token and --peak-tflops beat what meta.json recorded
    ingest_run(run, options=IngestOptions(flops_per_token=1e9, peak_tflops=100.0))
    steps, _, summary = read_outputs(run)
    assert steps["mfu"].to_list() == pytest.approx([1e9 * tps / (4 * 100.0 * 1e12)] * 3, rel=1e-12)
    assert (summary["flops_source"], summary["peak_source"]) == ("override", "override")


def test_unknown_device_gives_null_mfu_and_a_warning(tmp_path, monkeypatch):
    run = str(tmp_path / "cpu")
    recs = open_ranks(run, 2, model={"flops_per_token": 1e9})  # CPU, no peak recorded
    run_steps(monkeypatch, recs, range(1, 4), step_time=lambda r, s: 1.0)
    close_all(recs)
    with pytest.warns(UserWarning, match="CPU"):
        ingest_run(run)
    steps, _, summary = read_outputs(run)
    assert steps["mfu"].null_count() == steps.height
    assert summary["mean_mfu"] is None and summary["peak_tflops"] is None
    assert any("CPU" in w and "--peak-tflops" in w for w in summary["warnings"])


def test_restart_latest_attempt_wins_and_is_reported(tmp_path, monkeypatch):
    run = str(tmp_path / "restart")
    W = 2
    a0 = open_ranks(run, W)
    clock = run_steps(monkeypatch, a0, range(1, 31), step_time=lambda r, s: 1.0,
                      values=lambda r, s: {"loss": 100.0 + s, "tokens": 10})
    # no close(): the first launch was killed after step 30; it resumes from a checkpoint at 20
    for rec in a0.values():
        rec.flush()
    a1 = open_ranks(run, W)
    run_steps(monkeypatch, a1, range(21, 41), step_time=lambda r, s: 2.0,
              values=lambda r, s: {"loss": 200.0 + s, "tokens": 10}, clock=clock)
    close_all(a1)
    close_all(a0)
    ingest_run(run)
    steps, ranks, summary = read_outputs(run)
    assert steps["step"].to_list() == list(range(1, 41))
    assert ranks.height == 40 * W  # no (rank, step) twice
    for row in steps.iter_rows(named=True):
        s = row["step"]
        first = s < 21
        assert row["attempt"] == (0 if first else 1)
        assert row["loss"] == (100.0 + s if first else 200.0 + s)
        assert row["step_work_s"] == (1.0 if first else 2.0)
    assert [a["attempt"] for a in summary["attempts"]] == [0, 1]
    assert summary["attempts"][0]["last_step"] == 30 and summary["attempts"][1]["first_step"] == 21
    assert summary["restarts"] == [{
        "attempt": 1, "resumed_at_step": 21, "previous_last_step": 30, "superseded_steps": 10,
        "time": summary["attempts"][1]["start_time"], "in_process": False, "why": "relaunch",
    }]


def test_elastic_world_size_change_uses_each_attempts_size(tmp_path, monkeypatch):
    run = str(tmp_path / "elastic")
    a0 = open_ranks(run, 4, model={"flops_per_token": 1e9}, peak_tflops=100.0)
    clock = run_steps(monkeypatch, a0, range(1, 11), step_time=lambda r, s: 1.0,
                      values=lambda r, s: {"loss": 1.0, "tokens": 1000})
    close_all(a0)
    a1 = open_ranks(run, 2, model={"flops_per_token": 1e9}, peak_tflops=100.0)
    run_steps(monkeypatch, a1, range(11, 21), step_time=lambda r, s: 1.0,
              values=lambda r, s: {"loss": 1.0, "tokens": 1000}, clock=clock)
    close_all(a1)
    with pytest.warns(IngestWarning, match=r"world size changed across attempts \(4 -> 2\)"):
        ingest_run(run)
    steps, _, summary = read_outputs(run)
    by_step = {r["step"]: r for r in steps.iter_rows(named=True)}
    assert by_step[5]["n_ranks"] == 4 and by_step[15]["n_ranks"] == 2
    # each launch's world size and peak: MFU = FLOPs/token x tokens/s over (its GPUs x its peak)
    assert by_step[5]["mfu"] == pytest.approx(1e9 * 4000 / by_step[5]["step_time_s"] / (4 * 100e12))
    assert by_step[15]["mfu"] == pytest.approx(1e9 * 2000 / by_step[15]["step_time_s"] / (2 * 100e12))
    assert [a["world_size"] for a in summary["attempts"]] == [4, 2]
    assert summary["world_size"] == 2
    assert any("world size changed" in w for w in summary["warnings"])


def test_log_rows_coalesce_and_columns_appearing_mid_run(tmp_path, monkeypatch):
    run = str(tmp_path / "logs")
    recs = open_ranks(run, 2, flush_every_steps=3)
    clock = run_steps(monkeypatch, recs, range(1, 11), step_time=lambda r, s: 1.0)
    for r, rec in recs.items():
        rec.log(10, **{"eval/loss": 5.0 + r})  # after step 10 ended: same (rank, step)
        rec.log(11, **{"eval/loss": 7.0 + r})  # before step 11 ends: still coalesced into it
        rec.log(99, **{"eval/loss": 9.0})  # a step no rank ever ends: a row of its own
    run_steps(monkeypatch, recs, range(11, 16), step_time=lambda r, s: 1.0, clock=clock,
              values=lambda r, s: {"loss": 1.0, "tokens": 5, "moe/aux": float(s * (r + 1))})  # new column mid-run
    close_all(recs)
    ingest_run(run)
    steps, ranks, _ = read_outputs(run)
    assert ranks.filter(ranks["step"] == 10).height == 2  # coalesced, not an extra row per rank
    s = {r["step"]: r for r in steps.iter_rows(named=True)}
    assert s[10]["eval/loss"] == pytest.approx(5.5) and s[10]["step_work_s"] == 1.0
    assert s[11]["eval/loss"] == pytest.approx(7.5)  # the log row joined step 11's end_step row
    assert s[9]["eval/loss"] is None  # missing is null, never 0
    assert s[99]["eval/loss"] == 9.0 and s[99]["step_time_s"] is None and s[99]["n_ranks"] == 2
    assert s[99]["tokens"] is None and s[99]["loss"] is None
    assert s[5]["moe/aux"] is None
    assert s[12]["moe/aux"] == pytest.approx((12 * 1 + 12 * 2) / 2)
    assert math.isclose(s[12]["tokens"], 10)


@pytest.mark.parametrize("ragged", [True, False])
def test_ragged_ranks_and_ranks_that_do_not_count_tokens(tmp_path, monkeypatch, ragged):
    """A rank that misses steps (so the per-step grid is ragged) and a tensor-parallel peer whose
    tokens are not its own (counts_tokens=False): reductions over the ranks that reported."""
    run = str(tmp_path / "ragged")
    recs = open_ranks(run, 3, ranks=[0, 1])
    recs[2] = open_ranks(run, 3, ranks=[2], counts_tokens=False)[2]
    times = {0: 1.0, 1: 3.0, 2: 2.0}

    clock = None
    for s in range(1, 9):
        live = {r: rec for r, rec in recs.items() if not (ragged and r == 1 and s % 3 == 0)}  # misses 3, 6
        clock = run_steps(monkeypatch, live, [s], step_time=lambda r, s: times[r],
                          values=lambda r, s: {"loss": float(10 * r + s), "tokens": 100}, clock=clock)
    close_all(recs)
    ingest_run(run)
    steps, ranks, _ = read_outputs(run)
    assert ranks.height == 8 * 3 - (2 if ragged else 0)
    for row in steps.iter_rows(named=True):
        s = row["step"]
        reporting = [0, 2] if ragged and s % 3 == 0 else [0, 1, 2]
        assert row["n_ranks"] == len(reporting)
        assert row["step_work_s"] == max(times[r] for r in reporting)
        assert row["slowest_rank"] == max(reporting, key=lambda r: times[r])
        assert row["step_work_median_s"] == statistics.median(times[r] for r in reporting)
        assert row["tokens"] == 100 * len([r for r in reporting if r != 2])  # rank 2 does not count
        assert row["loss"] == pytest.approx(sum(10 * r + s for r in reporting) / len(reporting))


def test_small_windows_give_the_same_result_as_one(tmp_path, monkeypatch):
    """Memory is bounded by reading in step windows; windows cutting through part files, restarts
    and log rows must not change a single value."""
    run = str(tmp_path / "windows")
    recs = {r: open_ranks(run, 3, ranks=[r], flush_every_steps=3 + 2 * r)[r] for r in range(3)}  # misaligned parts

    def values(r, s):
        return {"loss": float(s * (r + 1)), "tokens": 7 * (r + 1), "grad_norm": float(r), "lr": 0.1}

    clock = run_steps(monkeypatch, recs, range(1, 40), step_time=lambda r, s: 0.1 * (1 + (s * r) % 4), values=values)
    for r, rec in recs.items():
        rec.log(20, **{"eval/loss": float(r)})
    for rec in recs.values():
        rec.flush()
    again = {r: open_ranks(run, 3, ranks=[r], flush_every_steps=4)[r] for r in range(3)}
    run_steps(monkeypatch, again, range(30, 61), step_time=lambda r, s: 0.2, values=values, clock=clock)
    close_all(again)
    close_all(recs)

    (one_steps, one_ranks, one_summary), (many_steps, many_ranks, many_summary) = ingest_whole_and_windowed(run, 4)
    assert one_steps.height == 60
    assert many_steps.equals(one_steps)
    assert many_ranks.sort("step", "rank").equals(one_ranks.sort("step", "rank"))
    assert many_summary["restarts"] == one_summary["restarts"]


def test_lowest_rank_wins_whatever_order_ranks_started_in(tmp_path, monkeypatch):
    run = str(tmp_path / "order")
    recs = open_ranks(run, 3, ranks=[2, 0, 1])  # rank 2 launched first: its attempt sorts first by start time
    run_steps(monkeypatch, recs, range(1, 6), step_time=lambda r, s: 1.0,
              values=lambda r, s: {"loss": 1.0, "grad_norm": 10.0 + r, "lr": 0.1 * (r + 1), "tokens": 1})
    close_all(recs)
    ingest_run(run)
    steps, _, _ = read_outputs(run)
    assert steps["grad_norm"].to_list() == [10.0] * 5
    assert steps["lr"].to_list() == [0.1] * 5
    assert steps["slowest_rank"].to_list() == [0] * 5  # all equal: the lowest rank
