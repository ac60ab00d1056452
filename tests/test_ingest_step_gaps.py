"""Step numbers far apart (valid int64 steps): ingest's time and memory follow the rows, not the gap
between step numbers. Ingest runs in a child process with a memory cap and a timeout, so that a
path dense over the step range fails the test fast instead of eating the machine."""

import json
import os
import resource
import subprocess
import sys

import polars as pl
import pytest

from kforge_record import Recorder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Address space of the ingest process: these runs need ~0.3 GiB resident, ~2.7 GiB of address space
# (thread stacks, allocator arenas; 2 threads a pool); a path dense over the steps passes it in seconds.
MEMORY_CAP = 4 << 30
TIMEOUT_S = 90  # a normal ingest of these runs takes seconds (20 s on a loaded 2-core machine)

FAR = 10**12
INT64_MAX = 2**63 - 1


def _record(run: str, ends: list[int], logs: list[int], world: int = 2, gap: int | None = None) -> None:
    """Every rank ends the steps ``ends`` (rank 1 all but ``gap``) and logs an eval loss at ``logs``."""
    for rank in range(world):
        rec = Recorder(run, rank=rank, world_size=world, install_sigterm_handler=False)
        for step in ends:
            if rank == 1 and step == gap:
                continue
            with rec.phase("data"):
                pass
            with rec.phase("fwd"):
                pass
            rec.end_step(step, loss=1.0 + rank, tokens=10)
        for step in logs:
            rec.log(step, **{"eval/loss": 0.5})
        rec.close()


def _ingest_capped(run: str) -> subprocess.CompletedProcess:
    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))

    cli = "from kforge_dash.cli.ingest import main; main()"
    env = dict(os.environ, PYTHONPATH=ROOT, POLARS_MAX_THREADS="2", OMP_NUM_THREADS="2")  # 2 threads a pool
    return subprocess.run([sys.executable, "-c", cli, "--json", run], cwd=ROOT, env=env, preexec_fn=cap,
                          capture_output=True, text=True, timeout=TIMEOUT_S)


@pytest.mark.parametrize("ends, logs, gap", [
    (list(range(1, 51)) + [FAR], [], None),  # end_step at a far step
    (list(range(1, 51)), [FAR], 25),  # log() at a far step (and a rank that missed a step: not one grid)
    ([1, 2**62, INT64_MAX], [], None),  # the int64 range's far end
], ids=["end_step-1e12", "log-1e12", "int64-max"])
def test_a_far_step_is_ingested_in_bounded_time_and_memory(tmp_path, ends, logs, gap):
    run = str(tmp_path / "run")
    _record(run, ends, logs, gap=gap)
    out = _ingest_capped(run)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    steps = pl.read_parquet(os.path.join(run, "ingested", "steps.parquet"))
    assert steps["step"].to_list() == sorted(set(ends) | set(logs))
    assert steps.filter(pl.col("step") == max(ends + logs))["n_ranks"].to_list() == [2]
    ranks = pl.read_parquet(os.path.join(run, "ingested", "ranks.parquet"))
    assert ranks.height == 2 * len(set(ends) | set(logs)) - (gap is not None)
    with open(os.path.join(run, "ingested", "summary.json")) as f:
        summary = json.load(f)
    # the findings too were computed (a detector that fails is only a warning: it must not here)
    assert not [w for w in summary["warnings"] if w.startswith("findings:")], summary["warnings"]
    assert summary["goodput"] is not None
