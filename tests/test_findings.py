"""Findings planted in runs recorded through the Recorder API are found with their ranks, phase and steps."""

from __future__ import annotations

import math
import sys

import pytest
from findings_fixtures import Clock, close_all, drive, install, open_ranks

import kforge_record.env as env_mod
from kforge_dash import ingest_run


def _noise(s: int, k: int = 0) -> float:
    """Deterministic noise in [-1, 1] (no RNG state to keep)."""
    return math.sin(s * 12.9898 + k * 78.233) * 0.5 + math.sin(s * 4.1414 + k) * 0.5


def _of(summary, kind, metric=None):
    return [f for f in summary["findings"] if f["kind"] == kind and (metric is None or f["metric"] == metric)]


def _steady(r, s):
    return [("data", 0.01), ("fwd_bwd", 0.09)]


def _spike_run(tmp_path, monkeypatch, *, spike: bool):
    clock = install(monkeypatch, Clock())
    recs = open_ranks(tmp_path / ("spike" if spike else "clean"), 2)

    def values(r, s):
        loss = 2.0 - s / 400 + 0.03 * _noise(s, r)
        gn = 0.5 + 0.1 * _noise(s, 7)
        if spike and s in (150, 151):
            loss *= 2.0
        if spike and s == 149:
            gn *= 10
        return {"loss": loss, "grad_norm": gn, "tokens": 1000}

    drive(recs, range(1, 201), clock, phases=_steady, values=values)
    close_all(recs)
    return ingest_run(recs[0].run_dir).summary


def test_a_loss_spike_is_one_finding_and_names_the_grad_norm_spike_before_it(tmp_path, monkeypatch):
    s = _spike_run(tmp_path, monkeypatch, spike=True)
    (loss,) = _of(s, "loss_spike", "loss")
    assert loss["first_step"] == 150 and 151 <= loss["last_step"] <= 155  # one episode, not one per step
    assert loss["ranks"] == [0, 1] and loss["severity"] == "warning" and loss["score"] > 6
    assert "grad-norm spike from step 149" in loss["message"]
    # one fault, one finding: the grad-norm spike that caused it is named in its message, not a finding of its own
    assert _of(s, "loss_spike", "grad_norm") == [] and _of(s, "grad_norm_spike") == []
    assert set(loss) == {"kind", "metric", "phase", "ranks", "hosts", "first_step", "last_step", "severity", "score",
                         "message"}


def test_a_grad_norm_spike_the_loss_did_not_follow_is_called_that_and_is_info(tmp_path, monkeypatch):
    """Issue 27.3: 16 'loss_spike' warnings on grad_norm whose own text said "the loss did not spike"."""
    clock = install(monkeypatch, Clock())
    recs = open_ranks(tmp_path / "gn", 2)

    def values(r, s):
        gn = 0.5 + 0.1 * _noise(s, 7)
        return {"loss": 2.0 - s / 400 + 0.03 * _noise(s, r), "grad_norm": gn * (10 if s == 120 else 1), "tokens": 1000}

    drive(recs, range(1, 201), clock, phases=_steady, values=values)
    close_all(recs)
    s = ingest_run(recs[0].run_dir).summary
    (g,) = s["findings"]
    assert (g["kind"], g["metric"], g["severity"], g["first_step"]) == ("grad_norm_spike", "grad_norm", "info", 120)
    assert "the loss did not follow" in g["message"] and "loss spike" not in g["message"].lower()


def test_a_clean_run_has_no_finding(tmp_path, monkeypatch):
    s = _spike_run(tmp_path, monkeypatch, spike=False)
    assert s["findings"] == []
    assert s["goodput"]["fraction"] == pytest.approx(0.9, abs=0.01)  # the median rank's data phase: 10%


def test_nonfinite_names_the_rank_where_it_began(tmp_path, monkeypatch):
    clock = install(monkeypatch, Clock())
    recs = open_ranks(tmp_path / "nan", 4)

    def values(r, s):
        # rank 2's batch is bad at step 30; the all-reduce spreads it to every rank's grad norm at 31
        loss = float("nan") if (r, s) == (2, 30) else 1.0
        return {"loss": loss, "grad_norm": float("inf") if s == 31 else 0.5, "tokens": 10}

    drive(recs, range(1, 41), clock, phases=_steady, values=values)
    close_all(recs)
    s = ingest_run(recs[0].run_dir).summary
    (loss,) = _of(s, "nonfinite", "loss")
    assert (loss["ranks"], loss["first_step"], loss["last_step"], loss["severity"]) == ([2], 30, 30, "error")
    assert "NaN at step 30 on rank 2" in loss["message"]
    (gn,) = _of(s, "nonfinite", "grad_norm")
    assert (gn["ranks"], gn["first_step"], gn["score"]) == ([0, 1, 2, 3], 31, 4.0)
    assert "+inf" in gn["message"]


def test_a_step_time_rise_is_a_slow_episode_with_its_steps(tmp_path, monkeypatch):
    clock = install(monkeypatch, Clock())
    recs = open_ranks(tmp_path / "slower", 2)
    drive(recs, range(1, 201), clock,
          phases=lambda r, s: [("data", 0.001), ("fwd_bwd", 0.2 if 100 <= s <= 160 else 0.1 + 0.002 * _noise(s))])
    close_all(recs)
    s = ingest_run(recs[0].run_dir).summary
    (f,) = _of(s, "slow_episode")
    assert (f["first_step"], f["last_step"], f["ranks"]) == (100, 160, [0, 1])
    assert f["score"] == pytest.approx(2.0, rel=0.05)
    assert _of(s, "straggler") == []  # every rank slowed down: nobody straggles


def test_memory_growth_names_the_rank_that_leaks(tmp_path, monkeypatch):
    import torch  # the test extra has it; the recorder reads CUDA counters through torch.cuda
    mem = {"alloc": 0}
    monkeypatch.setattr(env_mod, "cuda_in_use", lambda: True)
    monkeypatch.setattr(env_mod, "device_info", lambda: {"type": "cuda", "name": "Fake GPU", "total_memory_bytes": 2**34})
    stats = lambda: {"allocated_bytes": {"all": {"current": mem["alloc"], "peak": mem["alloc"]}},  # noqa: E731
                     "reserved_bytes": {"all": {"current": 2**33}}}
    monkeypatch.setattr(torch.cuda, "memory_stats_as_nested_dict", stats)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: None)
    assert sys.modules["torch"] is torch
    clock = install(monkeypatch, Clock())
    recs = open_ranks(tmp_path / "leak", 3, memory_every_steps=5, peak_tflops=100.0)  # a fake GPU has no peak in the table

    def values(r, s):  # rank 1 keeps 4 MiB a step alive; the others stay at 1 GiB
        mem["alloc"] = 2**30 + (s * 2**22 if r == 1 else 0)
        return {"loss": 1.0, "tokens": 10}

    drive(recs, range(1, 201), clock, phases=_steady, values=values)
    close_all(recs)
    s = ingest_run(recs[0].run_dir).summary
    (f,) = _of(s, "memory_growth")
    # from 10% into the launch (past the first steps' allocations) to its end; samples every 5 steps
    assert f["ranks"] == [1] and (f["first_step"], f["last_step"]) == (21, 200)
    # (scores are rounded to 4 decimals)
    assert f["score"] == pytest.approx((2**30 + 188.5 * 2**22) / (2**30 + 36 * 2**22) - 1, abs=1e-4)


def test_a_data_stall_on_every_rank_is_not_a_straggler(tmp_path, monkeypatch):
    clock = install(monkeypatch, Clock())
    recs = open_ranks(tmp_path / "stall", 2)
    drive(recs, range(1, 101), clock,
          phases=lambda r, s: [("data", 0.06 if s > 40 else 0.001), ("fwd_bwd", 0.04), ("optimizer", 0.001)])
    close_all(recs)
    s = ingest_run(recs[0].run_dir).summary
    (f,) = _of(s, "data_stall")
    assert (f["phase"], f["first_step"], f["last_step"]) == ("data", 41, 100)
    assert f["score"] == pytest.approx(0.06 / 0.101, rel=0.01)
    assert _of(s, "straggler") == []
    # (times near 1.8e9 s: float64 keeps them to ~0.2 us)
    assert s["goodput"]["buckets"]["data_stall"] == pytest.approx(60 * 0.06 + 40 * 0.001, abs=1e-4)


def test_a_failing_detector_costs_only_its_findings(tmp_path, monkeypatch):
    from kforge_dash.findings import stragglers

    def broken(*a, **k):
        raise ValueError("odd input")

    monkeypatch.setattr(stragglers, "straggler_findings", broken)
    clock = install(monkeypatch, Clock())
    recs = open_ranks(tmp_path / "odd", 2)
    drive(recs, range(1, 41), clock, phases=lambda r, s: [("data", 0.05 if r == 1 else 0.001), ("fwd_bwd", 0.05)],
          values=lambda r, s: {"loss": float("nan") if s == 30 else 1.0, "tokens": 10})
    close_all(recs)
    with pytest.warns(UserWarning, match="findings: stragglers could not be computed from .*ValueError: odd input"):
        s = ingest_run(recs[0].run_dir).summary
    assert [f["kind"] for f in s["findings"]] == ["nonfinite"] and s["goodput"]["fraction"] is not None
