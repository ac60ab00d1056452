"""kforge-ingest through click's CliRunner: exit codes, messages, --json, overrides, exports, --watch."""

import json
import os

import polars as pl
import pytest
from ingest_fixtures import close_all, flush_all, open_ranks, part_files, read_outputs, run_steps
from parts_fixtures import NO_EXPORT, runner

from kforge_dash import pipeline
from kforge_dash.cli.ingest import main


def make_run(path, monkeypatch, *, steps=10, **kw):
    recs = open_ranks(str(path), 2, **kw)
    clock = run_steps(monkeypatch, recs, range(1, steps + 1), step_time=lambda r, s: 0.5,
                      values=lambda r, s: {"loss": 3.0 - 0.1 * s, "tokens": 256})
    close_all(recs)
    return str(path), clock


class FakeExporter:
    """Stands in for one real exporter (same name and needs): records each export and reports it done."""

    def __init__(self, real, calls: list, describe, kw: dict):
        self.name, self.needs = real.name, real.needs
        self.calls, self.describe, self.kw = calls, describe, kw

    def export(self, history):
        from kforge_dash.export.outcome import ExporterOutcome

        self.calls.append(self.describe(history, self.name, self.kw))
        return ExporterOutcome(ok=True, path=self.name)


def fake_export(monkeypatch, calls: list, describe) -> None:
    """The CLI's exporters become FakeExporters: each export appends describe(history, name, cli switches)."""
    import kforge_dash.export.exporters as exporters

    real = exporters.choose_exporters

    def choose(**kw):
        return [FakeExporter(x, calls, describe, kw) for x in real(**kw)]

    monkeypatch.setattr(exporters, "choose_exporters", choose)


def passes(calls: list) -> list:
    """Export calls grouped by run and pass: (key, exporters run) from (key, name) records."""
    out = []
    for key, name in calls:
        if out and out[-1][0] == key and name not in out[-1][1]:
            out[-1][1].append(name)
        else:
            out.append((key, [name]))
    return [(k, tuple(v)) for k, v in out]


def grow_then_stop(monkeypatch, recs, clock, steps, *, stop_after: int) -> list:
    """time.sleep for --watch: the job records ``steps`` at the first tick, Ctrl-C at tick
    ``stop_after``. Returns the list of ticks."""
    ticks = []

    def fake_sleep(seconds):
        ticks.append(seconds)
        if len(ticks) == 1:
            run_steps(monkeypatch, recs, steps, step_time=lambda r, s: 0.5, clock=clock)
            for rec in recs.values():
                rec.flush()
        elif len(ticks) >= stop_after:
            raise KeyboardInterrupt

    monkeypatch.setattr(pipeline.time, "sleep", fake_sleep)
    return ticks


def test_ingests_a_root_and_prints_a_summary(tmp_path, monkeypatch):
    run, _ = make_run(tmp_path / "root" / "a", monkeypatch)
    r = runner().invoke(main, [str(tmp_path / "root"), *NO_EXPORT])
    assert r.exit_code == 0, r.output
    assert "steps 10 (1–10)" in r.stdout and "ranks 2" in r.stdout and "tokens 5,120" in r.stdout
    assert "final loss 2" in r.stdout
    steps, _, _ = read_outputs(run)
    assert steps.height == 10


def test_json_output_and_overrides(tmp_path, monkeypatch):
    run, _ = make_run(tmp_path / "run", monkeypatch, model={"flops_per_token": 1e9})
    r = runner().invoke(main, [run, "--json", "--alpha", "0.5", "--peak-tflops", "2", *NO_EXPORT])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    s = out["runs"][0]["summary"]
    assert out["failed"] == [] and s["alpha"] == 0.5 and s["peak_source"] == "override"
    tps = s["mean_tokens_per_sec"]  # (the fake clock times the steps, not their ends: the periods are real time)
    assert s["mean_mfu"] == pytest.approx(1e9 * tps / (2 * 2e12))
    r = runner().invoke(main, [run, "--json", "--alpha", "0.5", "--peak-tflops", "2", "--flops-per-token", "5e8", *NO_EXPORT])
    s = json.loads(r.stdout)["runs"][0]["summary"]
    assert s["flops_source"] == "override" and s["mean_mfu"] == pytest.approx(5e8 * tps / (2 * 2e12))


def test_nothing_ingestible_exits_1_naming_the_path(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    r = runner().invoke(main, [str(plain), *NO_EXPORT])
    assert r.exit_code == 1 and f"{plain}: no kforge runs found" in r.stderr
    r = runner().invoke(main, [str(plain), "--alpha", "2"])
    assert r.exit_code == 2 and "alpha" in r.stderr  # click's usage error


def test_some_runs_failing_exits_3(tmp_path, monkeypatch):
    make_run(tmp_path / "root" / "good", monkeypatch)
    bad, _ = make_run(tmp_path / "root" / "bad", monkeypatch)
    for p in part_files(bad):
        open(p, "wb").write(b"junk")
    r = runner().invoke(main, [str(tmp_path / "root"), "--quiet", *NO_EXPORT])
    assert r.exit_code == 3
    assert r.stdout == ""  # --quiet: only errors
    assert bad in r.stderr and "no readable rows" in r.stderr


def test_warnings_are_shown_on_the_summary_screen(tmp_path, monkeypatch):
    run, _ = make_run(tmp_path / "run", monkeypatch)
    victim = part_files(run)[0]
    open(victim, "wb").write(b"junk")
    r = runner().invoke(main, [run, *NO_EXPORT])
    assert r.exit_code == 0
    assert "warnings (" in r.stdout and victim in r.stdout and "corrupt" in r.stdout


def test_export_failure_is_recorded_and_parquet_kept(tmp_path, monkeypatch):
    run, _ = make_run(tmp_path / "run", monkeypatch)

    def describe(history, name, kw):
        raise RuntimeError("disk full while writing events")

    fake_export(monkeypatch, [], describe)
    r = runner().invoke(main, [run, "--no-wandb"])
    assert r.exit_code == 0
    assert "export tensorboard: FAILED: RuntimeError: disk full" in r.stdout
    steps, ranks, summary = read_outputs(run)
    assert steps.height == 10 and ranks.height == 20
    assert summary["exports"]["tensorboard"] == {"ok": False, "path": None,
                                                 "error": "RuntimeError: disk full while writing events",
                                                 "points": None, "run_id": None, "seconds": None}
    assert summary["exports"]["wandb"] is None and summary["exports"]["upload"] is None  # not asked for


def test_export_called_with_the_cli_flags_and_result_recorded(tmp_path, monkeypatch):
    run, _ = make_run(tmp_path / "run", monkeypatch)
    calls = []
    fake_export(monkeypatch, calls, lambda history, name, kw: (history.run_dir, name, kw))
    args = [run, "--wandb-project", "proj", "--wandb-entity", "team", "--upload"]
    assert runner().invoke(main, args).exit_code == 0
    kw = {"tensorboard": True, "wandb": True, "wandb_project": "proj", "wandb_entity": "team", "upload": True}
    assert calls == [(run, "tensorboard", kw), (run, "wandb", kw), (run, "upload", kw)]
    assert read_outputs(run)[2]["exports"]["wandb"]["ok"] is True
    # unchanged shards and exports that worked: neither is redone ...
    assert runner().invoke(main, args[:-1]).exit_code == 0
    assert len(calls) == 3
    # ... but an asked-for upload always runs (the last one may have had no network)
    assert runner().invoke(main, args).exit_code == 0
    assert len(calls) == 6 and calls[-1][1] == "upload"


def test_watch_picks_up_new_parts_until_interrupted(tmp_path, monkeypatch):
    run, clock = make_run(tmp_path / "run", monkeypatch, steps=5)
    recs = {}
    ticks = []

    def fake_sleep(seconds):
        ticks.append(seconds)
        if len(ticks) == 1:  # the job goes on between two passes
            recs.update(open_ranks(run, 2))
            run_steps(monkeypatch, recs, range(6, 9), step_time=lambda r, s: 0.5, clock=clock)
            for rec in recs.values():
                rec.flush()
        else:
            raise KeyboardInterrupt

    monkeypatch.setattr(pipeline.time, "sleep", fake_sleep)
    r = runner().invoke(main, [run, "--watch", "2", *NO_EXPORT])
    close_all(recs)
    assert r.exit_code == 0 and ticks == [2.0, 2.0]
    steps = pl.read_parquet(os.path.join(run, "ingested", "steps.parquet"))
    assert steps["step"].to_list() == list(range(1, 9))
    assert r.stdout.count("steps 5 (1–5)") == 1 and r.stdout.count("steps 8 (1–8)") == 1


def test_watch_appends_the_parts_of_a_running_job(tmp_path, monkeypatch):
    run = str(tmp_path / "live")
    recs = open_ranks(run, 2)
    clock = run_steps(monkeypatch, recs, range(1, 6), step_time=lambda r, s: 0.5)
    flush_all(recs)
    grow_then_stop(monkeypatch, recs, clock, range(6, 12), stop_after=2)  # the same job goes on
    r = runner().invoke(main, [run, "--watch", "1", "--json", *NO_EXPORT])
    close_all(recs)
    assert r.exit_code == 0, r.output
    passes = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    got = [(p["runs"][0]["summary"]["steps"], p["runs"][0]["appended"]) for p in passes if p["runs"]]
    assert got == [(5, False), (11, True)]


def test_watch_stays_incremental_while_the_recorder_merges_parts(tmp_path, monkeypatch):
    run = str(tmp_path / "live")
    recs = open_ranks(run, 2, flush_every_steps=1)
    clock = run_steps(monkeypatch, recs, range(1, 6), step_time=lambda r, s: 0.5, flush_every=1)
    ticks = []

    def fake_sleep(seconds):  # between the passes: flushes 5..24, so parts 0-9 (five read) and 10-19 merge
        ticks.append(seconds)
        if len(ticks) == 1:
            run_steps(monkeypatch, recs, range(6, 26), step_time=lambda r, s: 0.5, clock=clock, flush_every=1)
        else:
            raise KeyboardInterrupt

    monkeypatch.setattr(pipeline.time, "sleep", fake_sleep)
    r = runner().invoke(main, [run, "--watch", "1", "--json", *NO_EXPORT])
    names = sorted(os.path.basename(p) for p in part_files(os.path.join(run, "rank-00001")))
    close_all(recs)
    assert r.exit_code == 0, r.output
    assert names[:2] == ["part-000000-000009.parquet", "part-000010-000019.parquet"]
    passes = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    got = [(p["runs"][0]["summary"]["steps"], p["runs"][0]["appended"]) for p in passes if p["runs"]]
    assert got == [(5, False), (25, True)]
    assert pl.read_parquet(os.path.join(run, "ingested", "ranks.parquet")).sort("rank", "step")["step"].to_list() == \
        list(range(1, 26)) * 2


def test_watch_defers_the_wandb_export_until_it_stops(tmp_path, monkeypatch):
    run = str(tmp_path / "live")
    recs = open_ranks(run, 2)
    clock = run_steps(monkeypatch, recs, range(1, 6), step_time=lambda r, s: 0.5)
    flush_all(recs)
    calls = []
    fake_export(monkeypatch, calls, lambda history, name, kw: (history.n_steps, name))
    grow_then_stop(monkeypatch, recs, clock, range(6, 9), stop_after=3)
    r = runner().invoke(main, [run, "--watch", "1"])
    close_all(recs)
    assert r.exit_code == 0, r.output
    # first pass: both; the pass with new parts: TensorBoard only; an idle pass: nothing;
    # after Ctrl-C: the W&B export that waited (of the latest outputs)
    assert passes(calls) == [(5, ("tensorboard", "wandb")), (8, ("tensorboard",)), (8, ("tensorboard", "wandb"))]
    assert read_outputs(run)[2]["exports"]["wandb"]["ok"] is True


def test_watch_final_pass_exports_and_uploads_only_the_runs_that_changed(tmp_path, monkeypatch):
    from kforge_dash.ingest.options import IngestError
    root = tmp_path / "root"
    live = str(root / "live")
    recs = open_ranks(live, 2)
    clock = run_steps(monkeypatch, recs, range(1, 6), step_time=lambda r, s: 0.5)
    flush_all(recs)
    make_run(root / "done", monkeypatch)  # a finished run: exported and uploaded once, at the start
    calls = []
    fake_export(monkeypatch, calls, lambda history, name, kw: (os.path.basename(history.run_dir), name))
    grow_then_stop(monkeypatch, recs, clock, range(6, 9), stop_after=2)
    r = runner().invoke(main, [str(root), "--watch", "1", "--upload"])
    assert r.exit_code == 0, r.output
    every = ("tensorboard", "wandb", "upload")
    got = passes(calls)
    assert sorted(got[:2]) == [("done", every), ("live", every)]
    assert got[2:] == [("live", ("tensorboard",)), ("live", every)]

    # the final pass fails: the exit status says so
    ticks = grow_then_stop(monkeypatch, recs, clock, range(9, 12), stop_after=2)
    real = pipeline.ingest_run

    def broken(run_dir, **kw):
        if len(ticks) >= 2:  # after Ctrl-C
            raise IngestError(f"{run_dir}: disk full")
        return real(run_dir, **kw)

    monkeypatch.setattr(pipeline, "ingest_run", broken)
    r = runner().invoke(main, [live, "--watch", "1", "--no-tensorboard"])
    close_all(recs)
    assert r.exit_code == 1 and "disk full" in r.stderr


def test_real_tensorboard_export_after_ingest(tmp_path, monkeypatch):
    run, _ = make_run(tmp_path / "run", monkeypatch)
    r = runner().invoke(main, [run, "--no-wandb"])
    assert r.exit_code == 0, r.output
    tb = read_outputs(run)[2]["exports"]["tensorboard"]
    assert tb["ok"] is True and os.path.exists(tb["path"]) and os.path.dirname(tb["path"]) == run
