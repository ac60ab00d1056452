"""Diagnosis on planted runs recorded through the Recorder API: GPU throttling and the straggler it
causes (hw_throttle, cause), the run without its stragglers (what_if) and where the MFU went."""

from __future__ import annotations

import math
import re

import pytest
from click.testing import CliRunner
from findings_fixtures import Clock, close_all, drive, install, open_ranks

from kforge_dash import IngestOptions, ingest_run, run_view
from kforge_dash.ingest.options import IngestWarning


def _noise(s: int, k: int = 0) -> float:
    """Deterministic noise in [-1, 1]."""
    return math.sin(s * 12.9898 + k * 78.233) * 0.5 + math.sin(s * 4.1414 + k) * 0.5


def _of(summary, kind):
    return [f for f in summary["findings"] if f["kind"] == kind]


def _planted(tmp_path, monkeypatch, *, slow: bool, ranks=8, steps=1000, name="run", **kw):
    """``ranks`` ranks (>= 6); with ``slow``, rank 5's own-work phase "fwd" takes 0.1 s longer on steps 251-750."""
    clock = install(monkeypatch, Clock())
    recs = open_ranks(tmp_path / name, ranks, hw_every_s=0, **kw)

    def phases(r, s):
        extra = 0.1 if slow and r == 5 and 251 <= s <= 750 else 0.0
        return [("data", 0.05 + 0.001 * _noise(s, r)), ("fwd", 0.4 + 0.001 * _noise(s, r + 50) + extra)]

    drive(recs, range(1, steps + 1), clock, phases=phases)
    close_all(recs)
    return recs[0].run_dir


def test_what_if_of_one_slow_rank_is_its_planted_cost_and_a_clean_run_saves_nothing(tmp_path, monkeypatch):
    s = ingest_run(_planted(tmp_path, monkeypatch, slow=True)).summary
    w = s["what_if"]
    assert set(w) == {"total_s", "without_stragglers_s", "saved_s", "by_rank", "method"}
    assert w["saved_s"] == pytest.approx(50.0, rel=0.10)
    top = w["by_rank"][0]
    assert set(top) == {"rank", "host", "cost_s"} and top["rank"] == 5 and top["cost_s"] == pytest.approx(50.0, rel=0.10)
    assert isinstance(top["host"], str) and top["host"]
    assert [e["cost_s"] for e in w["by_rank"]] == sorted((e["cost_s"] for e in w["by_rank"]), reverse=True)
    assert w["total_s"] == pytest.approx(s["goodput"]["total_s"])
    assert w["without_stragglers_s"] == pytest.approx(w["total_s"] - w["saved_s"])
    assert (_of(s, "straggler")[0]["ranks"], _of(s, "straggler")[0]["cause"]) == ([5], None)  # no telemetry: no cause

    clean = ingest_run(_planted(tmp_path, monkeypatch, slow=False, name="clean")).summary["what_if"]
    assert clean["saved_s"] < 0.005 * clean["total_s"]
    assert all(e["cost_s"] < 2.0 for e in clean["by_rank"])


def _throttle_run(tmp_path, monkeypatch, *, straggles: bool, name="hw"):
    """4 ranks; rank 2's GPU throttles (thermal, SM clock 1,980 -> 1,200 MHz) at steps 100-199, its
    telemetry given through end_step every 5th step; with ``straggles`` its own work is then slower."""
    clock = install(monkeypatch, Clock())
    recs = open_ranks(tmp_path / name, 4, hw_every_s=0)

    def hot(r, s):
        return r == 2 and 100 <= s <= 199

    def phases(r, s):
        return [("data", 0.02), ("fwd", 0.2 + (0.1 if straggles and hot(r, s) else 0.0) + 0.001 * _noise(s, r))]

    def values(r, s):
        v = {"loss": 1.0 / s, "tokens": 100}
        if s % 5 == 0:
            v.update({"hw/sm_clock_mhz": 1200.0 if hot(r, s) else 1980.0 - (r % 2) * 15,
                      "hw/throttle_reasons": float(0x40 | 0x4) if hot(r, s) else float(0x4),
                      "hw/gpu_temp_c": 91.0 if hot(r, s) else 70.0, "hw/gpu_util_pct": 99.0, "hw/gpu_power_w": 500.0})
        return v

    drive(recs, range(1, 301), clock, phases=phases, values=values)
    close_all(recs)
    return ingest_run(recs[0].run_dir).summary, recs[0].run_dir


def test_a_throttled_gpu_is_a_finding_and_the_cause_of_its_ranks_straggling(tmp_path, monkeypatch):
    s, run = _throttle_run(tmp_path, monkeypatch, straggles=True)
    (hw,) = _of(s, "hw_throttle")
    assert (hw["ranks"], hw["first_step"], hw["last_step"], hw["metric"]) == ([2], 100, 195, "hw/sm_clock_mhz")
    assert hw["reasons"] == ["sw_power_cap", "hw_thermal_slowdown"]
    assert hw["score"] == pytest.approx(1 - 1200 / 1980, abs=1e-3)
    assert "SM clock fell from 1,980 to 1,200 MHz" in hw["message"] and "thermal slowdown (hardware)" in hw["message"]
    assert hw["hosts"] and hw["severity"] == "warning"
    (strag,) = _of(s, "straggler")
    assert strag["ranks"] == [2]
    assert strag["cause"] == ("rank 2's SM clock fell from 1,980 to 1,200 MHz, power cap, thermal slowdown (hardware), "
                              "during the same steps")
    from kforge_dash.run_view import finding_cards

    (card,) = [c for c in finding_cards(s) if c.kind == "straggler"]
    assert card.message.endswith(f"Cause: {strag['cause']}.")  # the run page's finding card says it too
    from kforge_dash.cli.ingest import main

    out = CliRunner().invoke(main, [str(run), "--no-tensorboard", "--no-wandb"])
    assert f"      cause: {strag['cause']}" in out.output.splitlines()  # and the screen, under the straggler


def test_a_power_cap_alone_or_no_telemetry_is_no_finding(tmp_path, monkeypatch):
    """Every rank under its power cap at its usual clock (a busy GPU's normal state): nothing to say."""
    s, _ = _throttle_run(tmp_path, monkeypatch, straggles=False, name="hw-plain")
    assert [f["kind"] for f in s["findings"]] == ["hw_throttle"]  # the throttle is still seen, no straggler
    clock = install(monkeypatch, Clock())
    recs = open_ranks(tmp_path / "capped", 2, hw_every_s=0)
    drive(recs, range(1, 101), clock, phases=lambda r, s: [("data", 0.02), ("fwd", 0.2)],
          values=lambda r, s: {"loss": 1.0, "hw/sm_clock_mhz": 1980.0 - 30 * _noise(s, r), "hw/throttle_reasons": 4.0})
    close_all(recs)
    assert ingest_run(recs[0].run_dir).summary["findings"] == []


def test_the_mfu_waterfall_adds_up_to_one_and_ends_at_the_achieved_mfu(tmp_path, monkeypatch):
    run = _planted(tmp_path, monkeypatch, slow=True, ranks=8, steps=200, model={"flops_per_token": 1e9}, peak_tflops=10.0)
    s = ingest_run(run).summary
    m = s["mfu_waterfall"]
    parts = m["parts"]
    assert set(parts) == set(s["goodput"]["buckets"]) | {"below_peak", "achieved"} and m["peak"] == 1.0
    assert math.fsum(parts.values()) == pytest.approx(1.0, abs=1e-12)
    g = s["goodput"]
    # FLOPs done (4 ranks x 1,000 tokens x 1e9 a step) over wall clock x peak x GPUs
    assert parts["achieved"] == pytest.approx(200 * 8 * 1000 * 1e9 / (g["total_s"] * 10e12 * 8), rel=1e-9)
    assert parts["straggler_wait"] == pytest.approx(g["buckets"]["straggler_wait"] / g["total_s"])
    assert parts["below_peak"] == pytest.approx(g["productive_s"] / g["total_s"] * (1 - m["productive_mfu"]), rel=1e-9)
    assert 0.1 < parts["achieved"] < 0.3
    # a peak below what the run did (MFU while productive > 1) is said, not drawn
    with pytest.warns(IngestWarning, match="mfu_waterfall: the FLOPs done exceed the peak"):
        low = ingest_run(run, options=IngestOptions(peak_tflops=0.05, force=True)).summary
    assert low["mfu_waterfall"] is None and any("exceed the peak" in w for w in low["warnings"])
    unknown = ingest_run(_planted(tmp_path, monkeypatch, slow=False, ranks=2, steps=50, name="nomfu")).summary
    assert unknown["mean_mfu"] is None and unknown["mfu_waterfall"] is None


def test_the_screen_says_what_the_stragglers_cost(tmp_path, monkeypatch):
    from kforge_dash.cli.ingest import main

    run = _planted(tmp_path, monkeypatch, slow=True)
    out = CliRunner().invoke(main, [str(run), "--no-tensorboard", "--no-wandb"])
    assert out.exit_code == 0, out.output
    line = next(ln for ln in out.output.splitlines() if "what-if" in ln)
    assert "Without its stragglers this run would have taken" in line and "; rank 5 (" in line
    # the run page header's format (text.duration): 1 decimal under 100 s, h:mm:ss above; not rounded to "50 s"
    assert re.search(r"alone cost (4[5-9]|5[0-5])\.\d s$", line), line
    assert re.search(r"instead of \d+:\d\d:\d\d;", line), line


def _screen_what_if(run_dir) -> list[str]:
    from kforge_dash.cli.ingest import main

    out = CliRunner().invoke(main, [str(run_dir), "--no-tensorboard", "--no-wandb"])
    assert out.exit_code == 0, out.output
    return [ln for ln in out.output.splitlines() if "what-if" in ln or "stragglers" in ln]


def test_no_what_if_sentence_without_a_straggler_or_a_material_saving(tmp_path, monkeypatch):
    """A single rank (the tutorial) and the preempted sample run (2 clean ranks, ~1 % timer noise) said
    "3.3 s instead of 3.3 s; rank 0 alone cost 0.0 s": now nothing; the straggler sample run still says it."""
    import shutil

    from dash_fixtures import SAMPLE_RUNS

    single = _planted(tmp_path, monkeypatch, slow=False, ranks=1, steps=60, name="tutorial")
    s = ingest_run(single).summary
    assert s["what_if"] is not None and s["what_if"]["by_rank"][0]["rank"] == 0  # the data stays
    assert _screen_what_if(single) == []
    assert run_view.what_if_text(s) is None
    for name in ("preempted", "straggler"):
        shutil.copytree(SAMPLE_RUNS / name, tmp_path / name, ignore=shutil.ignore_patterns("ingested"))
    assert _screen_what_if(tmp_path / "preempted") == []
    (line,) = _screen_what_if(tmp_path / "straggler")
    assert line.strip() == ("what-if: Without its stragglers this run would have taken 39.2 s instead of 49.9 s; "
                            "rank 1 (vm) alone cost 10.7 s")


def test_the_what_if_sentence_reads_as_the_issue_asks():
    w = {"total_s": 3 * 3600 + 42 * 60, "without_stragglers_s": 3 * 3600 + 10 * 60, "saved_s": 32 * 60,
         "by_rank": [{"rank": 17, "host": "node-42", "cost_s": 24 * 60}, {"rank": 3, "host": "node-1", "cost_s": 60}],
         "method": "..."}
    straggler = {"kind": "straggler", "ranks": [17]}
    assert run_view.what_if_text({"what_if": w, "findings": [straggler]}) == (
        "Without its stragglers this run would have taken 3:10:00 instead of 3:42:00; rank 17 (node-42) alone cost 0:24:00")
    # the what-if names no rank without a finding (issue 27.3), however large its replayed cost: nothing said
    assert run_view.what_if_text({"what_if": w}) is None
    # an info (immaterial) straggler supports nothing; a finding naming another rank: the saving, no rank named
    assert run_view.what_if_text({"what_if": w, "findings": [{**straggler, "severity": "info"}]}) is None
    other = {"kind": "straggler", "ranks": [5], "severity": "warning"}
    assert run_view.what_if_text({"what_if": w, "findings": [other]}).endswith("instead of 3:42:00")
    # 0.4 s of 44 s (preempted) and 0 s of 3.3 s (one rank): nothing to say
    for total, saved in ((44.2, 0.45), (3.3, 0.0), (20.0, 0.9)):
        tiny = {"total_s": total, "without_stragglers_s": total - saved, "saved_s": saved,
                "by_rank": [{"rank": 0, "host": "vm", "cost_s": saved}], "method": "..."}
        assert run_view.what_if_text({"what_if": tiny}) is None, (total, saved)
        assert run_view.what_if_text({"what_if": tiny, "findings": [{"kind": "straggler", "ranks": [0]}]})
    assert run_view.what_if_text({"what_if": None}) is None and run_view.what_if_text(None) is None
    assert run_view.what_if_text({"what_if": {"total_s": None}}) is None
