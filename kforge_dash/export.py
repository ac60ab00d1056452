"""Re-upload one ingested run to TensorBoard and W&B (offline), and optionally ``wandb sync`` it.

``export_run`` never raises for an exporter's failure: each exporter's outcome (ok, path, error) is
reported in the returned ``ExportResult``, and the Parquet outputs are only ever read. The CLI
(``kforge-ingest``) calls it after each ingest and stores ``result.to_dict()`` in summary.json.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from .export_history import ExportInputError, History, ingested_dir, load_history
from .export_tensorboard import write_tensorboard
from .export_wandb import sync_wandb, write_wandb

TENSORBOARD_DIR = "tensorboard"


@dataclass(frozen=True, kw_only=True)
class ExporterOutcome:
    """What one exporter did. ``error`` is None exactly when ``ok``."""

    ok: bool
    path: str | None = None  # the event file / the offline run dir
    error: str | None = None
    points: int | None = None  # TensorBoard: values written; W&B: history rows logged
    run_id: str | None = None  # W&B only
    seconds: float | None = None

    def to_dict(self) -> dict:
        return {"ok": self.ok, "path": self.path, "error": self.error, "points": self.points,
                "run_id": self.run_id, "seconds": self.seconds}


@dataclass(frozen=True, kw_only=True)
class ExportResult:
    """Per exporter outcome; None means the exporter was not asked for (--no-tensorboard, no --upload ...)."""

    run_dir: str
    tensorboard: ExporterOutcome | None
    wandb: ExporterOutcome | None
    upload: ExporterOutcome | None

    @property
    def ok(self) -> bool:
        return all(o.ok for o in (self.tensorboard, self.wandb, self.upload) if o is not None)

    @property
    def errors(self) -> list[str]:
        return [f"{name}: {o.error}" for name, o in self.items() if o is not None and not o.ok]

    def items(self):
        return (("tensorboard", self.tensorboard), ("wandb", self.wandb), ("upload", self.upload))

    def to_dict(self) -> dict:
        """The ``exports`` value of summary.json (docs/CONTRACT.md)."""
        return {name: (o.to_dict() if o is not None else None) for name, o in self.items()}


def export_run(
    run_dir: str | os.PathLike,
    *,
    tensorboard: bool = True,
    wandb: bool = True,
    wandb_project: str | None = None,
    wandb_entity: str | None = None,
    upload: bool = False,
    max_rank_tags: int = 64,
    upload_timeout_s: float = 600.0,
) -> ExportResult:
    """Export RUN/ingested/{steps,ranks}.parquet + summary.json to RUN/ingested/{tensorboard,wandb}/.

    ``upload=True`` runs ``wandb sync`` on the offline run (and implies the W&B export).
    """
    run_dir = os.path.abspath(os.fspath(run_dir))
    if isinstance(max_rank_tags, bool) or not isinstance(max_rank_tags, int) or max_rank_tags < 0:
        raise ValueError(f"max_rank_tags: must be an integer >= 0, got {max_rank_tags!r}")
    wandb = wandb or upload
    if not (tensorboard or wandb):
        return ExportResult(run_dir=run_dir, tensorboard=None, wandb=None, upload=None)
    try:
        history = load_history(run_dir, max_rank_tags=max_rank_tags)
    except ExportInputError as e:  # bad input fails every requested exporter, with the same message
        failed = ExporterOutcome(ok=False, error=str(e))
        return ExportResult(run_dir=run_dir, tensorboard=failed if tensorboard else None,
                            wandb=failed if wandb else None, upload=failed if upload else None)

    tb = _tensorboard(history) if tensorboard else None
    wb = _wandb(history, wandb_project, wandb_entity) if wandb else None
    up = None
    if upload:
        if wb is not None and wb.ok:
            up = _upload(wb.path, upload_timeout_s)
        else:
            up = ExporterOutcome(ok=False, error="not uploaded: the W&B export failed")
    return ExportResult(run_dir=run_dir, tensorboard=tb, wandb=wb, upload=up)


def _tensorboard(history: History) -> ExporterOutcome:
    t0 = time.perf_counter()
    try:
        path, points = write_tensorboard(history, os.path.join(ingested_dir(history.run_dir), TENSORBOARD_DIR))
    except Exception as e:  # reported, never raised: the other exporter and the Parquet outputs stand
        return ExporterOutcome(ok=False, error=_describe(e), seconds=time.perf_counter() - t0)
    return ExporterOutcome(ok=True, path=path, points=points, seconds=time.perf_counter() - t0)


def _wandb(history: History, project: str | None, entity: str | None) -> ExporterOutcome:
    t0 = time.perf_counter()
    try:
        path, run_id, rows = write_wandb(history, project=project, entity=entity)
    except Exception as e:
        return ExporterOutcome(ok=False, error=_describe(e), seconds=time.perf_counter() - t0)
    return ExporterOutcome(ok=True, path=path, run_id=run_id, points=rows, seconds=time.perf_counter() - t0)


def _upload(offline_run: str, timeout_s: float) -> ExporterOutcome:
    t0 = time.perf_counter()
    try:
        s = sync_wandb(offline_run, timeout_s=timeout_s)
    except Exception as e:
        return ExporterOutcome(ok=False, path=offline_run, error=_describe(e), seconds=time.perf_counter() - t0)
    return ExporterOutcome(ok=s.ok, path=offline_run, error=s.error, seconds=time.perf_counter() - t0)


def _describe(e: BaseException) -> str:
    return str(e) if isinstance(e, (ImportError, ExportInputError)) else f"{type(e).__name__}: {e}"
