"""`kforge-ingest --dask ADDRESS`: ingest on a Dask cluster (distributed futures, polars inside each task).

Two kinds of task, both plain functions of plain values:

* a **step window** of one run (ingest/rowpass/window.py ``window_rows``): it reads every rank's rows for
  its steps, so per-step max/median/slowest rank stay exact without a shuffle. The driver (this
  process) plans the run from its footers, keeps a few windows in flight per worker, gathers the
  results in window order, writes ranks.parquet as they come, then derives tokens/s, MFU and
  the EMAs over the reduced steps and writes steps.parquet and summary.json: the same code as a
  local ingest (ingest_run with a windows executor), so the same outputs.
* a **whole run** of a runs root, for a run smaller than ``whole_run_bytes`` of part files: one
  worker runs ingest_run on it (the run's folder must be on a filesystem the workers share, as
  it is on a cluster), so hundreds of small runs ingest side by side while the driver works
  through the big ones window by window.

What the driver received for a run's windows (bytes as shipped, split; the workers' CPU) is
measured on the way (ingest/shipped.py) and carried in its IngestResult (``driver``).

Exports (TensorBoard, W&B) run on the driver after each run's ingest. Failures never hang and
never leave half a file: every wait has a timeout, a window whose worker died fails its run
(the outputs are published by rename only at the end, so the last good ones stay), and a lost
scheduler fails the runs not done yet with a message that says so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from kforge_dash.export.outcome import Exporter
from kforge_dash.ingest.inputs import shards as _shards
from kforge_dash.ingest.option_spec import CONNECT_TIMEOUT
from kforge_dash.ingest.options import (
    IngestError,
    IngestFailure,
    IngestNotReady,
    IngestOptions,
    IngestResult,
    IngestWaiting,
)
from kforge_dash.ingest.rowpass.buffers import Buffers
from kforge_dash.ingest.rowpass.window import WindowRows, WindowTask
from kforge_dash.ingest.run import ingest_run
from kforge_dash.ingest.shipped import Funnel, WindowBytes, window_bytes
from kforge_dash.optional import require
from kforge_dash.pipeline import IngestPass, export_ingested, ingest_and_export, runs_at
from kforge_dash.progress import NullProgress
from kforge_record.checks import check_int

__all__ = ["ClusterError", "DaskOptions", "DaskWindows", "dask_client", "ingest_paths_dask"]

_PURPOSE = "kforge-ingest --dask"


class ClusterError(IngestError):
    """The Dask cluster could not do the work: scheduler unreachable or lost, workers dead or absent."""


@dataclass(frozen=True, kw_only=True)
class DaskOptions:
    """Where and how ``kforge-ingest --dask`` runs (kforge_dash.cluster). The timeouts are checked as
    ``--dask-connect-timeout`` is (the same message for the same bad value).

    Attributes:
        address: ``tcp://HOST:PORT`` (any Dask address), ``local:N`` (N local workers), or a scheduler file.
        connect_timeout_s: an unreachable scheduler fails after this long.
        no_workers_timeout_s: no worker alive this long (all died, none joined): fail.
        task_timeout_s: a task (a window, a whole run) not back this long is stuck: its run fails.
        whole_run_bytes: a run with fewer bytes of part files is one task.
        windows_per_worker: windows in flight per worker (one running, one queued).
    """

    address: str  # tcp://host:port (any Dask address), local:N, or a scheduler file (*.json)
    connect_timeout_s: float = 10.0  # an unreachable scheduler fails after this long
    no_workers_timeout_s: float = 60.0  # no worker alive this long (all died, none joined): fail
    # One task (a window, a whole run) not back this long is taken as stuck (a hung filesystem, a
    # deadlocked worker): fail its run rather than wait for ever. Its start counts from when the
    # driver begins to wait for it, so a window queued behind others gets the full time too.
    task_timeout_s: float = 3600.0
    whole_run_bytes: int = 256 << 20  # a run with fewer bytes of part files is one task (see module docstring)
    windows_per_worker: int = 2  # windows in flight per worker: one running, one queued behind it

    def __post_init__(self):
        if not isinstance(self.address, str) or not self.address.strip():
            raise ValueError("address: give tcp://HOST:PORT, local:N or a scheduler file")
        if self.address.startswith("local:"):
            n = self.address[len("local:"):]
            if not (n.isdigit() and int(n) >= 1):
                raise ValueError(f"address {self.address!r}: local:N needs a worker count N >= 1")
        for name in ("connect_timeout_s", "no_workers_timeout_s", "task_timeout_s"):
            CONNECT_TIMEOUT.check(name, getattr(self, name))  # the check of kforge-ingest --dask-connect-timeout
        check_int("whole_run_bytes", self.whole_run_bytes, 0)
        check_int("windows_per_worker", self.windows_per_worker, 1)

    @property
    def local_workers(self) -> int | None:
        """N of local:N, else None (an existing cluster)."""
        return int(self.address[len("local:"):]) if self.address.startswith("local:") else None


@contextlib.contextmanager
def dask_client(opts: DaskOptions) -> Iterator:
    """A connected distributed.Client; for local:N also the LocalCluster, stopped on exit.

    Raises ClusterError (naming the address) when the scheduler cannot be reached in
    ``connect_timeout_s``, or MissingDependency without the ``kforge[dask]`` extra.
    """
    distributed = require("distributed", extra="dask", purpose=_PURPOSE)
    timeout = f"{opts.connect_timeout_s}s"
    cluster = None
    # Results straight from the workers, not through the scheduler (distributed's default for a
    # client outside a worker): 64x20000 (one window of 1.28M rows) on local:2, 18.3 s -> 3.3 s
    # (python benchmarks/bench_dask.py --size 64x20000 --repeat 2, False vs True here). The driver
    # must reach the workers' addresses.
    direct = {"timeout": timeout, "direct_to_workers": True}
    try:
        if opts.local_workers is not None:
            # One thread per worker: a window at a time each (memory bounded by the window), while
            # polars inside the task uses the cores. No dashboard; the scheduler's small HTTP server
            # (health, metrics) on a free port of 127.0.0.1: nothing listens beyond this machine.
            cluster = distributed.LocalCluster(n_workers=opts.local_workers, threads_per_worker=1, processes=True,
                                               host="127.0.0.1", dashboard_address="127.0.0.1:0",
                                               scheduler_kwargs={"dashboard": False}, silence_logs=logging.ERROR)
            client = distributed.Client(cluster, **direct)
        elif opts.address.endswith(".json"):
            client = distributed.Client(scheduler_file=opts.address, **direct)
        else:
            client = distributed.Client(opts.address, **direct)
    except (OSError, TimeoutError) as e:
        if cluster is not None:
            cluster.close()
        raise ClusterError(f"--dask {opts.address}: could not reach the Dask scheduler within "
                           f"{opts.connect_timeout_s:g}s ({type(e).__name__}: {e})") from None
    try:
        yield client
    finally:
        with contextlib.suppress(Exception):
            client.close(timeout=opts.connect_timeout_s)
        if cluster is not None:
            with contextlib.suppress(Exception):
                cluster.close(timeout=opts.connect_timeout_s)


def _cancelled(distributed) -> tuple:
    """The exception types of a future cancelled under us (FutureCancelledError is newer than 2024.6)."""
    return tuple(t for t in (getattr(distributed.client, "FutureCancelledError", None), distributed.CancelledError) if t)


class _Watch:
    """Waits on one future with a timeout slice at a time, and gives up (ClusterError) when the
    cluster has had no worker, or the client no scheduler, for ``no_workers_timeout_s``, or the
    task is not back after ``task_timeout_s``."""

    def __init__(self, client, opts: DaskOptions):
        self.client, self.opts = client, opts

    def alive(self) -> bool:
        return self.client.status == "running" and bool(self.client.scheduler_info().get("workers"))

    def result(self, future, what: str):
        distributed = require("distributed", extra="dask", purpose=_PURPOSE)
        lost_since = None
        since = time.monotonic()
        while True:
            try:
                return future.result(timeout=1.0)
            except distributed.TimeoutError:
                pass
            except distributed.KilledWorker as e:
                raise ClusterError(f"{what}: the Dask worker running it died, also when retried ({e}); "
                                   f"no output was written") from None
            except _cancelled(distributed) as e:
                raise ClusterError(f"{what}: cancelled by the Dask cluster, the scheduler lost? ({e}); "
                                   f"no output was written") from None
            if time.monotonic() - since > self.opts.task_timeout_s:
                raise ClusterError(f"{what}: not done after {self.opts.task_timeout_s:g}s on the Dask cluster "
                                   f"({self.opts.address}); given up, no output was written")
            if self.alive():
                lost_since = None
                continue
            lost_since = lost_since if lost_since is not None else time.monotonic()
            if time.monotonic() - lost_since > self.opts.no_workers_timeout_s:
                why = "no scheduler" if self.client.status != "running" else "no worker alive"
                raise ClusterError(f"{what}: {why} for {self.opts.no_workers_timeout_s:g}s on the Dask cluster "
                                   f"({self.opts.address}); no output was written")


_local = threading.local()


def _on_worker(fn: Callable[..., WindowRows], task: WindowTask) -> tuple[WindowRows, WindowBytes]:
    """``fn(task)`` with this worker thread's numpy work space, reused window after window, and
    what its result weighs as shipped to the driver (ingest/shipped.py)."""
    buffers = getattr(_local, "buffers", None)
    if buffers is None:
        buffers = _local.buffers = Buffers()
    cpu, wall = time.process_time(), time.perf_counter()
    out = fn(task, buffers=buffers)
    return out, window_bytes(out, cpu_s=time.process_time() - cpu, wall_s=time.perf_counter() - wall)


class DaskWindows:
    """A windows executor (ingest/rowpass/window.py) whose windows run on Dask workers.

    At most ``windows_per_worker`` x workers windows are submitted ahead, so neither the cluster
    nor this process holds more than that many windows of rows; results come back in order.
    ``funnel``: what this process received, window by window (ingest/shipped.py)."""

    def __init__(self, client, opts: DaskOptions, *, run_dir: str):
        self.client, self.opts, self.run_dir = client, opts, run_dir
        self.watch = _Watch(client, opts)
        self.funnel = Funnel()

    def map(self, fn: Callable[[WindowTask], WindowRows], tasks: Iterable[WindowTask]) -> Iterator[WindowRows]:
        todo = iter(list(enumerate(tasks)))
        tag = uuid.uuid4().hex[:8]
        workers = max(1, len(self.client.scheduler_info().get("workers") or {}))
        ahead = self.opts.windows_per_worker * workers
        pending: deque = deque()

        def submit(item: tuple[int, WindowTask]):
            i, t = item
            pending.append((t, self.client.submit(_on_worker, fn, t, key=f"kforge-window-{tag}-{i}", pure=False)))

        try:
            for item in todo:
                submit(item)
                if len(pending) >= ahead:
                    break
            while pending:
                t, f = pending.popleft()
                out, weight = self.watch.result(f, f"{self.run_dir}: window of steps [{t.lo}, {t.hi})")
                f.release()
                self.funnel.add(weight)
                nxt = next(todo, None)
                if nxt is not None:
                    submit(nxt)
                back = time.perf_counter()
                yield out
                self.funnel.driver_s += time.perf_counter() - back  # the caller's time on this window
        finally:
            for _, f in pending:  # a failed window (or the caller stopped): drop the rest
                f.cancel()


def _part_bytes(run: str) -> int:
    total = 0
    for af in _shards.list_attempts(run, []):
        for p in af.parts:
            with contextlib.suppress(OSError):
                total += os.stat(p).st_size
    return total


def _whole_run(run: str, options: IngestOptions) -> IngestResult:
    """A whole-run task, on a worker: the same ingest_run as a local ingest (exports: on the driver)."""
    import warnings

    from kforge_dash.ingest.options import IngestWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IngestWarning)  # they are in the summary, which the driver reports
        return ingest_run(run, options=options)


def ingest_paths_dask(paths: Sequence[str], *, options: IngestOptions, exporters: Sequence[Exporter],
                      client, opts: DaskOptions, progress=None) -> IngestPass:
    """One pass over ``paths`` on the cluster (see the module docstring): the IngestPass a local
    pass gives, runs in the same order."""
    progress = progress if progress is not None else NullProgress()
    out = IngestPass()
    runs: list[str] = []
    for p in paths:
        try:
            runs += runs_at(p)
        except IngestError as e:
            out.errors.append(str(e))
    small = {r for r in runs if _part_bytes(r) < opts.whole_run_bytes}
    tag = uuid.uuid4().hex[:8]
    whole = {r: client.submit(_whole_run, r, options, key=f"kforge-run-{tag}-{i}", pure=False)
             for i, r in enumerate(runs) if r in small}
    watch = _Watch(client, opts)
    got: dict[str, IngestResult | IngestFailure | IngestWaiting] = {}
    try:
        for run in runs:
            if run not in small:
                if run in got:
                    continue
                windows = DaskWindows(client, opts, run_dir=run)
                got[run] = _with_funnel(ingest_and_export(run, options=options, exporters=exporters,
                                                          progress=progress, windows=windows), windows.funnel)
                _fail_rest_if_lost(got, runs, watch, opts)
        for run, fut in whole.items():
            if run not in got:
                got[run] = _gather_run(run, fut, watch, exporters, progress, options.lock_timeout_s)
                _fail_rest_if_lost(got, runs, watch, opts)
    finally:
        for fut in whole.values():
            fut.cancel()
    for run in runs:
        r = got[run]
        (out.failed if isinstance(r, IngestFailure) else out.waiting if isinstance(r, IngestWaiting) else out.ok).append(r)
    return out


def _with_funnel(res, funnel: Funnel):
    """An IngestResult with what the driver received for its windows (none: as it was)."""
    total = funnel.total()
    return dataclasses.replace(res, driver=total) if isinstance(res, IngestResult) and total else res


def _gather_run(run: str, fut, watch: _Watch, exporters, progress, lock_timeout_s: float):
    try:
        res = watch.result(fut, f"{run}: ingest")
    except IngestNotReady as e:  # a job before its first flush: waiting, as a local ingest says
        return IngestWaiting(run, str(e))
    except IngestError as e:  # ClusterError included
        return IngestFailure(run, str(e))
    except Exception as e:  # the task's own failure, as a local ingest would report it
        return IngestFailure(run, f"{run}: {type(e).__name__}: {e}")
    progress.done(run)
    return export_ingested(res, exporters, lock_timeout_s=lock_timeout_s)


def _fail_rest_if_lost(got: dict, runs: list[str], watch: _Watch, opts: DaskOptions) -> None:
    """After a run failed: if the cluster itself is gone, fail every run not done yet at once
    instead of waiting the timeout on each."""
    last = got[next(reversed(got))]
    if not isinstance(last, IngestFailure) or watch.alive():
        return
    for r in runs:
        got.setdefault(r, IngestFailure(r, f"{r}: not ingested: the Dask cluster ({opts.address}) is gone "
                                           f"({last.error})"))
