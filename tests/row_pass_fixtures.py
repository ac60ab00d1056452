"""A run for the tests of the row pass (its batches of ranks, its reduction thread): 12 ranks, a
restart, log rows, rollbacks, NaNs and a bitmask column, and the warnings its every ingest gives;
windows executors that read each window whole or return its rows; and the outputs an ingest wrote,
for comparison."""

import dataclasses
import json
import os

import numpy as np
import polars as pl
from ingest_fixtures import FakeClock, warns_each

import kforge_record.recorder as recorder_mod
from kforge_record import Recorder

RANKS = 12


class Whole:
    """A windows executor that reads each window in one piece (no batches), as before."""

    def map(self, fn, tasks):
        for t in tasks:
            yield fn(dataclasses.replace(t, batch_rows=None))


class Returned:
    """A windows executor that runs each window here, its rows returned (as from a Dask worker)."""

    def map(self, fn, tasks):
        for t in tasks:
            yield fn(t)


def _launch(run, clock, steps, *, skip, extra=None):
    recs = {r: Recorder(run, rank=r, world_size=RANKS, flush_every_steps=1000, flush_every_s=1e6,
                        install_sigterm_handler=False, counts_tokens=r not in (4, 9)) for r in range(RANKS)}
    rng = np.random.default_rng(len(steps))
    for s in steps:
        for r, rec in recs.items():
            if (r, s) in skip:
                continue
            rec.start_step()
            clock.t += 0.5 + int(rng.integers(0, 4)) / 8  # few distinct times: ties for the slowest rank
            loss = -0.0 if s in (5, 42) else (float("nan") if (r, s) == (3, 7) else float(rng.normal()))
            v = {"loss": loss, "tokens": 100 * (r + 1), "lr": 1e-3}
            if r >= 5 or s % 4:
                v["grad_norm"] = float(rng.random())  # at steps % 4 == 0, only ranks of later batches report one
            if (r + s) % 3:
                v["aux"] = float(rng.normal())
            if (r * s) % 4:  # a bitmask, OR-ed over ranks (no slowdown bit: no hw_throttle finding)
                v["hw/throttle_reasons"] = float((0x1, 0x2, 0x4, 0x10, 0x100)[(r + s) % 5])
            rec.end_step(s, **v)
            if extra:
                extra(r, s, rec)
        if s == 30:
            for rec in recs.values():
                rec.flush()
    return recs


def warns_of_make_run():
    """What every ingest of make_run's run says: its clashing logs (the rank that ends steps again rolled
    back in its own process: a restart, not a warning)."""
    return warns_each("'loss' given by both end_step and log", "'eval/loss' logged with different values")


def make_run(path, monkeypatch, *, resume_eval: bool) -> str:
    """12 ranks, parts of 30 steps (so a window holds >= 12 x 30 rows), with: log rows coalesced (and
    clashing), NaN and -0.0 losses, tokens not counted on two ranks, grad norms only from higher
    ranks, a rank missing steps, a log row for a step its rank never ended, a rank ending steps again,
    and a restart (launch 2 resumes at step 55, after an eval logged at step 54 if ``resume_eval``)."""
    run = str(path)
    clock = FakeClock()
    monkeypatch.setattr(recorder_mod, "perf_counter", clock)

    def logs(r, s, rec):
        if s in (10, 40):
            rec.log(s, **{"eval/loss": float(r + s)})
        if (r, s) == (6, 40):
            rec.log(s, **{"eval/loss": 99.0})  # logged twice, differently
        if (r, s) == (8, 20):
            rec.log(s, loss=123.0)  # end_step gave another loss
        if (r, s) == (2, 36):
            for again in (34, 35, 36):  # an in-process rollback: steps ended again
                rec.start_step()
                clock.t += 0.5
                rec.end_step(again, loss=float(again), tokens=1)
        if (r, s) == (3, 44):
            rec.log(45, **{"eval/loss": 7.0})  # rank 3 never ends step 45

    skip = {(7, s) for s in range(40, 45)} | {(3, 45)}
    recs = _launch(run, clock, range(1, 59), skip=skip, extra=logs)
    for rec in recs.values():
        rec.close()
    recs = _launch(run, clock, [], skip=set())
    for r, rec in recs.items():
        if resume_eval:
            rec.log(54, **{"eval/loss": float(r)})  # the resumed checkpoint's eval: coalesced into launch 1's row
    clock.t += 5
    rng = np.random.default_rng(1)
    for s in range(55, 71):
        for r, rec in recs.items():
            rec.start_step()
            clock.t += 0.5 + int(rng.integers(0, 4)) / 8
            rec.end_step(s, loss=float(rng.normal()), tokens=100, grad_norm=1.0, lr=1e-3)
    for rec in recs.values():
        rec.close()
    return run


def outputs(run):
    d = os.path.join(run, "ingested")
    with open(os.path.join(d, "steps.parquet"), "rb") as f:
        steps = f.read()
    with open(os.path.join(d, "summary.json")) as f:
        summary = json.load(f)
    summary.pop("ingested_at")
    return steps, pl.read_parquet(os.path.join(d, "ranks.parquet")), summary
