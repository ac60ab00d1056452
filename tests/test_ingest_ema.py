"""EMA columns against a plain Python loop; non-finite values held and counted, never dropped."""

import math

import pytest
from findings_fixtures import Clock, install
from ingest_fixtures import close_all, open_ranks, read_outputs, run_steps
from reference_math import ema_loop

from kforge_dash.ingest.options import IngestOptions
from kforge_dash.ingest.run import ingest_run

LOSSES = {1: 5.0, 2: 4.0, 3: float("nan"), 4: 3.5, 5: float("inf"), 6: 3.0, 7: None, 8: 2.0, 9: 2.5, 10: float("nan")}


@pytest.mark.parametrize("alpha", [0.1, 0.5])
def test_ema_matches_loop_and_nan_is_kept(tmp_path, monkeypatch, alpha):
    run = str(tmp_path / "ema")
    clock = install(monkeypatch, Clock())  # step times and end times on one clock: the period is the step time
    recs = open_ranks(run, 1, model={"flops_per_token": 1e6}, peak_tflops=1.0)
    run_steps(monkeypatch, recs, range(1, 11), step_time=lambda r, s: 0.5 + 0.1 * s,
              values=lambda r, s: {"loss": LOSSES[s], "tokens": 100 * s}, clock=clock)
    close_all(recs)
    res = ingest_run(run, options=IngestOptions(alpha=alpha))
    steps, _, summary = read_outputs(run)

    loss = steps["loss"].to_list()
    assert math.isnan(loss[2]) and math.isinf(loss[4]) and loss[6] is None and math.isnan(loss[9])  # kept as recorded
    assert steps["loss_ema"].to_list() == pytest.approx(ema_loop([LOSSES[s] for s in range(1, 11)], alpha), rel=1e-12)
    st = steps["step_time_s"].to_list()  # the periods: the step times, to the fake clock's rounding at ~1.8e9 s
    assert st == pytest.approx([0.5 + 0.1 * s for s in range(1, 11)], abs=1e-6)
    assert steps["step_time_s_ema"].to_list() == pytest.approx(ema_loop(st, alpha), rel=1e-12)
    tps = [100 * s / t for s, t in zip(range(1, 11), st)]
    assert steps["tokens_per_sec_ema"].to_list() == pytest.approx(ema_loop(tps, alpha), rel=1e-12)
    assert steps["mfu_ema"].to_list() == pytest.approx(ema_loop([x * 1e6 / 1e12 for x in tps], alpha), rel=1e-12)
    assert summary["nonfinite"]["loss"] == 3  # NaN, inf, NaN (the null is missing, not non-finite)
    assert summary["nonfinite"]["step_time_s"] == 0
    assert math.isnan(summary["final_loss"])  # a diverged end is shown, not hidden
    assert summary["best_loss"] == 2.0
    assert res.summary["alpha"] == alpha


def test_ema_starts_at_first_finite_value(tmp_path, monkeypatch):
    run = str(tmp_path / "late")
    vals = [float("nan"), None, 7.0, 9.0]
    recs = open_ranks(run, 1)
    run_steps(monkeypatch, recs, range(1, 5), step_time=lambda r, s: 1.0,
              values=lambda r, s: {"loss": vals[s - 1]})
    close_all(recs)
    ingest_run(run)
    steps, _, _ = read_outputs(run)
    got = steps["loss_ema"].to_list()
    assert got[:2] == [None, None]
    assert got[2:] == pytest.approx([7.0, 0.1 * 9.0 + 0.9 * 7.0])
    assert steps["mfu_ema"].null_count() == 4  # no FLOPs known: null, never 0
