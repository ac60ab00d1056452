"""A named pipe (or a symlink to one) in the place of any file kforge reads: never opened, so never
a block; skipped with a warning naming it (issue 32.2). Each reader runs in a child process under a
timeout: on the old code it blocks opening the FIFO for ever."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from parts_fixtures import NO_EXPORT, make_run

REPO = Path(__file__).resolve().parent.parent
INGEST = [sys.executable, "-m", "kforge_dash.cli.ingest"]
ENV = dict(os.environ, PYTHONPATH=str(REPO))


def _fifo_in_place_of(path: Path, *, via_symlink: bool) -> None:
    path.unlink(missing_ok=True)
    if via_symlink:
        target = path.parent / f".{path.name}.pipe"
        target.unlink(missing_ok=True)
        os.mkfifo(target)
        os.symlink(target.name, path)
    else:
        os.mkfifo(path)


def _ingest(*args, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run([*INGEST, *map(str, args), *NO_EXPORT], env=ENV, capture_output=True, text=True, timeout=timeout)


def _attempt(run: str, rank: int = 0) -> Path:
    (d,) = Path(run, f"rank-{rank:05d}").iterdir()
    return d


@pytest.mark.parametrize("via_symlink", [False, True], ids=["fifo", "symlink-to-fifo"])
@pytest.mark.parametrize("name", ["part", "meta.json", "end.json", "heartbeat.bin"])
def test_a_fifo_in_the_place_of_a_shard_file_is_skipped_and_named(tmp_path, monkeypatch, name, via_symlink):
    run = make_run(tmp_path / "run", monkeypatch, world=2, steps=20)
    d = _attempt(run)
    victim = sorted(d.glob("part-*.parquet"))[1] if name == "part" else d / name
    _fifo_in_place_of(victim, via_symlink=via_symlink)
    p = _ingest(run)
    assert p.returncode == 0, p.stderr
    summary = json.loads(Path(run, "ingested", "summary.json").read_text())
    (w,) = [w for w in summary["warnings"] if str(victim) in w]
    assert "named pipe" in w
    assert summary["last_step"] == 20  # the rest of the run is ingested (rank 1 has every step)


@pytest.mark.parametrize("name", ["summary.json", "on_finding.json"])
def test_a_fifo_in_the_place_of_an_ingested_file_does_not_block_ingest_or_the_watch(tmp_path, monkeypatch, name):
    run = make_run(tmp_path / "run", monkeypatch, world=1, steps=10)
    assert _ingest(run).returncode == 0
    victim = Path(run, "ingested", name)
    _fifo_in_place_of(victim, via_symlink=True)
    hook = ["--on-finding", "true"]
    p = _ingest(run, "--force", *hook)
    assert p.returncode in (0, 3), p.stderr  # never blocked; either re-ingested or that run reported
    if name == "on_finding.json":
        assert "named pipe" in p.stderr and str(victim) in p.stderr
    _fifo_in_place_of(victim, via_symlink=True)
    watcher = subprocess.Popen([*INGEST, run, "--watch", "0.2", "--json", *NO_EXPORT, *hook], env=ENV,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert watcher.stdout.readline().strip().startswith("{")  # one pass done (the old code never gets here)
    finally:
        watcher.send_signal(signal.SIGINT)
        _, err = watcher.communicate(timeout=60)
    assert watcher.returncode in (0, 130), err  # 130: the Ctrl-C landed inside a later pass


def test_the_dashboard_run_listing_does_not_block_on_fifos(tmp_path, monkeypatch):
    run = make_run(tmp_path / "runs" / "run", monkeypatch, world=1, steps=10)
    assert _ingest(run).returncode == 0
    d = _attempt(run)
    (d / "end.json").unlink()  # an unfinished attempt: its heartbeat and meta.json are read for liveness
    _fifo_in_place_of(d / "heartbeat.bin", via_symlink=True)
    _fifo_in_place_of(d / "meta.json", via_symlink=False)
    _fifo_in_place_of(Path(run, "ingested", "summary.json"), via_symlink=True)
    code = ("import sys; from pathlib import Path; from kforge_dash.browse import runs, live; "
            "rs = runs.list_runs(Path(sys.argv[1])); print([(r.name, r.status) for r in rs]); "
            "print(live.run_last_seen(Path(sys.argv[1]) / 'run'))")
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path / "runs")], env=ENV, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[0].startswith("[('run', ")  # listed (a summary that is no file: not ingested)


def test_a_page_is_refused_an_ingested_output_that_is_a_fifo(tmp_path, monkeypatch):
    from kforge_dash.browse.runs import RunPathError, ingested_file

    run = make_run(tmp_path / "run", monkeypatch, world=1, steps=5)
    assert _ingest(run).returncode == 0
    _fifo_in_place_of(Path(run, "ingested", "steps.parquet"), via_symlink=True)
    with pytest.raises(RunPathError, match=r"run/ingested/steps.parquet: a named pipe \(FIFO\), not a regular file"):
        ingested_file(Path(run), "steps.parquet")
    assert ingested_file(Path(run), "ranks.parquet").is_file()
