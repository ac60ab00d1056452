"""The run detail page through Streamlit's AppTest, a vanished run and a never-ingested one:
expected values read from summary.json, not from the page's prep code."""

import json
import re
import shutil
from pathlib import Path

import pytest
from chart_specs import chart_elements, chart_specs
from dash_fixtures import SAMPLE_RUNS, detail_page, shown, write_run
from streamlit.testing.v1 import AppTest

from kforge_dash import text

APP = Path(__file__).resolve().parent.parent / "kforge_dash" / "browse" / "app.py"


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    from dash_fixtures import copy_and_ingest_sample_runs

    return copy_and_ingest_sample_runs(tmp_path_factory.mktemp("detail") / "runs")


def _charts(at):
    return {s["layout"].get("title", {}).get("text"): s for s in chart_specs(at)}


def test_two_wall_times_each_labelled_and_the_waterfall_starts_at_the_job_clock(root, monkeypatch):
    """preempted: the header said 0:00:33 and the waterfall 44.2 s, both as 'wall time'."""
    s = json.loads((root / "preempted" / "ingested" / "summary.json").read_text())
    at = detail_page(root, monkeypatch, "preempted")
    assert not at.exception
    got = {m.label: m.value for m in at.metric}
    assert "wall time" not in got
    assert got["training time"] == f"{s['wall_time_s']:.1f} s" and got["job wall clock"] == f"{s['goodput']['total_s']:.1f} s"
    assert s["goodput"]["total_s"] - s["wall_time_s"] > 5  # downtime between the launches: two numbers, two labels
    waterfall = next(spec for t, spec in _charts(at).items() if t and t.startswith("where the job's wall clock went"))
    assert waterfall["data"][0]["x"][0] == "job wall clock"
    assert waterfall["data"][0]["text"][0] == got["job wall clock"]  # one number, one format, one label


def test_the_two_mfu_figures_say_how_they_differ(root, monkeypatch):
    """'mean MFU' (header) and 'achieved' (the MFU waterfall) differ on every sample run; the header says why."""
    at = detail_page(root, monkeypatch, "preempted")
    assert not at.exception
    (mfu,) = [m for m in at.metric if m.label == "mean MFU"]
    assert "whole job wall clock" in (mfu.help or "") and "achieved" in mfu.help


def test_text_is_whole_and_human(root, monkeypatch):
    """No raw float lists in warnings, no raw column names in tables, the final loss uncut."""
    at = detail_page(root, monkeypatch, "preempted")
    warnings = [shown(w.value) for w in at.warning]
    assert any("peak TFLOPS per GPU" in w for w in warnings)
    assert not any(re.search(r"\d\.\d{6,}", w) for w in warnings), warnings  # [0.10882826149463654, ...]
    for df in at.dataframe:
        assert not any(str(c).startswith("time/") for c in df.value.columns), df.value.columns
    s = json.loads((root / "preempted" / "ingested" / "summary.json").read_text())
    final = next(m.value for m in at.metric if m.label == "final loss")
    assert len(final) <= 7 and float(final) == pytest.approx(s["final_loss"], rel=1e-4)


def test_config_diff_says_not_set_instead_of_none(tmp_path, monkeypatch):
    write_run(tmp_path, "a", n=5, hparams={"lr": 1e-3, "nan_step": None, "peak": 0.10882826149463654, "eps": 1.0000001})
    write_run(tmp_path, "b", n=5, hparams={"lr": 3e-3, "peak": 0.111696757376194, "eps": 1.0000002})
    monkeypatch.setenv("KFORGE_DASH_ROOT", str(tmp_path))
    at = AppTest.from_file(str(APP), default_timeout=300)
    at.run()
    at.switch_page("views/runs.py").run()
    assert not at.exception
    diff = next(d.value for d in at.dataframe if "key" in d.value.columns).set_index("key")
    assert diff.loc["hparams.nan_step", "a"] == "null" and diff.loc["hparams.nan_step", "b"] == text.NOT_SET
    assert not diff.isna().any().any()
    assert diff.loc["hparams.peak"].tolist() == ["0.108828", "0.111697"]  # read as a person reads them
    assert diff.loc["hparams.eps"].tolist() == ["1.0000001", "1.0000002"]  # but never two differing values alike


def test_a_run_deleted_while_its_page_is_open_is_said_gone_and_no_other_run_shows(tmp_path, monkeypatch):
    root = tmp_path / "runs"
    for name, seed in (("alpha", 1), ("beta", 2)):
        write_run(root, name, n=50, seed=seed)
    at = detail_page(root, monkeypatch, "beta")
    assert not at.exception and at.selectbox(key="run").value == "beta" and at.metric
    shutil.rmtree(root / "beta")
    at.run()  # a reload, while the cached listing (10 s) still lists it
    assert not at.exception
    errors = [shown(e.value) for e in at.error]
    assert any("'beta' is not under" in e and "deleted" in e for e in errors), errors
    assert not any("re-ingest" in e for e in errors)
    assert not at.metric and not chart_elements(at)  # alpha's data is not shown under beta's name
    assert at.query_params["run"] == "beta"  # the URL still names the run it was about
    other = at.selectbox(key="other_run")
    assert other.options == ["alpha"] and other.value is None
    other.set_value("alpha").run()  # the way on: pick another run
    assert not at.exception and at.selectbox(key="run").value == "alpha" and at.metric


def test_a_never_ingested_run_offers_the_ingest_button(tmp_path, monkeypatch):
    root = tmp_path / "runs"
    write_run(root, "done", n=30)
    shutil.copytree(SAMPLE_RUNS / "straggler", root / "fresh", ignore=shutil.ignore_patterns("ingested"))
    at = detail_page(root, monkeypatch, "fresh")
    assert not at.exception and not at.metric
    hint = " ".join(shown(w.value) for w in at.warning)
    assert "'fresh' has no ingested outputs" in hint and "kforge-ingest" in hint
    at.button(key="ingest").click().run()
    assert not at.exception and (root / "fresh" / "ingested" / "summary.json").is_file()
    at.run()
    assert at.selectbox(key="run").value == "fresh" and {m.label for m in at.metric} >= {"steps", "training time"}


def test_the_straggler_pages_phase_shares_add_to_100_percent_with_checkpoint_under_1(root, monkeypatch):
    """What the page shows (issue 21, item 2: it showed checkpoint 8.14 % and 'other' -0.48 %)."""
    at = detail_page(root, monkeypatch, "straggler")
    assert not at.exception
    table = next(d.value for d in at.dataframe if "share" in d.value.columns).set_index("phase")
    assert table["share"].sum() == pytest.approx(1.0) and (table["share"] >= 0).all()
    assert table.loc["checkpoint", "share"] < 0.01 and table.loc["checkpoint", "steps_ran"] == 5
    slow = next(spec for t, spec in _charts(at).items() if t and t.startswith("steps where each rank's own work"))
    assert list(slow["data"][0]["x"]) == [1]  # rank 1, as the straggler finding says


def test_many_findings_the_first_open_the_rest_in_an_expander(tmp_path, monkeypatch):
    findings = [{"kind": "nonfinite", "severity": "error", "message": f"loss NaN at step {s}", "first_step": s,
                 "last_step": s, "ranks": [0]} for s in range(1, 131)]
    write_run(tmp_path, "diverged", n=200, findings=findings)
    at = detail_page(tmp_path, monkeypatch, "diverged")
    assert not at.exception
    (more,) = at.expander
    assert more.label == "124 more findings"
    buttons = [b for b in at.button if b.key.startswith("open_")]
    assert len(buttons) == 100 and buttons[0].label == "Open step 1"
    assert any("30 more" in c.value and "summary.json" in c.value for c in at.caption)
