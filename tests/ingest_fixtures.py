"""Shards for the ingest tests, made by the real kforge_record.Recorder (several ranks in one process).

Step times are made exact with a fake clock: the recorder reads ``perf_counter`` from its module,
so patching ``kforge_record.recorder.perf_counter`` gives known step times, hence known tokens/s.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from contextlib import contextmanager

import polars as pl
import pytest

import kforge_record.recorder as recorder_mod
from kforge_dash.ingest.options import IngestOptions, IngestWarning
from kforge_dash.ingest.run import ingest_run
from kforge_record import Recorder

LLAMA7B = {"n_layers": 32, "dim": 4096, "n_heads": 32, "n_kv_heads": 32, "ffn_hidden_dim": 11008,
           "vocab_size": 32000, "seq_len": 4096}


@contextmanager
def warns_each(*patterns: str, category=IngestWarning):
    """pytest.warns for a call that gives several warnings: each pattern (a regex) matches one of them."""
    with pytest.warns(category) as got:
        yield got
    said = [str(w.message) for w in got]
    missing = [p for p in patterns if not any(re.search(p, m) for m in said)]
    assert not missing, f"no warning matched {missing}; the warnings were {said}"


class FakeClock:
    def __init__(self, t: float = 1000.0):
        self.t = t  # arbitrary origin: only differences are recorded

    def __call__(self) -> float:
        return self.t


def open_ranks(run_dir, world_size, *, ranks=None, **kw):
    """One Recorder per rank (one attempt of the job). Flushes often so runs have several parts."""
    kw.setdefault("flush_every_steps", 7)
    kw.setdefault("flush_every_s", 1e6)  # the fake clock must not trigger time-based flushes: parts stay 7 steps
    kw.setdefault("install_sigterm_handler", False)
    return {r: Recorder(run_dir, rank=r, world_size=world_size, **kw)
            for r in (range(world_size) if ranks is None else ranks)}


def run_steps(monkeypatch, recs: dict, steps, *, step_time, values=None, clock=None, flush_every=None):
    """Record ``steps`` on every rank. ``step_time(rank, step)`` seconds (exact, via the fake clock);
    ``values(rank, step)`` -> kwargs for end_step (default: loss and tokens). ``flush_every``: flush
    (and wait) every N steps, for part files of known size (the writer thread may otherwise merge
    several hand-offs into one part)."""
    clock = clock or FakeClock()
    monkeypatch.setattr(recorder_mod, "perf_counter", clock)
    for s in steps:
        for r, rec in recs.items():
            rec.start_step()
            clock.t += step_time(r, s)
            kw = values(r, s) if values else {"loss": 1.0 / s, "tokens": 1000}
            rec.end_step(s, **kw)
        if flush_every and s % flush_every == 0:
            for rec in recs.values():
                rec.flush()
    return clock


def flush_all(recs: dict):
    """Every rank's rows so far into part files (as a job between two ingests)."""
    for rec in recs.values():
        rec.flush()


def close_all(recs: dict):
    for rec in recs.values():
        rec.close()


def read_outputs(run_dir):
    d = os.path.join(run_dir, "ingested")
    with open(os.path.join(d, "summary.json")) as f:
        summary = json.load(f)
    return pl.read_parquet(os.path.join(d, "steps.parquet")), pl.read_parquet(os.path.join(d, "ranks.parquet")), summary


SUMMARY_VOLATILE = {"ingested_at", "fingerprint", "exports", "warnings"}


def full_outputs(run, **kw):
    """A from-scratch ingest of the run now (forced: no footer cache, no append); assert_same compares warnings."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IngestWarning)
        res = ingest_run(run, options=IngestOptions(force=True, **kw))
    assert not res.appended
    return read_outputs(run)


def assert_same(a, b):
    """Two ingests' (steps, ranks, summary) agree: the appended one and a full one."""
    (s1, r1, m1), (s2, r2, m2) = a, b
    assert s1.equals(s2)
    assert r1.sort("rank", "step").equals(r2.sort("rank", "step"))
    assert {k: v for k, v in m1.items() if k not in SUMMARY_VOLATILE} == \
           {k: v for k, v in m2.items() if k not in SUMMARY_VOLATILE}
    assert sorted(m1["warnings"]) == sorted(m2["warnings"])


def part_files(run_dir):
    out = []
    for root, _, files in os.walk(run_dir):
        if "ingested" in root:
            continue
        out += [os.path.join(root, f) for f in files if f.startswith("part-") and f.endswith(".parquet")]
    return sorted(out)


def ingest_whole_and_windowed(run_dir, chunk_rows):
    """Ingest the run as one window, then again (forced) in windows of `chunk_rows` rows; both outputs."""
    from kforge_dash.ingest.options import IngestOptions
    from kforge_dash.ingest.run import ingest_run

    ingest_run(run_dir, options=IngestOptions(chunk_rows=10**9))
    whole = read_outputs(run_dir)
    ingest_run(run_dir, options=IngestOptions(chunk_rows=chunk_rows, force=True))
    return whole, read_outputs(run_dir)
