"""A TensorBoard server already running follows re-ingests: a real `tensorboard`
on 127.0.0.1, both of its loaders, read through its HTTP API while the run grows and is rewritten."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import polars as pl
import pytest
from ingest_fixtures import open_ranks, run_steps
from ports_fixtures import free_port, stop

from kforge_dash import IngestOptions, ingest_run
from kforge_dash.export.run import export_run
from kforge_dash.export.tensorboard import kforge_event_files


def _get(port: int, path: str, **query):
    url = f"http://127.0.0.1:{port}{path}" + ("?" + urllib.parse.urlencode(query) if query else "")
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def _points(port: int, run: str, tag: str) -> list[tuple[int, float]]:
    try:
        return [(int(step), float(v)) for _, step, v in _get(port, "/data/plugin/scalars/scalars", run=run, tag=tag)]
    except Exception:  # not loaded yet (400/404) or the server still starting
        return []


def _wait_for(port: int, run: str, tag: str, want: list[tuple[int, float]], timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    got = []
    while time.monotonic() < deadline:
        got = _points(port, run, tag)
        if len(got) == len(want) and all(s == ws and v == pytest.approx(wv, rel=1e-6) for (s, v), (ws, wv) in zip(got, want)):
            return got
        time.sleep(0.3)
    raise AssertionError(f"{tag}: TensorBoard shows {got[:3]}...{got[-3:]} ({len(got)} points), want {len(want)} points")


def _want(run_dir: str, col: str) -> list[tuple[int, float]]:
    df = pl.read_parquet(os.path.join(run_dir, "ingested", "steps.parquet")).select("step", col).drop_nulls()
    return [(s, v) for s, v in df.iter_rows()]


@pytest.mark.slow
@pytest.mark.parametrize("load_fast", ["false", "true"])  # the Python multiplexer and the Rust data server
def test_a_running_tensorboard_follows_appends_and_rewrites(tmp_path, monkeypatch, load_fast):
    root = tmp_path / "runs"
    run = str(root / "live")
    recs = open_ranks(run, 2)
    clock = run_steps(monkeypatch, recs, range(1, 21), step_time=lambda r, s: 0.25, flush_every=20)
    ingest_run(run)
    first = export_run(run, wandb=False).tensorboard
    assert first.ok and os.path.dirname(first.path) == run

    port = free_port()
    tb = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(root), "--host", "127.0.0.1",
                           "--port", str(port), "--reload_interval", "1", "--load_fast", load_fast],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(port, "live", "1_train/loss", _want(run, "loss"))
        assert list(_get(port, "/data/runs")) == ["live"]  # the run's own name

        # The job goes on: new part files, an appending ingest, the same event file grows.
        run_steps(monkeypatch, recs, range(21, 31), step_time=lambda r, s: 0.25, clock=clock, flush_every=10)
        assert ingest_run(run).appended
        grown = export_run(run, wandb=False).tensorboard
        assert grown.path == first.path
        _wait_for(port, "live", "1_train/loss", _want(run, "loss"))
        _wait_for(port, "live", "smoothed/loss_ema", _want(run, "loss_ema"))

        # A rewrite: every EMA value changes (another alpha): a new file, read after the old one,
        # replaces the points already shown instead of adding to them.
        ingest_run(run, options=IngestOptions(alpha=0.5))
        rewritten = export_run(run, wandb=False).tensorboard
        assert rewritten.path > first.path and kforge_event_files(run) == [first.path, rewritten.path]
        _wait_for(port, "live", "smoothed/loss_ema", _want(run, "loss_ema"))
        _wait_for(port, "live", "1_train/loss", _want(run, "loss"))
        assert list(_get(port, "/data/runs")) == ["live"]
    finally:
        stop(tb)
        for rec in recs.values():
            rec.close()


@pytest.mark.slow
def test_findings_are_in_tensorboards_text_tab_not_among_its_scalar_cards(tmp_path):
    """A real TensorBoard on the straggler sample run: its scalar cards are the
    training metrics only; the finding is served by the text plugin at its first step."""
    import shutil

    from dash_fixtures import SAMPLE_RUNS

    root = tmp_path / "runs"
    run = root / "straggler"
    shutil.copytree(SAMPLE_RUNS / "straggler", run, ignore=shutil.ignore_patterns("ingested", "events.out.*"))
    ingest_run(run)
    assert export_run(str(run), wandb=False).tensorboard.ok
    port = free_port()
    tb = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(root), "--host", "127.0.0.1",
                           "--port", str(port), "--reload_interval", "1", "--load_fast", "false"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(port, "straggler", "1_train/loss", _want(str(run), "loss"))
        scalars = _get(port, "/data/plugin/scalars/tags")["straggler"]
        assert "1_train/loss" in scalars and not [t for t in scalars if t.startswith("findings/")]
        assert _get(port, "/data/plugin/text/tags") == {"straggler": ["findings/straggler"]}
        (entry,) = _get(port, "/data/plugin/text/text", run="straggler", tag="findings/straggler")
        assert entry["step"] == 1 and "straggler" in entry["text"] and "rank 1" in entry["text"]
        assert "<script" not in entry["text"]
    finally:
        stop(tb)
