"""Runs with something planted in them, recorded by the real kforge_record.Recorder on one wall clock.

``Clock`` stands in for every clock the recorder reads (perf_counter for step and phase times,
time.time for row times, datetime.now for meta.json start_time, the writer's end.json time, and
the process start), so the whole timeline of a run is known to the second and goodput's buckets
can be checked exactly. ``drive`` records steps the way a synchronous data-parallel job runs:
every rank starts a step together and the step ends for all when the slowest rank is done.
"""

from __future__ import annotations

import datetime as _real_dt
import time as _real_time

import kforge_record.env as env_mod
import kforge_record.recorder as recorder_mod
import kforge_record.writer as writer_mod
from kforge_record import Recorder

T0 = 1_796_000_000.0  # 2026-11-30: an arbitrary origin on the wall clock


class Clock:
    def __init__(self, t: float = T0):
        self.t = t

    def __call__(self) -> float:
        return self.t


class _TimeModule:
    """The ``time`` module with ``time()`` on the fake clock (sleep and the rest stay real)."""

    def __init__(self, clock):
        self._clock = clock

    def time(self):
        return self._clock.t

    def __getattr__(self, name):
        return getattr(_real_time, name)


class _DtModule:
    def __init__(self, clock):
        clock_ = clock

        class _Datetime(_real_dt.datetime):
            @classmethod
            def now(cls, tz=None):
                return _real_dt.datetime.fromtimestamp(clock_.t, tz)

        self.datetime, self.timezone = _Datetime, _real_dt.timezone


def install(monkeypatch, clock: Clock, *, process_lead_s: float = 0.0) -> Clock:
    """Every recorder clock on ``clock``; processes started ``process_lead_s`` before their Recorder."""
    monkeypatch.setattr(recorder_mod, "perf_counter", clock)
    monkeypatch.setattr(recorder_mod, "time", _TimeModule(clock))
    monkeypatch.setattr(recorder_mod, "_dt", _DtModule(clock))
    monkeypatch.setattr(writer_mod, "time", _TimeModule(clock))
    monkeypatch.setattr(env_mod, "process_start_time", lambda: clock.t - process_lead_s)
    return clock


def open_ranks(run_dir, world_size, **kw):
    kw.setdefault("flush_every_steps", 50)
    kw.setdefault("flush_every_s", 1e9)
    kw.setdefault("install_sigterm_handler", False)
    return {r: Recorder(run_dir, rank=r, world_size=world_size, **kw) for r in range(world_size)}


def drive(recs: dict, steps, clock: Clock, *, phases, values=None, after=None, log=None, wait_phase="fwd_bwd"):
    """Record ``steps`` on every rank of ``recs``, synchronously.

    ``phases(rank, step)`` -> [(phase, seconds)] of the rank's own work in the step; the step ends
    for every rank when the slowest is done: the others spend the difference waiting in
    ``wait_phase`` (the all-reduce), as under DDP. ``values(rank, step)`` -> end_step kwargs
    (default loss 1/step). ``after(step)`` -> seconds between this step and the next (an eval),
    ``log(rank, step)`` -> scalars each rank then logs with Recorder.log (None: nothing).
    """
    for s in steps:
        t_start = clock.t
        work = {r: phases(r, s) for r in recs}
        longest = max(sum(sec for _, sec in w) for w in work.values())
        for r, rec in recs.items():
            clock.t = t_start
            rec.start_step()
            for name, sec in work[r]:
                with rec.phase(name):
                    clock.t += sec
            with rec.phase(wait_phase):
                clock.t = t_start + longest  # waiting in the collective until the slowest arrives
            kw = values(r, s) if values else {"loss": 1.0 / s, "tokens": 1000}
            rec.end_step(s, **kw)
        clock.t = t_start + longest
        if after:
            clock.t += after(s)
        for r, rec in recs.items():
            scalars = log(r, s) if log else None
            if scalars:
                rec.log(s, **scalars)


def close_all(recs: dict):
    for rec in recs.values():
        rec.close()


def nan_run(tmp_path, monkeypatch):
    """4 ranks, 40 steps: rank 2's loss is NaN at step 30, every grad norm is inf at step 31."""
    clock = install(monkeypatch, Clock())
    recs = open_ranks(tmp_path / "nan", 4)

    def values(r, s):  # rank 2's loss is NaN at step 30; every rank's grad norm is inf at 31
        return {"loss": float("nan") if (r, s) == (2, 30) else 1.0, "grad_norm": float("inf") if s == 31 else 0.5,
                "lr": 1e-3, "tokens": 10}

    drive(recs, range(1, 41), clock, phases=lambda r, s: [("data", 0.01), ("fwd_bwd", 0.09)], values=values)
    close_all(recs)
    return recs[0].run_dir
