"""Slow episodes (findings/episodes.py): the whole job's step time shifting up and back, by change points."""

from __future__ import annotations

import math

import numpy as np
import pytest
from findings_fixtures import Clock, close_all, drive, install, open_ranks

from kforge_dash import ingest_run
from kforge_dash.findings.episodes import change_points, episodes, pelt_l2


def _noise(s: int, k: int = 0) -> float:
    """Deterministic noise in [-1, 1]."""
    return math.sin(s * 12.9898 + k * 78.233) * 0.5 + math.sin(s * 4.1414 + k) * 0.5


def _run(tmp_path, monkeypatch, name, slow, *, steps=1000, ranks=4, spike_every=None):
    """Every rank's own work is 0.1 s (+-3% noise), x1.5 on the steps where ``slow(step)``."""
    clock = install(monkeypatch, Clock())
    recs = open_ranks(tmp_path / name, ranks, flush_every_steps=250)

    def phases(r, s):
        work = 0.1 * (1 + 0.03 * _noise(s, r)) * (1.5 if slow(s) else 1.0)
        if spike_every and s % spike_every == 0:
            work *= 10  # a checkpoint step: one slow step is no episode
        return [("data", 0.002), ("fwd", work)]

    drive(recs, range(1, steps + 1), clock, phases=phases, wait_phase="bwd")
    close_all(recs)
    return ingest_run(recs[0].run_dir).summary


def _episodes(summary):
    return [f for f in summary["findings"] if f["kind"] == "slow_episode"]


def test_a_planted_slow_stretch_is_one_episode_with_its_bounds_and_factor(tmp_path, monkeypatch):
    s = _run(tmp_path, monkeypatch, "slow", lambda s: 300 <= s <= 599)
    (ep,) = _episodes(s)
    assert abs(ep["first_step"] - 300) <= 20 and abs(ep["last_step"] - 599) <= 20
    assert ep["score"] == pytest.approx(1.5, abs=0.1)
    assert ep["ranks"] == [0, 1, 2, 3] and ep["metric"] == "step_time_s" and ep["severity"] == "info"
    assert "then came back" in ep["message"]
    assert not [f for f in s["findings"] if f["kind"] in ("straggler", "step_time_regression")]  # one answer


def test_a_clean_run_and_single_slow_steps_have_no_episode(tmp_path, monkeypatch):
    assert _episodes(_run(tmp_path, monkeypatch, "clean", lambda s: False)) == []
    assert _episodes(_run(tmp_path, monkeypatch, "ckpt", lambda s: False, spike_every=100)) == []


def test_a_slowdown_that_lasts_to_the_end_is_an_open_episode(tmp_path, monkeypatch):
    """A job that got slower and stayed slower: one episode, open to the last step."""
    s = _run(tmp_path, monkeypatch, "regressed", lambda s: s >= 250, steps=400, ranks=2)
    (ep,) = _episodes(s)
    assert abs(ep["first_step"] - 250) <= 20 and ep["last_step"] == 400
    assert ep["score"] == pytest.approx(1.5, abs=0.1)
    assert "had not come back" in ep["message"]


def test_pelt_finds_the_exact_change_points_of_a_piecewise_constant_signal():
    rng = np.random.default_rng(0)
    y = np.concatenate([np.zeros(100), np.full(50, 1.0), np.zeros(80), np.full(70, -0.5)]) + 0.05 * rng.standard_normal(300)
    assert pelt_l2(y, penalty=3 * 0.05**2 * math.log(300) * 4, min_size=10) == [100, 150, 230]
    assert pelt_l2(0.05 * rng.standard_normal(300), penalty=3 * 0.05**2 * math.log(300) * 4, min_size=10) == []
    # no segment shorter than min_size, even around a 5-point bump
    cps = pelt_l2(np.concatenate([np.zeros(100), np.ones(5), np.zeros(100)]), penalty=0.01, min_size=10)
    assert cps and min(np.diff([0, *cps, 205])) >= 10


def test_a_stretch_where_one_rank_straggles_is_the_stragglers_not_an_episode(tmp_path, monkeypatch):
    clock = install(monkeypatch, Clock())
    recs = open_ranks(tmp_path / "one-rank", 4, flush_every_steps=250)

    def phases(r, s):  # rank 2 only, 1.5x at steps 200-399
        return [("data", 0.002), ("fwd", 0.1 * (1 + 0.03 * _noise(s, r)) * (1.5 if r == 2 and 200 <= s < 400 else 1))]

    drive(recs, range(1, 601), clock, wait_phase="bwd", phases=phases)
    close_all(recs)
    s = ingest_run(recs[0].run_dir).summary
    (st,) = [f for f in s["findings"] if f["kind"] == "straggler"]
    assert st["ranks"] == [2] and abs(st["first_step"] - 200) <= 10
    assert _episodes(s) == []  # the job's step time rose 1.5x there too, but one answer: the straggler


def test_a_long_run_is_cut_on_block_medians_and_the_bounds_refined_to_the_step():
    """Over 2,000 steps PELT sees block medians; each change point is then moved to the best split."""
    n = 50_000  # blocks of 25 steps
    t = 0.1 * (1 + 0.03 * np.array([_noise(s) for s in range(n)]))
    t[20_013:21_007] *= 1.5  # bounds off the block grid
    t[::1000] *= 10  # a checkpoint step every 1,000
    (ep,) = episodes(t, change_points(t, 20), min_rel=0.25, k=4.0, min_steps=20)
    assert (ep.first, ep.last) == (20_013, 21_006) and ep.factor == pytest.approx(1.5, abs=0.05)
