"""The run page says what the stragglers cost and draws where the MFU went (prep functions, then AppTest)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from chart_specs import chart_specs
from dash_fixtures import SAMPLE_RUNS, shown
from streamlit.testing.v1 import AppTest

from kforge_dash import run_view
from kforge_dash.browse import diagnosis as prep_diagnosis
from kforge_dash.ingest import run as ingest

APP = Path(__file__).resolve().parent.parent / "kforge_dash" / "browse" / "app.py"


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    dst = tmp_path_factory.mktemp("diagnosis-dash") / "runs"
    for name in ("straggler", "baseline-lr1e-3", "throttled"):
        shutil.copytree(SAMPLE_RUNS / name, dst / name, ignore=shutil.ignore_patterns("ingested"))
        ingest.ingest_run(dst / name)
    return dst


def _summary(root, name):
    return json.loads((root / name / "ingested" / "summary.json").read_text())


def test_mfu_waterfall_steps_down_from_peak_to_the_achieved_mfu(root):
    s = _summary(root, "straggler")
    w = prep_diagnosis.mfu_waterfall(s)
    parts = s["mfu_waterfall"]["parts"]
    assert w.labels[0] == "peak" and w.labels[-1] == "achieved MFU" and "straggler wait" in w.labels
    assert w.values[0] == 1.0 and w.values[-1] == pytest.approx(parts["achieved"])
    assert w.values[0] + sum(w.values[1:-1]) == pytest.approx(w.values[-1], abs=1e-9)
    assert prep_diagnosis.mfu_waterfall({"mfu_waterfall": None}) is None
    assert run_view.what_if_text({"what_if": None}) is None


def test_run_page_says_what_the_stragglers_cost_and_draws_both_waterfalls(root, monkeypatch):
    monkeypatch.setenv("KFORGE_DASH_ROOT", str(root))
    at = AppTest.from_file(str(APP), default_timeout=300)
    at.query_params["run"] = "straggler"
    at.run()
    at.switch_page("views/run_detail.py").run()
    assert not at.exception
    w = _summary(root, "straggler")["what_if"]
    (info,) = [shown(i.value) for i in at.info if "stragglers" in i.value]
    assert info.startswith("Without its stragglers this run would have taken ") and "; rank 1 (" in info
    assert w["by_rank"][0]["rank"] == 1 and w["saved_s"] > 0.1 * w["total_s"]
    titles = [s["layout"].get("title", {}).get("text") or "" for s in chart_specs(at)]
    assert any(t.startswith("where the job's wall clock went") for t in titles)
    assert any(t.startswith("where the MFU went") for t in titles)


def test_the_throttled_sample_run_names_the_hardware_cause_of_its_straggler(root):
    """sample_runs/throttled: rank 1's (simulated) GPU throttles at steps 100-179 and straggles then."""
    s = _summary(root, "throttled")
    by_kind = {f["kind"]: f for f in s["findings"]}
    assert sorted(by_kind) == ["hw_throttle", "straggler"]
    hw, strag = by_kind["hw_throttle"], by_kind["straggler"]
    assert hw["ranks"] == strag["ranks"] == [1] and 95 <= hw["first_step"] <= 105 and 170 <= hw["last_step"] <= 180
    assert "hw_thermal_slowdown" in hw["reasons"] and "to 1,200 MHz" in hw["message"]
    assert strag["cause"].startswith("rank 1's SM clock fell from ") and strag["cause"].endswith("during the same steps")
    assert s["what_if"]["by_rank"][0]["rank"] == 1
    for name in ("straggler", "baseline-lr1e-3"):  # no telemetry there: no throttle, no cause
        other = _summary(root, name)["findings"]
        assert all(f["kind"] != "hw_throttle" and f.get("cause") is None for f in other)
