"""The export targets as objects with one job each (like tensorboard's record writers), chosen once.

``choose_exporters`` turns the user's switches into a list; ``run_exporters`` runs that list over
one run's history, in order, each failure reported in its outcome and never raised.
"""

from __future__ import annotations

import glob
import os
import time
from collections.abc import Sequence

from kforge_dash.contract import WANDB_DIR, ingested_dir
from kforge_dash.export.history import ExportInputError, History, load_history
from kforge_dash.export.outcome import Exporter, ExporterOutcome, ExportResult
from kforge_dash.export.tensorboard import write_tensorboard
from kforge_dash.export.wandb import run_id_for, sync_wandb, write_wandb
from kforge_dash.optional import MissingDependency


def _describe(e: BaseException) -> str:
    return str(e) if isinstance(e, (ImportError, ExportInputError)) else f"{type(e).__name__}: {e}"


class TensorBoardExporter:
    """RUN/events.out.tfevents.<N>.kforge: one event file, appended to or rewritten (tensorboard.py)."""

    name = "tensorboard"
    needs = None

    def export(self, history: History) -> ExporterOutcome:
        t0 = time.perf_counter()
        try:
            path, points = write_tensorboard(history, history.run_dir)
        except Exception as e:  # reported, never raised: the other exporters and the Parquet outputs stand
            return ExporterOutcome(ok=False, error=_describe(e), seconds=time.perf_counter() - t0)
        return ExporterOutcome(ok=True, path=path, points=points, seconds=time.perf_counter() - t0)


class WandbExporter:
    """RUN/ingested/wandb/: one offline W&B run with a stable id."""

    name = "wandb"
    needs = None

    def __init__(self, *, project: str | None = None, entity: str | None = None):
        self.project, self.entity = project, entity

    def export(self, history: History) -> ExporterOutcome:
        t0 = time.perf_counter()
        try:
            path, run_id, rows = write_wandb(history, project=self.project, entity=self.entity)
        except Exception as e:
            return ExporterOutcome(ok=False, error=_describe(e), seconds=time.perf_counter() - t0)
        return ExporterOutcome(ok=True, path=path, run_id=run_id, points=rows, seconds=time.perf_counter() - t0)


class UploadExporter:
    """``wandb sync`` of the offline run the W&B exporter wrote (needs network and a login)."""

    name = "upload"
    needs = "wandb"

    def __init__(self, *, timeout_s: float = 600.0):
        self.timeout_s = timeout_s

    def export(self, history: History) -> ExporterOutcome:
        t0 = time.perf_counter()
        pattern = os.path.join(glob.escape(os.path.join(ingested_dir(history.run_dir), WANDB_DIR)),
                               f"offline-run-*-{run_id_for(history.summary)}")
        found = sorted(glob.glob(pattern))
        if not found:
            return ExporterOutcome(ok=False, error="no offline W&B run to upload", seconds=time.perf_counter() - t0)
        offline_run = found[-1]
        try:
            s = sync_wandb(offline_run, timeout_s=self.timeout_s)
        except Exception as e:
            return ExporterOutcome(ok=False, path=offline_run, error=_describe(e), seconds=time.perf_counter() - t0)
        return ExporterOutcome(ok=s.ok, path=offline_run, error=s.error, seconds=time.perf_counter() - t0)


def choose_exporters(*, tensorboard: bool = True, wandb: bool = True, upload: bool = False,
                     wandb_project: str | None = None, wandb_entity: str | None = None,
                     upload_timeout_s: float = 600.0) -> list[Exporter]:
    """The exporters the switches ask for, in the order they run (``upload`` implies the W&B export)."""
    chosen: list[Exporter] = []
    if tensorboard:
        chosen.append(TensorBoardExporter())
    if wandb or upload:
        chosen.append(WandbExporter(project=wandb_project, entity=wandb_entity))
    if upload:
        chosen.append(UploadExporter(timeout_s=upload_timeout_s))
    return chosen


def run_exporters(run_dir: str | os.PathLike, exporters: Sequence[Exporter], *, max_rank_tags: int = 64) -> ExportResult:
    """Export RUN/ingested/ with each of ``exporters``; never raises for an exporter's failure."""
    run_dir = os.path.abspath(os.fspath(run_dir))
    if isinstance(max_rank_tags, bool) or not isinstance(max_rank_tags, int) or max_rank_tags < 0:
        raise ValueError(f"max_rank_tags: must be an integer >= 0, got {max_rank_tags!r}")
    if not exporters:
        return ExportResult.of(run_dir, {})
    try:
        history = load_history(run_dir, max_rank_tags=max_rank_tags)
    except (ExportInputError, MissingDependency) as e:  # bad input fails every exporter, with the same message
        return ExportResult.of(run_dir, {x.name: ExporterOutcome(ok=False, error=str(e)) for x in exporters})
    outcomes: dict[str, ExporterOutcome] = {}
    for x in exporters:
        if x.needs is not None and not (outcomes.get(x.needs) and outcomes[x.needs].ok):
            outcomes[x.name] = ExporterOutcome(ok=False, error=f"not run: the {x.needs} export failed")
            continue
        outcomes[x.name] = x.export(history)
    return ExportResult.of(run_dir, outcomes)
