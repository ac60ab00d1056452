"""A run whose recorder has written no part file yet is waiting, not failed (also under --watch);
closed without a row, it is a failure."""

import json

from ingest_fixtures import close_all, flush_all, open_ranks, run_steps
from parts_fixtures import NO_EXPORT, read_outputs_by_path, runner

from kforge_dash import pipeline
from kforge_dash.cli.ingest import main


def test_watch_before_the_first_flush_says_waiting_not_error(tmp_path, monkeypatch):
    run = str(tmp_path / "run")
    recs = open_ranks(run, 2)  # meta.json written, no part file yet
    ticks = []

    def fake_sleep(seconds):
        ticks.append(seconds)
        if len(ticks) == 1:
            run_steps(monkeypatch, recs, range(1, 6), step_time=lambda r, s: 0.5)
            flush_all(recs)
        else:
            raise KeyboardInterrupt

    monkeypatch.setattr(pipeline.time, "sleep", fake_sleep)
    r = runner().invoke(main, [run, "--watch", "1", "-q", *NO_EXPORT])
    assert r.exit_code == 0, r.output
    assert r.stderr == "" and r.stdout == ""
    assert read_outputs_by_path(run)[0]["step"].to_list() == [1, 2, 3, 4, 5]
    close_all(recs)


def test_a_run_with_no_part_yet_is_reported_as_waiting(tmp_path, monkeypatch):
    run = str(tmp_path / "run")
    recs = open_ranks(run, 1)
    try:
        r = runner().invoke(main, [run, *NO_EXPORT])
        assert r.exit_code == 0 and r.stderr == "", r.output
        assert "waiting" in r.stdout and run in r.stdout
        r = runner().invoke(main, [run, "--json", *NO_EXPORT])
        got = json.loads(r.stdout)
        assert r.exit_code == 0 and got["failed"] == [] and [w["run_dir"] for w in got["waiting"]] == [run]
    finally:
        close_all(recs)
    r = runner().invoke(main, [run, *NO_EXPORT])  # closed without a row: that is a failure, not a wait
    assert r.exit_code == 1 and "no readable rows" in r.stderr
