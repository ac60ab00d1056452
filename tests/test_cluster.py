"""kforge-ingest --dask (kforge_dash/cluster.py): the same outputs as a local ingest, on a LocalCluster
(local:2) and on a scheduler + 2 workers started as separate processes on 127.0.0.1; failures are
quick and clear and never touch the last good outputs. Dask starts in seconds: few, shared clusters."""

import functools
import json
import os
import shutil
import subprocess
import sys
import time

import dask
import distributed
import polars as pl
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from ingest_fixtures import close_all, flush_all, open_ranks, read_outputs, run_steps
from ports_fixtures import free_port

from kforge_dash.cli.ingest import _screen, main
from kforge_dash.cluster import ClusterError, DaskOptions, DaskWindows, dask_client, ingest_paths_dask
from kforge_dash.ingest.options import IngestOptions
from kforge_dash.ingest.rowpass.window import ingest_window
from kforge_dash.ingest.run import ingest_run

NO_EXPORT = ["--no-tensorboard", "--no-wandb"]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHUNK = 40  # rows a window: 4 ranks x 10 steps, so a run of 40 steps is several windows


def values(r, s):
    v = {"loss": 3.0 - 0.01 * s + 0.001 * r, "tokens": 100 * (r + 1), "grad_norm": float(r + s), "lr": 1e-3}
    if (r + s) % 3:
        v["aux"] = float(s * 10 + r)  # a scalar with holes
    return v


def make_run(path, monkeypatch, *, ranks=4):
    """Parts of 5 steps, log rows, a restart at step 25 and a log row past the last ended step."""
    path = str(path)
    recs = open_ranks(path, ranks, flush_every_steps=5)
    clock = run_steps(monkeypatch, recs, range(1, 31), step_time=lambda r, s: 0.1 * (1 + (s * (r + 1)) % 5),
                      values=values, flush_every=5)
    for r, rec in recs.items():
        rec.log(10, **{"eval/loss": float(r)})
    close_all(recs)
    recs = open_ranks(path, ranks, flush_every_steps=5)
    run_steps(monkeypatch, recs, range(25, 41), step_time=lambda r, s: 0.2, values=values, clock=clock, flush_every=5)
    recs[1].log(45, **{"eval/loss": 9.0})
    close_all(recs)
    return path


def outputs(run):
    steps, ranks, summary = read_outputs(run)
    with open(os.path.join(run, "ingested", "steps.parquet"), "rb") as f:
        raw = f.read()
    summary = {k: v for k, v in summary.items() if k != "ingested_at"}
    return raw, steps, ranks.sort("step", "rank", "attempt"), summary


def assert_same(got, want):
    assert got[0] == want[0]  # steps.parquet byte for byte
    assert got[1].equals(want[1])
    assert got[2].equals(want[2])  # ranks.parquet up to row order
    assert json.dumps(got[3], sort_keys=True, default=str) == json.dumps(want[3], sort_keys=True, default=str)


def twin(src, dst):
    """A copy of a runs tree with the same file times (so the same fingerprints), nothing ingested."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("ingested"))
    return str(dst)


def local_outputs(run):
    ingest_run(run, options=IngestOptions(chunk_rows=CHUNK, force=True))
    return outputs(run)


@pytest.fixture(scope="module")
def local2():
    """One local:2 cluster for the tests below; a worker that dies fails its task at once."""
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        opts = DaskOptions(address="local:2", whole_run_bytes=0)
        with dask_client(opts) as client:
            yield client, opts


def test_windows_on_local2_equal_a_local_ingest(tmp_path, monkeypatch, local2):
    client, opts = local2
    run = make_run(tmp_path / "runs" / "a", monkeypatch)
    want = local_outputs(twin(tmp_path / "runs", tmp_path / "local") + "/a")
    with distributed.get_task_stream(client) as ts:
        res = ingest_paths_dask([str(tmp_path / "runs")], options=IngestOptions(chunk_rows=CHUNK), exporters=[],
                                client=client, opts=opts)
    assert [r.run_dir for r in res.ok] == [run] and not res.failed
    windows = [t for t in ts.data if str(t["key"]).startswith("kforge-window-")]
    assert len(windows) >= 4  # the run went window by window through the workers
    assert_same(outputs(run), want)


def test_the_driver_s_bytes_are_measured_and_printed(tmp_path, monkeypatch, local2):
    """Issue 29 goal 3: what the driver receives per run, split, beside the rows' own bytes; printed."""
    client, opts = local2
    run = make_run(tmp_path / "a", monkeypatch)
    res = ingest_paths_dask([run], options=IngestOptions(chunk_rows=CHUNK), exporters=[], client=client, opts=opts)
    d = res.ok[0].driver
    ranks = pq.read_table(os.path.join(run, "ingested", "ranks.parquet"))
    assert d.windows >= 4 and d.n_rows == ranks.num_rows
    assert d.received == d.rows + d.steps + d.periods + d.other
    assert d.rows_arrow >= 0.5 * ranks.nbytes
    # every row's buffers shipped, plus the schema and pickle's framing (~6 KB) per window
    assert d.rows_arrow <= d.rows <= d.rows_arrow + 10_000 * d.windows
    assert d.steps > 0 and d.periods > 0 and d.worker_cpu_s > 0
    assert d.fraction >= 1.0  # today's funnel: all the rows come to the driver
    line = [x for x in _screen(res.ok[0]) if "dask: driver received" in x]
    assert len(line) == 1 and "of the rows'" in line[0] and "rows for ranks.parquet" in line[0], _screen(res.ok[0])


def test_an_append_on_local2_equals_a_local_ingest(tmp_path, monkeypatch, local2):
    """A running job's new parts, appended window by window on the workers (old rows merged in there)."""
    client, opts = local2
    run = str(tmp_path / "runs" / "live")
    recs = open_ranks(run, 4, flush_every_steps=5)
    clock = run_steps(monkeypatch, recs, range(1, 31), step_time=lambda r, s: 0.1 * (1 + s % 3), values=values,
                      flush_every=5)
    ingest_run(run, options=IngestOptions(chunk_rows=CHUNK))
    run_steps(monkeypatch, recs, range(31, 46), step_time=lambda r, s: 0.2, values=values, clock=clock, flush_every=5)
    recs[2].log(33, **{"eval/loss": 1.5})
    flush_all(recs)
    want = local_outputs(twin(tmp_path / "runs", tmp_path / "local") + "/live")
    res = ingest_paths_dask([run], options=IngestOptions(chunk_rows=CHUNK), exporters=[], client=client, opts=opts)
    close_all(recs)
    assert len(res.ok) == 1 and res.ok[0].appended, res.failed
    assert_same(outputs(run), want)


def test_a_worker_that_dies_fails_the_run_and_keeps_the_last_outputs(tmp_path, monkeypatch, local2):
    client, opts = local2
    run = make_run(tmp_path / "a", monkeypatch)
    ingest_run(run, options=IngestOptions(chunk_rows=CHUNK))
    ing = os.path.join(run, "ingested")
    before = {n: open(os.path.join(ing, n), "rb").read() for n in sorted(os.listdir(ing)) if n.endswith(".parquet")}

    marker = str(tmp_path / "died")

    def die_after_the_first(task, **kw):  # sent by value (cloudpickle); one worker exits mid-ingest
        if task.lo > 1:
            try:  # only the first such window kills its worker: no other dying task is left to
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL))  # kill a worker of a later test
                os._exit(1)
            except FileExistsError:
                pass
        return ingest_window(task, **kw)

    class Dying(DaskWindows):
        def map(self, fn, tasks):
            return super().map(die_after_the_first, tasks)

    t0 = time.monotonic()
    with pytest.raises(ClusterError, match=r"window of steps \[\d+, \d+\): the Dask worker running it died"):
        ingest_run(run, options=IngestOptions(chunk_rows=CHUNK, force=True), windows=Dying(client, opts, run_dir=run))
    assert time.monotonic() - t0 < 60
    after = {n: open(os.path.join(ing, n), "rb").read() for n in sorted(os.listdir(ing)) if n.endswith(".parquet")}
    assert after == before  # ranks.parquet was half written under a temp name, removed
    assert not [n for n in os.listdir(ing) if n.endswith(".tmp")]


def test_a_stuck_window_fails_the_run_after_task_timeout_s(tmp_path, monkeypatch, local2):
    client, _ = local2
    client.wait_for_workers(2, timeout=60)  # the nanny has restarted a worker an earlier test killed
    opts = DaskOptions(address="local:2", task_timeout_s=1.0)
    run = make_run(tmp_path / "a", monkeypatch, ranks=2)

    def stuck(task, **kw):  # a worker thread that never comes back (a hung filesystem, say)
        time.sleep(4)
        return ingest_window(task, **kw)

    class Stuck(DaskWindows):
        def map(self, fn, tasks):
            return super().map(stuck, tasks)

    t0 = time.monotonic()
    with pytest.raises(ClusterError, match=r"window of steps \[\d+, \d+\): not done after 1s on the Dask cluster"):
        ingest_run(run, options=IngestOptions(chunk_rows=CHUNK), windows=Stuck(client, opts, run_dir=run))
    assert time.monotonic() - t0 < 4
    assert not [n for n in os.listdir(os.path.join(run, "ingested")) if n.endswith(".parquet")]


def test_cli_dask_local2_equals_a_local_ingest(tmp_path, monkeypatch):
    """Two small runs: each one whole-run task on a LocalCluster the CLI starts and stops."""
    for name in ("a", "b"):
        make_run(tmp_path / "runs" / name, monkeypatch, ranks=2 if name == "b" else 4)
    local = twin(tmp_path / "runs", tmp_path / "local")
    for name in ("a", "b"):
        ingest_run(os.path.join(local, name))
    res = CliRunner().invoke(main, [str(tmp_path / "runs"), "--dask", "local:2", "--json", *NO_EXPORT])
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    assert [r["run_dir"] for r in got["runs"]] == [str(tmp_path / "runs" / n) for n in ("a", "b")]
    for name in ("a", "b"):
        assert_same(outputs(str(tmp_path / "runs" / name)), outputs(os.path.join(local, name)))


def test_cli_dask_prints_what_the_driver_received(tmp_path, monkeypatch):
    """A run window by window (whole_run_bytes=0) through the CLI: --json's "driver" per run."""
    import kforge_dash.cluster as cluster

    run = make_run(tmp_path / "a", monkeypatch, ranks=2)
    monkeypatch.setattr(cluster, "DaskOptions", functools.partial(DaskOptions, whole_run_bytes=0))
    res = CliRunner().invoke(main, [run, "--dask", "local:1", "--json", *NO_EXPORT])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)["runs"][0]["driver"]
    assert d["windows"] == 1 and d["n_rows"] > 0 and d["received"] >= d["rows"] >= d["rows_arrow"] > 0
    assert d["fraction"] == d["received"] / d["rows_arrow"]


def test_an_unreachable_scheduler_fails_fast_and_writes_nothing(tmp_path, monkeypatch):
    run = make_run(tmp_path / "a", monkeypatch, ranks=2)
    t0 = time.monotonic()
    res = CliRunner().invoke(main, [run, "--dask", f"tcp://127.0.0.1:{free_port()}", "--dask-connect-timeout", "2",
                                    *NO_EXPORT])
    assert res.exit_code == 1
    assert "could not reach the Dask scheduler within 2s" in res.stderr
    assert time.monotonic() - t0 < 20
    assert not os.path.exists(os.path.join(run, "ingested"))


def test_bad_dask_addresses_are_usage_errors(tmp_path):
    for bad in ("local:0", "local:x", " "):
        res = CliRunner().invoke(main, [str(tmp_path), "--dask", bad])
        assert res.exit_code == 2 and "--dask" in res.stderr, (bad, res.stderr)
    res = CliRunner().invoke(main, [str(tmp_path), "--dask", "local:2", "--watch", "5"])
    assert res.exit_code == 2 and "--watch" in res.stderr


def _start(args, log, env):
    return subprocess.Popen([sys.executable, "-m", "dask", *args], env=env, cwd=os.path.dirname(log),
                            stdin=subprocess.DEVNULL, stdout=open(log, "wb"), stderr=subprocess.STDOUT)


def _wait_for(pred, what, timeout=60):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def test_a_scheduler_and_two_workers_started_apart_equal_a_local_ingest(tmp_path, monkeypatch):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    sfile = str(tmp_path / "scheduler.json")
    procs = [_start(["scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard", "--scheduler-file", sfile],
                    str(tmp_path / "scheduler.log"), env)]
    try:
        _wait_for(lambda: os.path.exists(sfile) and os.path.getsize(sfile), "the scheduler file")
        with open(sfile) as f:
            address = json.load(f)["address"]
        assert address.startswith("tcp://127.0.0.1:")
        for name in ("a", "b"):
            make_run(tmp_path / "runs" / name, monkeypatch)
        local = twin(tmp_path / "runs", tmp_path / "local")
        ingest_run(os.path.join(local, "b"))  # the CLI's default windows, for "b"
        want = {"a": local_outputs(os.path.join(local, "a")), "b": outputs(os.path.join(local, "b"))}

        # No worker yet: the driver gives up after no_workers_timeout_s, nothing written.
        opts = DaskOptions(address=sfile, whole_run_bytes=0, no_workers_timeout_s=1.0)
        with dask_client(opts) as client:
            res = ingest_paths_dask([str(tmp_path / "runs" / "a")], options=IngestOptions(chunk_rows=CHUNK),
                                    exporters=[], client=client, opts=opts)
        assert not res.ok and "no worker alive for 1s" in res.failed[0].error
        assert not os.path.exists(os.path.join(tmp_path, "runs", "a", "ingested", "steps.parquet"))

        for i in range(2):
            procs.append(_start(["worker", address, "--nthreads", "1", "--host", "127.0.0.1", "--no-dashboard",
                                 "--no-nanny", "--name", f"w{i}"], str(tmp_path / f"worker{i}.log"), env))
        with distributed.Client(address, timeout="10s") as c:
            c.wait_for_workers(2, timeout=60)
        # Run "a" window by window (the scheduler file), run "b" as one task (the tcp:// address, the CLI).
        opts = DaskOptions(address=sfile, whole_run_bytes=0)
        with dask_client(opts) as client:
            res = ingest_paths_dask([str(tmp_path / "runs" / "a")], options=IngestOptions(chunk_rows=CHUNK),
                                    exporters=[], client=client, opts=opts)
        assert len(res.ok) == 1 and not res.failed, res.failed
        res = CliRunner().invoke(main, [str(tmp_path / "runs" / "b"), "--dask", address, "--force", *NO_EXPORT])
        assert res.exit_code == 0, res.output
        for name in ("a", "b"):
            assert_same(outputs(str(tmp_path / "runs" / name)), want[name])
        steps = pl.read_parquet(os.path.join(tmp_path, "runs", "a", "ingested", "steps.parquet"))
        assert steps.height == 41  # steps 1..40 and a log row at 45
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
