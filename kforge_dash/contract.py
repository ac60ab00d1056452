"""What ingest hands export and the dashboard: file names, column sets and order, the summary reader.

The one place these are defined (docs/CONTRACT.md, "Ingested outputs"). Kept free of heavy
imports: ingest, export, browse and the CLIs all import it.
"""

from __future__ import annotations

import json
import os

from kforge_record.regular_file import open_regular
from kforge_record.schema import MEM_COLUMNS

INGESTED_DIR = "ingested"  # RUN/ingested/ holds everything below
STEPS_FILE = "steps.parquet"
RANKS_FILE = "ranks.parquet"
SUMMARY_FILE = "summary.json"
OPTIONS_FILE = "options.json"  # the options kept with the run (kforge_dash/ingest/kept.py)
# Steps a rollback superseded (kforge_dash/ingest/lineage/rollbacks.py); kforge-import writes the same format to
# RUN/imported/ (docs/CONTRACT.md): tag, step, time, value, reason, superseded_at_step (+ attempt here)
SUPERSEDED_FILE = "superseded.parquet"
MANIFEST_FILE = "manifest.parquet"  # ingest's own footer cache, safe to delete
LOCK_FILE = ".ingest.lock"
# ranks.parquet's key-value metadata: a JSON list of the float columns that may hold NaN/inf (every
# other float column is finite throughout), so the nonfinite finding need not read the file again.
# Absent (a file from another writer): unknown, every float column is read.
RANKS_NONFINITE_KEY = "kforge_maybe_nonfinite"
TENSORBOARD_DIR = "tensorboard"
WANDB_DIR = "wandb"

OUTPUT_SCHEMA_VERSION = "1.0"

# Metrics that get a <name>_ema column in steps.parquet.
EMA_METRICS = ("loss", "tokens_per_sec", "mfu", "step_time_s")
EMA_COLUMNS = tuple(f"{m}_ema" for m in EMA_METRICS)

# Columns of steps.parquet that ingest computes after reducing the ranks (over the whole run, so
# an append recomputes them): throughput, MFU and the EMAs.
RUN_DERIVED_COLUMNS = frozenset({"tokens_per_sec", "mfu", *EMA_COLUMNS})
# Every column name ingest itself puts in steps.parquet or ranks.parquet beyond the recorded
# ones: a user scalar with one of these names is renamed to user/NAME.
RESERVED_OUTPUT_NAMES = frozenset({"rank", "attempt", "step_work_s", "step_work_min_s", "step_work_median_s", "slowest_rank",
                                   "n_ranks", *RUN_DERIVED_COLUMNS})

# steps.parquet columns before the phases and user scalars; the EMAs come last. step_time_s is the
# job's step time: the period between consecutive step ends, mean over ranks (ingest/rowpass/period.py);
# step_work_s / _min_s / _median_s: the max / min / median over ranks of each rank's own
# start_step -> end_step time (ranks.parquet step_time_s), slowest_rank the rank with the max.
STEP_HEAD = ("step", "time", "step_time_s", "step_work_s", "step_work_min_s", "step_work_median_s", "slowest_rank",
             "n_ranks", "attempt", "tokens", "tokens_per_sec", "mfu", "loss", "grad_norm", "lr", *MEM_COLUMNS)
# The head as the per-step reductions over ranks give it, before the periods (step_time_s) are
# joined in and tokens/s and MFU derived.
REDUCED_HEAD = tuple(c for c in STEP_HEAD if c not in RUN_DERIVED_COLUMNS and c != "step_time_s")


def ingested_dir(run_dir: str | os.PathLike) -> str:
    return os.path.join(os.fspath(run_dir), INGESTED_DIR)


def read_summary_file(path: str | os.PathLike) -> dict:
    """An ingested summary.json as a dict; a ValueError naming the file when it is bad.

    The one reader of summary.json: ingest (is the run unchanged?), export and the dashboard.
    """
    try:
        with open_regular(path, "r") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    except FileNotFoundError:
        raise ValueError(f"{path}: cannot be read (not found; run kforge-ingest on the run first)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: cannot be read ({getattr(e, 'strerror', None) or e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data
EXPORT_NAMES = ("tensorboard", "wandb", "upload")  # the keys of summary.json "exports"
