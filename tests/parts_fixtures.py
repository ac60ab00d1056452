"""Runs of part files of known size for the ingest tests (made by the real Recorder), the outputs read
back by path, a part file rewritten in place, and a CliRunner for kforge-ingest."""

import json
import os

import polars as pl
import pyarrow.parquet as pq
from click.testing import CliRunner
from ingest_fixtures import close_all, open_ranks, run_steps

NO_EXPORT = ["--no-tensorboard", "--no-wandb"]


def make_run(path, monkeypatch, *, world=2, steps=20):
    """Part files of exactly 5 steps each; loss = step."""
    recs = open_ranks(str(path), world, flush_every_steps=1000)
    run_steps(monkeypatch, recs, range(1, steps + 1), step_time=lambda r, s: 1.0,
              values=lambda r, s: {"loss": float(s), "tokens": 10}, flush_every=5)
    close_all(recs)
    return str(path)


def small_run(run, monkeypatch, world=2):
    """Steps 1..5 on `world` ranks, loss = step, 10 tokens a rank."""
    recs = open_ranks(run, world)
    run_steps(monkeypatch, recs, range(1, 6), step_time=lambda r, s: 1.0,
              values=lambda r, s: {"loss": float(s), "tokens": 10})
    close_all(recs)
    return run


def read_outputs_by_path(run_dir):
    """steps.parquet, ranks.parquet (pyarrow: a path, never a pattern) and summary.json."""
    d = os.path.join(run_dir, "ingested")
    with open(os.path.join(d, "summary.json")) as f:
        summary = json.load(f)
    return (pl.from_arrow(pq.read_table(os.path.join(d, "steps.parquet"))),
            pl.from_arrow(pq.read_table(os.path.join(d, "ranks.parquet"))), summary)


def runner():
    try:
        return CliRunner(mix_stderr=False)
    except TypeError:  # click >= 8.2 always keeps stderr apart
        return CliRunner()


def rewrite_part(path, change, **write_kw):
    t = change(pq.read_table(path))
    pq.write_table(t, path, **write_kw)
