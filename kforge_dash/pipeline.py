"""The pipeline: ingest each run, then run the chosen exporters on it; and the --watch loop.

Ingest (kforge_dash.ingest) knows nothing of export: this module runs one after the other, so
an export failure is recorded in summary.json's ``exports`` and never costs the Parquet outputs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from kforge_dash.contract import EXPORT_NAMES, SUMMARY_FILE, read_summary_file
from kforge_dash.export.exporters import choose_exporters, run_exporters
from kforge_dash.export.outcome import Exporter
from kforge_dash.ingest.inputs import shards as _shards
from kforge_dash.ingest.options import (
    IngestError,
    IngestFailure,
    IngestNotReady,
    IngestOptions,
    IngestResult,
    IngestWaiting,
)
from kforge_dash.ingest.run import ingest_run
from kforge_dash.progress import NullProgress
from kforge_record.atomic import write_json_atomic

__all__ = ["export_ingested", "failed_exports", "ingest_and_export", "ingest_path", "ingest_paths", "IngestInterrupted",
           "IngestPass",
           "runs_at", "watch"]


def ingest_path(path, *, exporters: Sequence[Exporter] | None = None, options: IngestOptions | None = None,
                progress=None, tensorboard: bool = True, wandb: bool = True, upload: bool = False,
                wandb_project: str | None = None, wandb_entity: str | None = None,
                **option_kwargs) -> list[IngestResult | IngestFailure | IngestWaiting]:
    """Ingest every run at or below ``path``, then export each. One IngestResult, IngestFailure or IngestWaiting per run.

    ``exporters`` (kforge_dash.export.exporters) beat the switches, which choose them when not given.
    Options: ``options`` (an IngestOptions) or its keywords (``ingest_path(root, alpha=0.05)``), not both.
    Raises IngestError when ``path`` does not exist or holds no run at all.
    """
    if options is not None and option_kwargs:
        raise TypeError("ingest_path: give options= or option keywords, not both")
    if exporters is None:
        exporters = choose_exporters(tensorboard=tensorboard, wandb=wandb, upload=upload,
                                     wandb_project=wandb_project, wandb_entity=wandb_entity)
    opts = options if options is not None else IngestOptions(**option_kwargs)
    progress = progress if progress is not None else NullProgress()
    return [ingest_and_export(run, options=opts, exporters=exporters, progress=progress) for run in runs_at(path)]


def runs_at(path) -> list[str]:
    path = os.path.abspath(os.fspath(path))
    if not os.path.exists(path):
        raise IngestError(f"{path}: no such file or directory")
    if not os.path.isdir(path):
        raise IngestError(f"{path}: not a directory (give a runs root or one run directory)")
    runs = _shards.discover_runs(path)
    if not runs:
        raise NoRunsYet(f"{path}: no kforge runs found (a run directory holds rank-NNNNN/ folders)")
    return runs


class NoRunsYet(IngestError):
    """An existing folder with no run in it (yet): --watch waits for one (``NO_RUNS_YET``)."""


NO_RUNS_YET = "no kforge run yet: watching for one"


def ingest_and_export(run: str, *, options: IngestOptions, exporters: Sequence[Exporter],
                      progress, windows=None) -> IngestResult | IngestFailure | IngestWaiting:
    """One run: ingest, then export. Any failure of the ingest is this run's, never raised.
    ``windows``: where its step windows run (ingest_run; kforge_dash.cluster)."""
    try:
        res = ingest_run(run, options=options, progress=progress, windows=windows)
    except IngestNotReady as e:  # a job before its first flush: nothing to do yet, nothing wrong
        return IngestWaiting(run, str(e))
    except IngestError as e:
        return IngestFailure(run, str(e))
    except BaseException as e:  # any failure (a bug of ours, a polars panic) is this run's: the others still ingest
        _reraise_interrupts(e)
        return IngestFailure(run, f"{run}: {type(e).__name__}: {e}")
    return export_ingested(res, exporters, lock_timeout_s=options.lock_timeout_s)


def export_ingested(res: IngestResult, exporters: Sequence[Exporter], *, lock_timeout_s: float) -> IngestResult:
    """Run ``exporters`` on an ingested run, their outcomes recorded in its summary.json."""
    summary = _export_and_record(res, exporters, lock_timeout_s=lock_timeout_s)
    return res if summary is None else replace(res, summary=summary)


def _reraise_interrupts(e: BaseException) -> None:
    """Ctrl-C and sys.exit end the program; every other BaseException is a run's failure. (polars
    raises pyo3's PanicException, a BaseException, when it panics: e.g. on a NUL in a column name.)"""
    if isinstance(e, (KeyboardInterrupt, SystemExit, GeneratorExit)):
        raise e


def _export(res: IngestResult, exporters: Sequence[Exporter]) -> dict | None:
    """The exporters' outcomes on a fresh ingest, as summary.json's ``exports``; failures recorded, never raised."""
    if not exporters:
        return None
    names = [x.name for x in exporters]
    prev = res.summary.get("exports") or {}
    uploading = "upload" in names
    if res.skipped and not uploading and all((prev.get(n) or {}).get("ok") for n in names):
        return None  # nothing changed and the last export of each target worked (an upload is always tried)
    try:
        return run_exporters(res.run_dir, exporters).to_dict()
    except BaseException as e:  # an export must never cost the Parquet outputs (nor end the other runs)
        _reraise_interrupts(e)
        return _all_failed(names, f"{type(e).__name__}: {e}")


def _export_and_record(res: IngestResult, exporters: Sequence[Exporter], *, lock_timeout_s: float) -> dict | None:
    """Export, and record the outcomes in summary.json; None when no export ran. Under the run's
    ingest lock, so an ingest that finds a temp file in RUN/ingested/ knows it is a dead export's
    (kforge_dash.ingest.temps), and two exports of one run never write at once."""
    from kforge_dash.ingest.lock import LockBusy, run_lock

    if not exporters:
        return None
    try:
        with run_lock(res.ingested_dir, timeout_s=lock_timeout_s):
            exports = _export(res, exporters)
            if exports is None:
                return None
            path = os.path.join(res.ingested_dir, SUMMARY_FILE)
            try:
                summary = read_summary_file(path)
            except ValueError:
                summary = dict(res.summary)
            summary["exports"] = exports
            write_json_atomic(path, summary)
            return summary
    except LockBusy as e:
        return dict(res.summary, exports=_all_failed([x.name for x in exporters], f"{e}; not exported"))


def _all_failed(names: list[str], error: str) -> dict:
    return {k: ({"ok": False, "path": None, "error": error, "points": None, "run_id": None, "seconds": None}
                if k in names else None) for k in EXPORT_NAMES}


@dataclass
class IngestPass:
    """What one pass over the paths gave: runs ingested, runs failed, runs with nothing recorded
    yet (waiting: a job before its first flush), paths that held no run."""

    ok: list[IngestResult] = field(default_factory=list)
    failed: list[IngestFailure] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    waiting: list[IngestWaiting] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """0 all ingested (or waiting for a first flush), 1 nothing ingested, 3 some runs or an
        upload failed (kforge-ingest's exit status). A failed TensorBoard or W&B export is
        recorded in summary.json and tried again by the next ingest; an upload is only ever
        tried when asked for, so its failure is the command's."""
        if not self.ok and not self.waiting:
            return 1
        return 3 if self.failed or self.errors or failed_exports(self.ok, ("upload",)) else 0


def failed_exports(results: Sequence[IngestResult], names: Sequence[str] = EXPORT_NAMES) -> list[str]:
    """One message per failed export among ``names`` recorded in the runs' summaries."""
    return [f"{r.run_dir}: {name} export failed: {e.get('error')}" for r in results
            for name, e in (r.summary.get("exports") or {}).items()
            if name in names and isinstance(e, dict) and not e.get("ok")]


class _Tracking(NullProgress):
    """Forwards to ``inner`` and notes every run that reached a window of rows (began to change)."""

    def __init__(self, inner, changed: set[str]):
        self.inner, self.changed = inner, changed

    def lock_wait(self, run_dir: str) -> None:
        self.inner.lock_wait(run_dir)

    def chunk(self, run_dir: str, done: int, total: int) -> None:
        self.changed.add(run_dir)
        self.inner.chunk(run_dir, done, total)

    def rows_read(self, run_dir: str, rows: int) -> None:
        self.inner.rows_read(run_dir, rows)

    def done(self, run_dir: str) -> None:
        self.inner.done(run_dir)


def ingest_paths(paths: Sequence[str], *, options: IngestOptions, exporters: Sequence[Exporter], progress=None,
                 changed: set[str] | None = None, wait_for_runs: bool = False) -> IngestPass:
    """One pass over ``paths``. ``changed`` receives every run re-ingested (or begun: a Ctrl-C may stop it).
    ``wait_for_runs`` (--watch): a folder with no run yet is waiting (NO_RUNS_YET), not an error."""
    progress = progress if progress is not None else NullProgress()
    if changed is not None:
        progress = _Tracking(progress, changed)
    out = IngestPass()
    for k, p in enumerate(paths):
        try:
            runs = runs_at(p)
        except NoRunsYet as e:
            if wait_for_runs:
                out.waiting.append(IngestWaiting(os.path.abspath(p), NO_RUNS_YET))
            else:
                out.errors.append(str(e))
            continue
        except IngestError as e:
            out.errors.append(str(e))
            continue
        for i, run in enumerate(runs):
            try:
                r = ingest_and_export(run, options=options, exporters=exporters, progress=progress)
            except KeyboardInterrupt as e:
                raise IngestInterrupted(out, run, runs[i + 1:], list(paths[k + 1:])) from e
            if isinstance(r, IngestFailure):
                out.failed.append(r)
                continue
            if isinstance(r, IngestWaiting):
                out.waiting.append(r)
                continue
            out.ok.append(r)
            if changed is not None and not r.skipped:
                changed.add(r.run_dir)
    return out


class IngestInterrupted(KeyboardInterrupt):
    """Ctrl-C during a pass of ingest_paths: what it had done (``done``: the runs finished), the run
    it stopped in (its outputs from before stand: every output is published atomically), the runs
    of that path not started and the paths not reached. A KeyboardInterrupt: whoever stops on Ctrl-C
    still does."""

    def __init__(self, done: IngestPass, stopped_in: str, not_started: list[str], paths_left: list[str]):
        super().__init__(f"interrupted while ingesting {stopped_in}")
        self.done, self.stopped_in, self.not_started, self.paths_left = done, stopped_in, not_started, paths_left


def watch(paths: Sequence[str], *, interval_s: float, options: IngestOptions, exporters: Sequence[Exporter],
          report: Callable[[IngestPass], None], progress=None) -> int:
    """Re-ingest ``paths`` every ``interval_s`` until Ctrl-C; the exit status of the final pass.

    A W&B export rewrites the whole offline run (about half a millisecond a step: a minute per
    poll for a 100k-step run) and nobody syncs it mid-run, so the passes in between export only
    what has no ``needs`` and is not W&B (TensorBoard follows every pass); W&B and the upload run
    once, when the watch stops, for the runs that changed. ``report`` is called after each pass.
    """
    live = [x for x in exporters if x.name not in ("wandb", "upload")]
    deferred = len(live) < len(exporters)
    options = replace(options, force=False)  # later passes redo only changed runs
    changed: set[str] = set()
    try:
        while True:
            time.sleep(interval_s)
            report(ingest_paths(paths, options=options, exporters=live, progress=progress, changed=changed,
                                wait_for_runs=True))
    except KeyboardInterrupt:
        pass
    if not (deferred and changed):
        return 0
    try:  # the runs whose W&B export (and upload) waited; the others' exports are current
        final = ingest_paths(sorted(changed), options=options, exporters=exporters, progress=progress)
    except KeyboardInterrupt:
        return 130
    report(final)
    return final.exit_code
