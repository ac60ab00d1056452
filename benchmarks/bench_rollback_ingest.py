"""What an in-process rollback costs ingest: the same run ingested by a reference tree and by this one.

    PYTHONPATH=$PWD python3 benchmarks/bench_rollback_ingest.py --ref /work/main [--ranks 16] [--steps 20000] [--repeats 5]

Writes three runs with the real Recorder (``--ranks`` ranks, about ``--steps`` steps each, a few scalars):
``clean`` (no repeat), ``rollback`` (steps 1..S, back to 2S/3, on to S + S/3: the rows after the rollback
point are read again, ingest/lineage/rollbacks.py) and ``relaunch`` (a second launch resumed from 2S/3: the first
launch's rows past it are read for superseded.parquet). Each run is ingested (``force``: from scratch) in a
fresh process by the reference tree and by this tree, interleaved, ``--repeats`` times; prints the median
wall time of each, their ratio, and the median time of this tree's lineage pass (ingest/lineage/rollbacks.py) within it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# One ingest from scratch; prints its wall time and that of the lineage pass (rollbacks.find_rollbacks; 0 without it).
_INGEST = """
import sys, time, warnings
warnings.simplefilter("ignore")
import kforge_dash.ingest.run as r
from kforge_dash.ingest.options import IngestOptions
spent = [0.0]
if hasattr(r, "find_rollbacks"):
    inner = r.find_rollbacks
    def timed(*a, **k):
        t = time.perf_counter()
        try:
            return inner(*a, **k)
        finally:
            spent[0] += time.perf_counter() - t
    r.find_rollbacks = timed
t = time.perf_counter()
r.ingest_run(sys.argv[1], options=IngestOptions(force=True))
print(time.perf_counter() - t, spent[0])
"""


def _record(run: str, ranks: int, launches: list[list[int]]) -> None:
    from kforge_record import Recorder

    for steps in launches:
        recs = [Recorder(run, rank=r, world_size=ranks, install_sigterm_handler=False, flush_every_steps=5000)
                for r in range(ranks)]
        for s in steps:
            for rec in recs:
                rec.start_step()
                rec.end_step(s, loss=1.0 / s, grad_norm=1.0, lr=3e-4, tokens=4096, acc=0.5)
        for rec in recs:
            rec.close()


def _time(tree: str, run: str) -> tuple[float, float]:
    env = {**os.environ, "PYTHONPATH": tree}
    out = subprocess.run([sys.executable, "-c", _INGEST, run], env=env, capture_output=True, text=True, check=True)
    total, lineage = out.stdout.strip().splitlines()[-1].split()
    return float(total), float(lineage)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ref", required=True, help="the reference tree (e.g. a checkout of main)")
    ap.add_argument("--ranks", type=int, default=16)
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    s, back = a.steps, 2 * a.steps // 3
    shapes = {"clean": [list(range(1, s + 1))],
              "rollback": [list(range(1, s + 1)) + list(range(back, s + s // 3 + 1))],
              "relaunch": [list(range(1, s + 1)), list(range(back, s + s // 3 + 1))]}
    with tempfile.TemporaryDirectory() as tmp:
        runs = {}
        for name, launches in shapes.items():
            runs[name] = os.path.join(tmp, name)
            _record(runs[name], a.ranks, launches)
        print(f"{a.ranks} ranks, ~{s} steps; ingest from scratch, median of {a.repeats} (s)")
        print(f"{'run':<10} {'ref':>8} {'this':>8} {'this/ref':>9} {'lineage pass':>13}")
        for name, run in runs.items():
            got = {"ref": [], "this": [], "pass": []}
            for _ in range(a.repeats):  # interleaved: the machine's load hits both alike
                got["ref"].append(_time(a.ref, run)[0])
                total, lineage = _time(HERE, run)
                got["this"].append(total)
                got["pass"].append(lineage)
            ref, this, lin = (statistics.median(got[k]) for k in ("ref", "this", "pass"))
            print(f"{name:<10} {ref:>8.3f} {this:>8.3f} {this / ref:>9.2f} {lin:>13.3f}")


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"({time.perf_counter() - t0:.0f} s in all)")
