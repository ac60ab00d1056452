"""Issues 27.3/27.4 and 32.3/32.4: findings quiet on clean runs, one fault one finding one cost, and nothing made
of step times that are unknown (NaN) or impossible (zero, negative)."""

from __future__ import annotations

import contextlib
import math

import polars as pl
import pyarrow as pa
import pytest
from findings_fixtures import Clock, close_all, drive, install, open_ranks
from ingest_fixtures import part_files
from parts_fixtures import rewrite_part

from kforge_dash import ingest_run
from kforge_dash.run_view import what_if_text


def _noise(s: int, k: int = 0) -> float:
    return math.sin(s * 12.9898 + k * 78.233) * 0.5 + math.sin(s * 4.1414 + k) * 0.5


def _warnings(s):
    return [f for f in s["findings"] if f["severity"] in ("warning", "error")]


def test_a_straggler_across_a_restart_is_one_finding_from_the_step_it_began(tmp_path, monkeypatch):
    """Issue 27.4: a 20 ms loader sleep from step 151 on rank 1, across a relaunch at step 200: one finding,
    steps 151-400 (was two, 150-199 and 200-400), and its cost, the what-if's and rank 1's agree."""
    clock = install(monkeypatch, Clock())
    run = tmp_path / "resumed"

    def phases(r, s):
        return [("data", 0.01 + (0.02 if r == 1 and s >= 151 else 0.0)), ("fwd_bwd", 0.09)]

    a0 = open_ranks(run, 2)
    drive(a0, range(1, 200), clock, phases=phases)
    close_all(a0)
    clock.t += 30.0
    a1 = open_ranks(run, 2)
    drive(a1, range(200, 401), clock, phases=phases)
    close_all(a1)
    s = ingest_run(run).summary
    (st,) = [f for f in s["findings"] if f["kind"] == "straggler"]
    assert (st["ranks"], st["first_step"], st["last_step"], st["severity"]) == ([1], 151, 400, "warning")
    assert st["cost_s"] == pytest.approx(250 * 0.02, rel=0.01) and "5.0 s" in st["message"]
    w = s["what_if"]
    assert w["saved_s"] == pytest.approx(st["cost_s"], rel=0.01)
    assert [(e["rank"], round(e["cost_s"], 2)) for e in w["by_rank"]] == [(1, 5.0), (0, 0.0)]
    assert what_if_text(s).endswith("rank 1 (vm) alone cost 5.0 s")


def test_a_clean_run_on_a_busy_machine_has_no_warning_and_no_what_if(tmp_path, monkeypatch):
    """Issue 27.3: per-rank timer jitter, the whole machine slowing for a while (other jobs), a heavy-tailed
    grad norm: no warning, no what-if naming a rank (was slow episodes, grad-norm 'loss_spike's, a what-if)."""
    clock = install(monkeypatch, Clock())
    recs = open_ranks(tmp_path / "busy", 2)

    def phases(r, s):
        busy = 1.6 if 300 <= s < 420 else 1.0  # another job shares the machine: every rank slows at once
        return [("data", busy * 0.01 * (1 + 0.08 * _noise(s, r + 3))), ("fwd", busy * 0.05 * (1 + 0.06 * _noise(s, r))),
                ("fwd_bwd", 0.04)]

    def values(r, s):
        gn = 0.5 * (1 + 0.2 * _noise(s, 9)) * (2.6 if s % 97 == 0 else 1.0)  # a clipped outlier now and then
        return {"loss": 3.0 - s / 400 + 0.02 * _noise(s, r), "grad_norm": gn, "tokens": 1000}

    drive(recs, range(1, 801), clock, phases=phases, values=values)
    close_all(recs)
    s = ingest_run(recs[0].run_dir).summary
    assert _warnings(s) == [], [f["message"] for f in _warnings(s)]
    kinds = {f["kind"] for f in s["findings"]}
    assert "slow_episode" in kinds and "grad_norm_spike" in kinds  # still told, as info
    assert not any(f["kind"] == "loss_spike" for f in s["findings"])
    (g,) = [f for f in s["findings"] if f["kind"] == "grad_norm_spike"]  # merged: one card, not one a spike
    assert (g["first_step"], g["last_step"]) == (97, 776) and "8 times" in g["message"]
    assert what_if_text(s) is None and s["what_if"]["saved_s"] == 0.0
    assert all(e["cost_s"] == 0.0 for e in s["what_if"]["by_rank"])


def test_a_straggler_of_immaterial_cost_is_info(tmp_path, monkeypatch):
    """12 ms over 30 steps of a 100 s run: 0.4 s, under 1 s and 1 %: info, and no what-if sentence."""
    clock = install(monkeypatch, Clock())
    recs = open_ranks(tmp_path / "tiny", 2)

    def phases(r, s):
        return [("data", 0.01 + (0.012 if r == 1 and 100 <= s < 130 else 0.0)), ("fwd_bwd", 0.09)]

    drive(recs, range(1, 1001), clock, phases=phases)
    close_all(recs)
    s = ingest_run(recs[0].run_dir).summary
    (st,) = [f for f in s["findings"] if f["kind"] == "straggler"]
    assert st["severity"] == "info" and st["cost_s"] == pytest.approx(0.36, rel=0.05)
    assert _warnings(s) == [] and what_if_text(s) is None


def _phased_run(tmp_path, monkeypatch, name, *, data_s=0.06):
    clock = install(monkeypatch, Clock())
    recs = open_ranks(tmp_path / name, 2)
    drive(recs, range(1, 61), clock, phases=lambda r, s: [("data", data_s + (0.03 if r == 1 else 0.0)), ("fwd_bwd", 0.04)])
    close_all(recs)
    return recs[0].run_dir


def _set_step_time(run_dir, value):
    """Every rank's own step time `value`, and every step's end time unknown (NaN) or the same (so the job's
    step time, the period between step ends, is unknown, or zero after the first step)."""
    end = float("nan") if value != value else 1.7e9

    def rewrite(t):
        t = t.set_column(t.schema.get_field_index("step_time_s"), "step_time_s", pa.array([value] * t.num_rows, pa.float64()))
        return t.set_column(t.schema.get_field_index("time"), "time", pa.array([end] * t.num_rows, pa.float64()))

    for p in part_files(run_dir):
        rewrite_part(p, rewrite)


@pytest.mark.parametrize("value", [float("nan"), 0.0])
def test_no_data_stall_from_unknown_or_zero_step_times(tmp_path, monkeypatch, value):
    """Issue 32.3: 'The data phase took nan% (inf%) of each step' from NaN (zero) step times: no share, no finding."""
    run = _phased_run(tmp_path, monkeypatch, "st")
    _set_step_time(run, value)
    with pytest.warns(Warning, match="zero or below") if value == 0 else contextlib.nullcontext():
        s = ingest_run(run).summary
    assert not [f for f in s["findings"] if f["kind"] == "data_stall"]
    assert not any("nan%" in f["message"] or "inf%" in f["message"] for f in s["findings"])


def test_non_positive_step_times_are_unknown_with_one_warning(tmp_path, monkeypatch):
    """Issue 32.4: step times of -0.1 s gave a negative what-if saving and stragglers '0% of a step longer'."""
    run = _phased_run(tmp_path, monkeypatch, "neg")
    _set_step_time(run, -0.1)
    with pytest.warns(Warning) as got:
        s = ingest_run(run).summary
    said = [str(w.message) for w in got if "zero or below" in str(w.message)]
    assert len(said) == 1 and "60 step(s)" in said[0] and "counted as unknown" in said[0]
    assert not [f for f in s["findings"] if f["kind"] in ("straggler", "data_stall")]
    w = s["what_if"]  # was saved_s -3.0 s, without_stragglers_s above total_s
    assert w["saved_s"] == 0.0 and w["without_stragglers_s"] == w["total_s"]
    assert all(e["cost_s"] >= 0 for e in w["by_rank"]) and what_if_text(s) is None
    steps = pl.read_parquet(f"{run}/ingested/steps.parquet")
    assert steps.height == 60  # the steps themselves stay: only their times are unknown to findings
