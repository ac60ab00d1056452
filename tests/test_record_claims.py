"""Two writers never share an attempt folder or a part file name."""

import os
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest
from ingest_fixtures import warns_each

from kforge_dash import ingest_run
from kforge_record import Recorder

CHILD = os.path.join(os.path.dirname(__file__), "record_child.py")
# One Slurm launch: every process computes the same attempt id from these.
SLURM = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_JOB_START_TIME": "1796080000", "SLURM_RESTART_COUNT": "0"}


def test_two_processes_that_both_are_rank_0_of_one_launch_keep_every_row(tmp_path):
    runs = [tmp_path / f"run{i}" for i in range(3)]  # three pairs, each started in one instant
    env = {**os.environ, **SLURM}
    start_at = time.time() + 2.0
    procs = [subprocess.Popen([sys.executable, CHILD, str(run), "plain", "steps=200", "sleep=0", "flush_every_steps=20",
                               f"start_at={start_at}"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for run in runs for _ in range(2)]
    for p in procs:
        assert p.wait(timeout=120) == 0, p.stderr.read()
    for run in runs:
        folders = sorted((run / "rank-00000").iterdir())
        assert len(folders) == 2, "each process claimed a folder of its own"
        assert folders[0].name == "20261130T230640.000000Z-slurm4242.0-r000"
        assert folders[1].name.startswith(folders[0].name + "-p")
        for folder in folders:
            steps = pq.read_table(sorted(folder.glob("part-*.parquet")), columns=["step"]).column("step").to_pylist()
            assert sorted(steps) == list(range(1, 201)), f"{folder}: every row of its writer, none overwritten"
        with warns_each("2 processes wrote launch"):  # and, when the two overlapped by over 1 s, that they did
            result = ingest_run(run)
        (warning,) = [w for w in result.summary["warnings"] if "second writer" in w]
        assert "rank 0: 2 processes" in warning and str(folders[0]) in warning and str(folders[1]) in warning


def test_a_second_recorder_of_one_process_is_not_called_a_second_writer(tmp_path, monkeypatch):
    for k, v in SLURM.items():
        monkeypatch.setenv(k, v)
    run = tmp_path / "run"
    for loss in (1.0, 2.0):  # sequential, as a script that records two phases of one job would
        with Recorder(run, rank=0, world_size=1, install_sigterm_handler=False) as rec:
            rec.end_step(1, loss=loss)
    assert len(list((run / "rank-00000").iterdir())) == 2
    assert not [w for w in ingest_run(run).summary["warnings"] if "second writer" in w]


def test_a_part_file_name_that_is_taken_is_never_overwritten(tmp_path):
    run = tmp_path / "run"
    rec = Recorder(run, rank=0, world_size=1, flush_every_steps=10, flush_every_s=3600, install_sigterm_handler=False)
    foreign = os.path.join(rec.attempt_dir, "part-000000.parquet")
    with open(foreign, "wb") as f:
        f.write(b"another writer's part file")
    with pytest.warns(RuntimeWarning, match="part-000000.parquet exists already"):
        for step in range(1, 21):
            rec.end_step(step, loss=1.0)
        rec.close()
    with open(foreign, "rb") as f:
        assert f.read() == b"another writer's part file"
    mine = sorted(n for n in os.listdir(rec.attempt_dir) if n.startswith("part-") and n != "part-000000.parquet")
    steps = pq.read_table([os.path.join(rec.attempt_dir, n) for n in mine], columns=["step"]).column("step").to_pylist()
    assert sorted(steps) == list(range(1, 21)) and rec.dropped_rows == 0
