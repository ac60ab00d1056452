"""Re-upload one ingested run to TensorBoard and W&B (offline), and optionally ``wandb sync`` it.

``export_run`` is the library call with switches; the pipeline chooses its exporters once
(``choose_exporters``) and calls ``run_exporters``. Either way each exporter's outcome (ok, path,
error) is reported in the returned ``ExportResult`` and the Parquet outputs are only ever read.
"""

from __future__ import annotations

import os

from kforge_dash.contract import ingested_dir
from kforge_dash.export.exporters import choose_exporters, run_exporters
from kforge_dash.export.outcome import ExporterOutcome, ExportResult
from kforge_dash.ingest.lock import lock_path, run_lock

__all__ = ["export_run", "ExportResult", "ExporterOutcome"]


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
    exporters = choose_exporters(tensorboard=tensorboard, wandb=wandb, upload=upload, wandb_project=wandb_project,
                                 wandb_entity=wandb_entity, upload_timeout_s=upload_timeout_s)
    if not os.path.exists(lock_path(ingested_dir(run_dir))):  # outputs not made by kforge-ingest: no ingest to keep out
        return run_exporters(run_dir, exporters, max_rank_tags=max_rank_tags)
    # The run's ingest lock, as the pipeline exports: an ingest meanwhile would remove our temp files.
    with run_lock(ingested_dir(run_dir), timeout_s=None):
        return run_exporters(run_dir, exporters, max_rank_tags=max_rank_tags)
