"""The run's ingest lock: concurrent ingests wait for it, the exports run under it, and the temp files
of a killed ingest or export are removed while those of a live one are left alone."""

import os
import subprocess
import sys
import threading

import pytest
from filelock import FileLock
from ingest_fixtures import read_outputs
from parts_fixtures import make_run, runner

from kforge_dash.cli.ingest import main
from kforge_dash.ingest.options import IngestError, IngestOptions
from kforge_dash.ingest.run import ingest_run
from kforge_dash.pipeline import ingest_path
from kforge_dash.progress import NullProgress


class Events(NullProgress):
    """Progress that notes the events' names."""

    def __init__(self, events: list):
        self.events = events

    def lock_wait(self, run_dir):
        self.events.append("lock-wait")


def test_concurrent_ingests_wait_for_the_lock(tmp_path, monkeypatch):
    run = make_run(tmp_path / "run", monkeypatch)
    lock = FileLock(os.path.join(run, "ingested", ".ingest.lock"))
    events = []
    with lock:  # another ingest is writing this run
        with pytest.raises(IngestError, match="another kforge-ingest"):
            ingest_run(run, options=IngestOptions(lock_timeout_s=0.2), progress=Events(events))
    assert events == ["lock-wait"]
    # two at once: both succeed, one after the other, and the outputs are whole
    results, errors = [], []

    def go():
        try:
            results.append(ingest_run(run, options=IngestOptions(force=True)))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=go) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 2
    steps, ranks, _ = read_outputs(run)
    assert steps.height == 20 and ranks.height == 40


def plant_temps(run) -> list[str]:
    ing = os.path.join(run, "ingested")
    paths = [os.path.join(ing, ".ranks.parquet.4194301.tmp"), os.path.join(ing, ".summary.json.77.tmp"),
             os.path.join(run, ".kforge-events.4194301.tmp")]  # TensorBoard's temp: in RUN/ itself
    for p in paths:
        with open(p, "wb") as f:
            f.write(b"half written")
    wandb_tmp = os.path.join(ing, ".wandb-k1ll3d.tmp")
    os.makedirs(os.path.join(wandb_tmp, "wandb"))
    return [*paths, wandb_tmp]


def test_temp_files_left_by_a_killed_ingest_are_removed_even_when_the_run_is_unchanged(tmp_path, monkeypatch):
    run = make_run(tmp_path / "run", monkeypatch, world=1)
    ingest_path(run, wandb=False)  # with the TensorBoard export
    before = {n: open(os.path.join(run, "ingested", n), "rb").read() for n in ("steps.parquet", "ranks.parquet")}
    temps = plant_temps(run)
    res = ingest_run(run)
    assert res.skipped
    assert [p for p in temps if os.path.exists(p)] == []
    assert {n: open(os.path.join(run, "ingested", n), "rb").read() for n in before} == before


def test_temp_files_of_a_live_ingest_or_export_are_left_alone(tmp_path, monkeypatch):
    run = make_run(tmp_path / "run", monkeypatch, world=1)
    ingest_path(run, wandb=False)
    temps = plant_temps(run)
    lock = os.path.join(run, "ingested", ".ingest.lock")
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from filelock import FileLock; l = FileLock(sys.argv[1]); "
                               "l.acquire(); print('held', flush=True); sys.stdin.read()", lock],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(IngestError, match="another kforge-ingest"):
            ingest_run(run, options=IngestOptions(lock_timeout_s=0.2))
        assert [p for p in temps if not os.path.exists(p)] == []  # a live one's: kept
    finally:
        holder.communicate("")
    assert ingest_run(run).skipped
    assert [p for p in temps if os.path.exists(p)] == []


def test_the_pipeline_exports_under_the_runs_ingest_lock(tmp_path, monkeypatch):
    from filelock import FileLock, Timeout

    import kforge_dash.export.exporters as exporters
    from kforge_dash.export.outcome import ExporterOutcome

    run = make_run(tmp_path / "run", monkeypatch, world=1)
    seen = []

    class Probe:
        name, needs = "tensorboard", None

        def export(self, history):
            try:
                FileLock(os.path.join(run, "ingested", ".ingest.lock")).acquire(timeout=0)
                seen.append("free")
            except Timeout:
                seen.append("held")
            return ExporterOutcome(ok=True, path="probe")

    monkeypatch.setattr(exporters, "choose_exporters", lambda **kw: [Probe()])
    r = runner().invoke(main, [run, "-q", "--no-wandb"])
    assert r.exit_code == 0, r.output
    assert seen == ["held"]
