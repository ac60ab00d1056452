"""Temp files a killed ingest or export left in RUN/ingested/ (and RUN/), removed by the next ingest.

Every writer publishes through a temp name (kforge_record/atomic.py: ``.NAME.PID.tmp``; the W&B
export's ``.wandb-*.tmp`` folders; TensorBoard's ``RUN/.kforge-events.PID.tmp``, formerly
``ingested/tensorboard/``), and
writes it only while it holds the run's ingest lock (RUN/ingested/.ingest.lock: the pipeline
exports under it too). So the caller, which holds that lock, knows no live ingest or export owns
a temp file found there. docs/CONTRACT.md: temp files start with "." and end with ".tmp".
"""

from __future__ import annotations

import os
import shutil

from kforge_dash.contract import TENSORBOARD_DIR

# The TensorBoard export's temp files in the run directory itself (only these: RUN/ is the user's).
TB_TEMP_PREFIX = ".kforge-events."


def remove_stale_temps(out_dir: str) -> list[str]:
    """Remove every temp file in RUN/ingested/ and its tensorboard/ folder, and the TensorBoard
    export's in RUN/; the paths removed.
    Call it only while holding the run's ingest lock."""
    removed = []
    run_dir = os.path.dirname(os.path.abspath(out_dir))
    for folder, prefix in ((out_dir, "."), (os.path.join(out_dir, TENSORBOARD_DIR), "."), (run_dir, TB_TEMP_PREFIX)):
        try:
            names = sorted(e.name for e in os.scandir(folder) if e.name.startswith(prefix) and e.name.endswith(".tmp"))
        except OSError:
            continue  # no such folder (yet)
        for name in names:
            path = os.path.join(folder, name)
            try:
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path)
                else:
                    os.remove(path)
            except OSError:
                continue  # gone already, or not ours to remove
            removed.append(path)
    return removed
