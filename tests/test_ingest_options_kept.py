"""What was decided at ingest sticks (issue 27 point 2, issue 30 point 2): options given once are kept
with the run (RUN/ingested/options.json) and used by every later ingest (the CLI on the root or on one
run, --watch, the dashboard's Ingest button) until given again or dropped with --reset-options; and
summary.json records the findings options and phase classes that the run page reads."""

import json
import os
import shutil
from pathlib import Path

import pytest
from ingest_fixtures import close_all, open_ranks, run_steps
from parts_fixtures import NO_EXPORT, runner

from kforge_dash import pipeline
from kforge_dash.browse.rank_metrics import phase_label
from kforge_dash.cli.ingest import main
from kforge_dash.contract import OPTIONS_FILE

SAMPLES = Path(__file__).resolve().parent.parent / "sample_runs"


def cpu_run(path, monkeypatch, *, steps=10, first=1):
    """Two ranks recorded on CPU with a model description: MFU is null unless a peak is given."""
    recs = open_ranks(str(path), 2, model={"flops_per_token": 1e9})
    clock = run_steps(monkeypatch, recs, range(first, first + steps), step_time=lambda r, s: 0.5,
                      values=lambda r, s: {"loss": 3.0 - 0.01 * s, "tokens": 256})
    close_all(recs)
    return str(path), clock


def summary_of(run) -> dict:
    return json.loads(Path(run, "ingested", "summary.json").read_text())


def test_a_peak_given_on_the_root_sticks_for_a_plain_ingest_of_one_run(tmp_path, monkeypatch):
    run, _ = cpu_run(tmp_path / "root" / "one-run", monkeypatch)
    r = runner().invoke(main, [str(tmp_path / "root"), "--peak-tflops", "312", *NO_EXPORT])
    assert r.exit_code == 0, r.output
    assert summary_of(run)["mean_mfu"] is not None
    assert json.loads(Path(run, "ingested", OPTIONS_FILE).read_text()) == {"peak_tflops": 312.0}
    for extra in ([], ["--force"]):  # skipped as unchanged, then really redone: the kept peak both times
        r = runner().invoke(main, [run, *extra, *NO_EXPORT])
        assert r.exit_code == 0, r.output
        s = summary_of(run)
        assert s["mean_mfu"] is not None and s["peak_tflops"] == 312.0, extra
        assert "--peak-tflops 312 (kept from an earlier ingest)" in r.stdout
    # given again: the new value wins and is kept; --json says where each option came from
    r = runner().invoke(main, [run, "--peak-tflops", "100", "--json", *NO_EXPORT])
    got = json.loads(r.stdout)["runs"][0]
    assert got["summary"]["peak_tflops"] == 100.0
    assert got["options"]["peak_tflops"] == {"value": 100.0, "source": "given now"}
    assert got["options"]["alpha"] == {"value": 0.1, "source": "default"}
    assert got["options"]["findings.wait_phases"]["source"] == "default"
    assert json.loads(Path(run, "ingested", OPTIONS_FILE).read_text()) == {"peak_tflops": 100.0}


def test_reset_options_drops_what_was_kept(tmp_path, monkeypatch):
    run, _ = cpu_run(tmp_path / "run", monkeypatch)
    assert runner().invoke(main, [run, "--peak-tflops", "312", "--spike-k", "9", *NO_EXPORT]).exit_code == 0
    r = runner().invoke(main, [run, "--reset-options", "--alpha", "0.5", *NO_EXPORT])
    assert r.exit_code == 0, r.output
    s = summary_of(run)
    assert s["mean_mfu"] is None and s["findings_options"]["spike_k"] == 6.0 and s["alpha"] == 0.5
    assert json.loads(Path(run, "ingested", OPTIONS_FILE).read_text()) == {"alpha": 0.5}  # what was given with it
    assert "--alpha 0.5 (given now); the others default" in r.stdout


def test_the_dashboards_ingest_button_uses_the_kept_options(tmp_path, monkeypatch):
    from kforge_dash.browse.views import common

    run, clock = cpu_run(tmp_path / "root" / "one-run", monkeypatch)
    assert runner().invoke(main, [run, "--peak-tflops", "312", "--wait-phases", "*bwd*", *NO_EXPORT]).exit_code == 0
    recs = open_ranks(run, 2, model={"flops_per_token": 1e9})  # the job goes on: the run is out of date
    run_steps(monkeypatch, recs, range(11, 16), step_time=lambda r, s: 0.5, clock=clock)
    close_all(recs)
    common._ingest(str(tmp_path / "root"), ["one-run"])  # what the Ingest button calls
    s = summary_of(run)
    assert s["last_step"] == 15 and s["mean_mfu"] is not None and s["peak_source"] == "override"
    assert s["findings_options"]["wait_phases"] == ["*bwd*"]


def test_the_watch_loop_uses_the_kept_options(tmp_path, monkeypatch):
    run, clock = cpu_run(tmp_path / "run", monkeypatch, steps=5)
    assert runner().invoke(main, [run, "--peak-tflops", "312", *NO_EXPORT]).exit_code == 0
    ticks = []

    def fake_sleep(seconds):
        ticks.append(seconds)
        if len(ticks) == 1:  # the job goes on between two passes
            recs = open_ranks(run, 2, model={"flops_per_token": 1e9})
            run_steps(monkeypatch, recs, range(6, 9), step_time=lambda r, s: 0.5, clock=clock)
            close_all(recs)
        else:
            raise KeyboardInterrupt

    monkeypatch.setattr(pipeline.time, "sleep", fake_sleep)
    r = runner().invoke(main, [run, "--watch", "1", "--json", *NO_EXPORT])
    assert r.exit_code == 0, r.output
    passes = [json.loads(line)["runs"] for line in r.stdout.splitlines() if line.startswith("{")]
    got = [(p[0]["summary"]["last_step"], p[0]["summary"]["mean_mfu"] is not None) for p in passes if p]
    assert got == [(5, True), (8, True)]


def test_a_bad_kept_options_file_is_named_and_ignored(tmp_path, monkeypatch):
    run, _ = cpu_run(tmp_path / "run", monkeypatch)
    os.makedirs(os.path.join(run, "ingested"))
    Path(run, "ingested", OPTIONS_FILE).write_text(json.dumps({"alpha": 7, "peak_tflops": 312, "findings": {"spike_k": -1}}))
    r = runner().invoke(main, [run, "--json", *NO_EXPORT])
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)["runs"][0]["summary"]
    assert s["alpha"] == 0.1 and s["peak_tflops"] == 312 and s["findings_options"]["spike_k"] == 6.0
    bad = [w for w in s["warnings"] if OPTIONS_FILE in w]
    assert any("alpha: must be a number in (0, 1], got 7" in w for w in bad)
    assert any("spike_k: must be a positive finite number, got -1" in w for w in bad)


def test_wait_phases_the_summary_and_the_run_page_agree(tmp_path, monkeypatch):
    """sample_runs/straggler with data counted as waiting: no straggler finding, and the run page no
    longer says rank 1's own work was slowest in 250 of 250 steps (it classified phases with the
    default options, whatever ingest was told)."""
    from dash_fixtures import detail_page

    from kforge_dash.browse import ranks as prep_ranks

    root = tmp_path / "runs"
    shutil.copytree(SAMPLES / "straggler", root / "straggler")
    run = root / "straggler"
    r = runner().invoke(main, [str(run), "--wait-phases", "fwd*,*bwd*,data*", *NO_EXPORT])
    assert r.exit_code == 0, r.output
    s = summary_of(run)
    assert not [f for f in s["findings"] if f["kind"] == "straggler"]
    assert s["findings_options"]["wait_phases"] == ["fwd*", "*bwd*", "data*"]
    assert "time/data_s" in s["phases"]["wait"] and "time/data_s" not in s["phases"]["own"]
    d = prep_ranks.run_detail(run / "ingested" / "steps.parquet", run / "ingested" / "ranks.parquet", s)
    assert d.slowest is None or "time/data_s" not in d.slowest.phases
    assert d.slowest is None or d.slowest.counts.row(0, named=True)["steps_slowest"] < 250
    assert phase_label("time/data_s", waiting=True) in d.phase_by_rank.columns
    at = detail_page(root, monkeypatch, "straggler")
    assert not at.exception
    caption = next(c.value for c in at.caption if "Mean seconds per phase" in c.value)
    assert "data" not in caption.split("own work")[-1].split(")")[0]  # data is not named as own work


@pytest.mark.parametrize("given", [["--peak-tflops", "312"], ["--spike-k", "9"]])
def test_options_given_are_recorded_with_where_they_came_from(tmp_path, monkeypatch, given):
    run, _ = cpu_run(tmp_path / "run", monkeypatch)
    r = runner().invoke(main, [run, *given, *NO_EXPORT])
    assert f"{given[0]} {given[1]} (given now); the others default" in r.stdout
    r = runner().invoke(main, [run, *NO_EXPORT])
    assert f"{given[0]} {given[1]} (kept from an earlier ingest); the others default" in r.stdout


def test_a_summary_without_phase_classes_asks_for_a_re_ingest(tmp_path, monkeypatch):
    """An older summary.json has no ``phases``: the page does not guess them from default options."""
    from dash_fixtures import detail_page, write_run

    run = write_run(tmp_path, "old", n=30, world_size=2)
    path = run / "ingested" / "summary.json"
    s = json.loads(path.read_text())
    del s["phases"], s["findings_options"]
    path.write_text(json.dumps(s))
    at = detail_page(tmp_path, monkeypatch, "old")
    assert not at.exception
    assert any("re-ingest the run" in i.value for i in at.info)
    from kforge_dash.browse import ranks as prep_ranks

    d = prep_ranks.run_detail(run / "ingested" / "steps.parquet", run / "ingested" / "ranks.parquet", s)
    assert not d.phases_known and d.slowest is None
    assert not [c for c in d.phase_by_rank.columns if "incl. waiting" in c]
