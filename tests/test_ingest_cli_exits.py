"""kforge-ingest's exit status where --help promises it: a PATH typo is a usage error (2); Ctrl-C says
which runs finished and exits 130 (not click's bare "Aborted!", 1)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from click.testing import CliRunner

from kforge_dash.cli.ingest import main

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "sample_runs"
NO_EXPORT = ["--no-tensorboard", "--no-wandb"]


def _copy_samples(root: Path, copies: int = 1) -> list[str]:
    names = []
    for k in range(copies):
        for src in sorted(p for p in SAMPLES.iterdir() if p.is_dir()):
            name = f"{k:02d}-{src.name}"
            shutil.copytree(src, root / name, ignore=shutil.ignore_patterns("ingested"))
            names.append(name)
    return names


def test_a_path_typo_is_a_usage_error_naming_the_nearest_path(tmp_path, monkeypatch):
    _copy_samples(tmp_path / "sample_runs")
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, ["sampel_runs", *NO_EXPORT])
    assert r.exit_code == 2, r.output
    assert "'sampel_runs': no such file or directory (did you mean 'sample_runs'?)" in r.stderr
    # with a good path beside it: still 2, and nothing is ingested (a typo is caught before any work)
    r = CliRunner().invoke(main, ["sample_runs", "sampel_runs", *NO_EXPORT])
    assert r.exit_code == 2
    assert not list((tmp_path / "sample_runs").glob("*/ingested/summary.json"))


def test_ctrl_c_mid_ingest_lists_the_finished_runs_and_exits_130(tmp_path):
    root = tmp_path / "runs"
    names = _copy_samples(root, copies=4)  # 28 runs: a few seconds of ingest, stopped after the first
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.Popen([sys.executable, "-c", "from kforge_dash.cli.ingest import main; main()", str(root), *NO_EXPORT],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    # Two summaries: runs are ingested in order, so the first is finished (a summary alone may be
    # written a moment before its run counts as finished: waiting for one raced about 1 run in 3).
    while len(list(root.glob("*/ingested/summary.json"))) < 2:
        assert p.poll() is None and time.monotonic() < deadline, "the ingest ended before two runs finished"
        time.sleep(0.01)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    assert "Aborted!" not in err and "Traceback" not in err
    lines = err.splitlines()
    (head,) = [ln for ln in lines if ln.startswith("kforge-ingest: interrupted (Ctrl-C) while ingesting ")]
    stopped_in = Path(head.split(" while ingesting ")[1].split(":")[0]).name
    (fin,) = [ln for ln in lines if ln.startswith("  finished (")]
    finished = fin.split("): ")[1].split(", ")
    (rest,) = [ln for ln in lines if ln.startswith("  not started (")]
    not_started = rest.split("): ")[1].split(", ")
    assert finished and finished == sorted(finished) and stopped_in not in finished
    assert finished + [stopped_in] + not_started == names  # every run accounted for, in order
    done = {x.parent.parent.name for x in root.glob("*/ingested/summary.json")}
    assert set(finished) <= done and not (set(not_started) & done)
    for name in finished:  # each finished run's screen was printed
        assert f"({root / name})" in out
