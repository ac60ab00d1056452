"""One run's failure, of any kind, is that run's alone: the other runs of the root are ingested, the CLI
goes on and says which failed, and the failed run keeps its last good outputs."""

import os

import polars as pl
import pytest
from ingest_fixtures import close_all, open_ranks, part_files, run_steps
from parts_fixtures import NO_EXPORT, make_run, read_outputs_by_path, runner

import kforge_dash.ingest.run as ingest_mod
from kforge_dash.cli.ingest import main
from kforge_dash.ingest.options import IngestError
from kforge_dash.ingest.run import ingest_run
from kforge_dash.pipeline import ingest_path


def test_an_unexpected_error_in_one_run_does_not_stop_the_others(tmp_path, monkeypatch):
    root = tmp_path / "root"
    for name in ("a", "b"):
        recs = open_ranks(str(root / name), 1)
        run_steps(monkeypatch, recs, range(1, 6), step_time=lambda r, s: 1.0)
        close_all(recs)
    real = ingest_mod._ingest_locked

    def buggy(run_dir, *a):  # a bug of ours that run "a" hits
        if run_dir == str(root / "a"):
            raise TypeError("'>=' not supported between instances of 'NoneType' and 'int'")
        return real(run_dir, *a)

    monkeypatch.setattr(ingest_mod, "_ingest_locked", buggy)
    out = ingest_path(str(root), tensorboard=False, wandb=False)
    by_name = {os.path.basename(r.run_dir): r for r in out}
    assert by_name["b"].summary["steps"] == 5
    err = by_name["a"].error
    assert str(root / "a") in err and "TypeError" in err and "NoneType" in err


def test_runs_root_with_one_bad_run(tmp_path, monkeypatch):
    make_run(tmp_path / "root" / "good", monkeypatch)
    bad = tmp_path / "root" / "bad"
    make_run(bad, monkeypatch, world=1)
    for p in part_files(str(bad)):
        os.remove(p)
    out = ingest_path(str(tmp_path / "root"), tensorboard=False, wandb=False)
    by_name = {os.path.basename(r.run_dir): r for r in out}
    assert by_name["good"].summary["steps"] == 20
    assert "no readable rows" in by_name["bad"].error and str(bad) in by_name["bad"].error


def test_a_polars_panic_in_one_run_is_that_runs_failure_exit_3(tmp_path, monkeypatch):
    root = tmp_path / "root"
    good, bad = make_run(root / "good", monkeypatch, world=1), make_run(root / "panics", monkeypatch, world=1)
    real = ingest_mod._ingest_locked

    def panicking(run_dir, *a):
        if run_dir == bad:
            raise pl.exceptions.PanicException("called `Result::unwrap()` on an `Err` value: NulError")
        return real(run_dir, *a)

    monkeypatch.setattr(ingest_mod, "_ingest_locked", panicking)
    r = runner().invoke(main, [str(root), "-q", *NO_EXPORT])
    assert r.exit_code == 3, r.output
    assert bad in r.stderr and "PanicException" in r.stderr and good not in r.stderr
    assert read_outputs_by_path(good)[0].height == 20


def test_failed_ingest_keeps_the_previous_outputs(tmp_path, monkeypatch):
    run = make_run(tmp_path / "run", monkeypatch, world=1)
    ingest_run(run)
    before = {n: open(os.path.join(run, "ingested", n), "rb").read() for n in ("steps.parquet", "ranks.parquet", "summary.json")}
    for p in part_files(run):
        open(p, "wb").write(b"garbage")
    with pytest.raises(IngestError, match="no readable rows"):
        ingest_run(run)
    after = {n: open(os.path.join(run, "ingested", n), "rb").read() for n in before}
    assert after == before
    assert not [n for n in os.listdir(os.path.join(run, "ingested")) if n.endswith(".tmp")]
