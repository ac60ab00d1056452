#!/usr/bin/env python
"""Findings precision: warnings on clean runs against planted problems found, in one table.

    python3 benchmarks/findings_precision.py                    # sample runs + generated runs
    python3 benchmarks/findings_precision.py --clean DIR ...    # and real clean runs of your own (e.g. a
                                                                # torchrun job on a busy machine)

Copies sample_runs/ into a temporary folder and records generated runs there with the real Recorder on a
fake clock (tests/findings_fixtures.py): clean ones with per-rank timer jitter (3-8 %), the whole machine
slowing by 1.3-1.7x for a stretch (other jobs), and a heavy-tailed grad norm; planted ones with one fault
each. Each run is ingested and its findings read back from summary.json:

- a clean run passes when it has no warning or error finding (info is allowed: that is what info is for)
  and no what-if sentence;
- a planted run passes when a warning or error finding of the expected kind names the expected rank(s)
  and begins at the expected step (where one is given), and nothing else is a warning or error.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
import warnings
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path[:0] = [REPO, os.path.join(REPO, "tests")]


@dataclass(frozen=True, kw_only=True)
class Expect:
    kinds: tuple[tuple, ...] = ()  # (kind, ranks or None, first_step or None): each must be found


SAMPLES = {  # sample_runs/README.md says what was planted in each
    "baseline-lr1e-2": Expect(), "baseline-lr1e-3": Expect(), "baseline-lr3e-3": Expect(),
    "preempted": Expect(),  # a restart is info: the job did what it should
    "straggler": Expect(kinds=(("straggler", (1,), None),)),
    "spike-nan": Expect(kinds=(("loss_spike", None, 151), ("nonfinite", (0,), 200))),
    "four-ranks-stall": Expect(kinds=(("straggler", (2,), None), ("data_stall", None, 100))),
    "throttled": Expect(kinds=(("hw_throttle", (1,), None), ("straggler", (1,), 100))),
}


def _noise(rng, n):
    return rng.uniform(-1.0, 1.0, n)


def _clean(run, seed: int, ranks: int, steps: int) -> None:
    import numpy as np
    from findings_fixtures import Clock, close_all, drive, install, open_ranks
    from pytest import MonkeyPatch

    rng = np.random.default_rng(seed)
    jit = 0.03 + 0.05 * rng.random()
    a, z = sorted(rng.integers(50, steps, 2))
    busy = 1.3 + 0.4 * rng.random()
    noise = {r: _noise(rng, steps + 2) for r in range(ranks)}
    gnz = rng.pareto(3.0, steps + 2)
    with MonkeyPatch.context() as mp:
        clock = install(mp, Clock())
        recs = open_ranks(run, ranks)

        def phases(r, s):
            k = busy if a <= s <= z else 1.0
            return [("data", k * 0.01 * (1 + jit * noise[r][s])), ("forward", k * 0.05 * (1 + jit * noise[r][s - 1])),
                    ("fwd_bwd", 0.04)]

        def values(r, s):
            return {"loss": 3.0 * math.exp(-s / steps) + 0.02 * noise[r][s], "grad_norm": 0.5 * (1 + 0.3 * gnz[s]),
                    "tokens": 1000}

        drive(recs, range(1, steps + 1), clock, phases=phases, values=values)
        close_all(recs)


def _planted(run, kind: str) -> Expect:
    from findings_fixtures import Clock, close_all, drive, install, open_ranks
    from pytest import MonkeyPatch

    with MonkeyPatch.context() as mp:
        clock = install(mp, Clock())
        if kind == "straggler-across-restart":  # issue 27.4: 20 ms from step 151 on rank 1, relaunched at 200
            def ph(r, s):
                return [("data", 0.01 + (0.02 if r == 1 and s >= 151 else 0.0)), ("fwd_bwd", 0.09)]
            a0 = open_ranks(run, 2)
            drive(a0, range(1, 200), clock, phases=ph)
            close_all(a0)
            clock.t += 30.0
            a1 = open_ranks(run, 2)
            drive(a1, range(200, 401), clock, phases=ph)
            close_all(a1)
            return Expect(kinds=(("straggler", (1,), 151),))
        recs = open_ranks(run, 4)
        if kind == "data-stall":
            drive(recs, range(1, 301), clock, phases=lambda r, s: [("data", 0.08 if s >= 120 else 0.01), ("fwd_bwd", 0.09)])
            exp = Expect(kinds=(("data_stall", None, 120),))
        elif kind == "loss-spike":
            def values(r, s):
                return {"loss": (2.0 - s / 400) * (2.0 if s in (150, 151) else 1.0), "grad_norm": 0.5, "tokens": 1000}
            drive(recs, range(1, 301), clock, phases=lambda r, s: [("data", 0.01), ("fwd_bwd", 0.09)], values=values)
            exp = Expect(kinds=(("loss_spike", None, 150),))
        elif kind == "nan":
            def values(r, s):
                return {"loss": float("nan") if (r, s) == (3, 90) else 1.0, "tokens": 1000}
            drive(recs, range(1, 201), clock, phases=lambda r, s: [("data", 0.01), ("fwd_bwd", 0.09)], values=values)
            exp = Expect(kinds=(("nonfinite", (3,), 90),))
        else:
            raise ValueError(kind)
        close_all(recs)
        return exp


PLANTED = ("straggler-across-restart", "data-stall", "loss-spike", "nan")


def _judge(summary: dict, exp: Expect) -> tuple[bool, str]:
    from kforge_dash.run_view import what_if_text

    loud = [f for f in summary.get("findings") or [] if f.get("severity") in ("warning", "error")]
    hit, missing = set(), []
    for kind, ranks, first in exp.kinds:
        got = [i for i, f in enumerate(loud) if f["kind"] == kind and (ranks is None or tuple(f["ranks"]) == ranks)
               and (first is None or f["first_step"] == first)]
        if got:
            hit.add(got[0])
        else:
            missing.append(kind)
    extra = [f["kind"] for i, f in enumerate(loud) if i not in hit and not any(f["kind"] == k for k, _, _ in exp.kinds)]
    noisy = not exp.kinds and what_if_text(summary) is not None
    ok = not missing and not extra and not noisy
    note = "; ".join(x for x in (f"missed {', '.join(missing)}" if missing else "",
                                 f"extra {', '.join(extra)}" if extra else "", "what-if said" if noisy else "") if x)
    return ok, note


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clean-generated", type=int, default=12, help="generated clean runs (default 12)")
    p.add_argument("--clean", nargs="*", default=[], help="run folders of your own known to be clean")
    args = p.parse_args()
    warnings.simplefilter("ignore")
    from kforge_dash import ingest_run

    rows = []
    with tempfile.TemporaryDirectory(prefix="kforge-precision-") as tmp:
        runs: list[tuple[str, str, str, Expect]] = []
        for name, exp in SAMPLES.items():
            src = os.path.join(REPO, "sample_runs", name)
            if os.path.isdir(src):
                shutil.copytree(src, os.path.join(tmp, name), ignore=shutil.ignore_patterns("ingested"))
                runs.append((name, "sample", os.path.join(tmp, name), exp))
        for i in range(args.clean_generated):
            ranks, steps = (2, 4, 8)[i % 3], (400, 800, 1500)[i % 3]
            d = os.path.join(tmp, f"clean-{i:02d}")
            _clean(d, seed=i, ranks=ranks, steps=steps)
            runs.append((f"clean-{i:02d} ({ranks} ranks, {steps} steps)", "generated", d, Expect()))
        for kind in PLANTED:
            d = os.path.join(tmp, kind)
            runs.append((kind, "generated", d, _planted(d, kind)))
        for i, src in enumerate(args.clean):
            d = os.path.join(tmp, f"own-{i}")
            shutil.copytree(src, d, ignore=shutil.ignore_patterns("ingested"))
            runs.append((os.path.basename(os.path.normpath(src)), "yours", d, Expect()))
        for name, origin, d, exp in runs:
            s = ingest_run(d).summary
            loud = sum(f["severity"] in ("warning", "error") for f in s["findings"])
            info = sum(f["severity"] == "info" for f in s["findings"])
            ok, note = _judge(s, exp)
            rows.append((name, origin, "planted: " + ", ".join(k for k, _, _ in exp.kinds) if exp.kinds else "clean",
                         loud, info, "ok" if ok else "FAIL", note))
    print("| run | from | expected | warning/error findings | info findings | verdict |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, origin, what, loud, info, verdict, note in rows:
        print(f"| {name} | {origin} | {what} | {loud} | {info} | {verdict}{' (' + note + ')' if note else ''} |")
    clean = [r for r in rows if r[2] == "clean"]
    planted = [r for r in rows if r[2] != "clean"]
    print(f"\nclean runs: {len(clean)}, with a warning or error finding (or a what-if): "
          f"{sum(r[5] != 'ok' for r in clean)}; planted runs: {len(planted)}, every planted problem found and nothing "
          f"else loud: {sum(r[5] == 'ok' for r in planted)}")
    return 0 if all(r[5] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
