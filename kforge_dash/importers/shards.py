"""Write an imported run as kforge shards (docs/CONTRACT.md "Shards"), the same on every import.

``ROOT/NAME/rank-00000/<ATTEMPT>/{meta.json, part-NNNNNN.parquet, end.json}``: one rank, one launch,
the part files in the recorder's schema and key-value metadata (``kforge_record.schema``),
published by ``kforge_record.atomic`` as the recorder publishes its own. The attempt id is the
run's start time (``YYYYMMDDTHHMMSS.ffffffZ-imported``) and nothing in the files depends on when
the import ran, so importing the same source again writes the same bytes: the run is then left as
it is (its files untouched, so ``kforge-ingest`` skips it); a changed source replaces the import's
files (``rank-00000/`` and ``imported/``), and the next ingest reads it again.

``ROOT/NAME/imported/``: ``source.json`` (what was read, how tags became columns, warnings) and
``superseded.parquet`` (the points the tracker's reader no longer shows: purged by a restart or
replaced by a later point of the same step), which ingest does not read (docs/imports.md).
"""

from __future__ import annotations

import datetime as _dt
import filecmp
import json
import os
import shutil
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from kforge_dash.importers.source import SourceRun
from kforge_dash.importers.table import build_rows
from kforge_dash.importers.tag_columns import plan_columns
from kforge_record.atomic import write_json_atomic
from kforge_record.schema import END_FILE, META_FILE, PARQUET_META_KEY, SCHEMA_VERSION, part_file_name, rank_dir_name

IMPORTED_DIR = "imported"
SOURCE_FILE = "source.json"
SUPERSEDED_FILE = "superseded.parquet"
ROWS_PER_PART = 100_000  # as many rows as a recorder's tier-3 merged part holds
ROW_GROUP_ROWS = 8192  # the recorder's merged parts' row groups (kforge_record/compact.py)


class ImportError_(Exception):  # noqa: N801 - not the builtin ImportError
    """A run that could not be written (a folder of another origin in the way, a disk error)."""


@dataclass(frozen=True)
class WriteOutcome:
    run_dir: str
    status: str  # "new", "updated" or "unchanged"
    steps: int
    points: int
    superseded: int


def attempt_id(start_time: float | None) -> str:
    t = _dt.datetime.fromtimestamp(start_time or 0.0, _dt.timezone.utc)
    return t.strftime("%Y%m%dT%H%M%S.%fZ") + "-imported"


def write_run(run: SourceRun, root: str) -> WriteOutcome:
    """Write ``run`` under ``root``; raises ImportError_ (naming the folder) when it cannot."""
    run_dir = os.path.join(root, run.name)
    if os.path.isdir(run_dir) and not _is_import(run_dir):
        raise ImportError_(f"{run_dir} exists and is not an import (no {IMPORTED_DIR}/{SOURCE_FILE}); "
                           "left as it is: import under another ROOT or --prefix")
    plan = plan_columns(run.series)
    rows = build_rows(run, plan)
    tmp = os.path.join(root, f".{run.name}.import-{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _write_tree(tmp, run, plan, rows)
        status = _publish(tmp, run_dir)
    except OSError as e:
        raise ImportError_(f"{run_dir}: could not be written: {e.strerror or e}") from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return WriteOutcome(run_dir, status, rows.table.num_rows, rows.points, len(run.superseded))


def _is_import(run_dir: str) -> bool:
    return os.path.isfile(os.path.join(run_dir, IMPORTED_DIR, SOURCE_FILE))


def _write_tree(tmp: str, run: SourceRun, plan, rows) -> None:
    aid = attempt_id(run.start_time)
    attempt_dir = os.path.join(tmp, rank_dir_name(0), aid)
    os.makedirs(attempt_dir)
    os.makedirs(os.path.join(tmp, IMPORTED_DIR))
    meta = {
        "schema_version": SCHEMA_VERSION, "run_name": run.name, "rank": 0, "world_size": 1, "local_rank": 0,
        "host": run.host, "pid": None, "attempt_id": aid, "launch": {}, "start_time": run.start_time,
        "process_start_time": None, "process": None, "device": None, "versions": {}, "counts_tokens": False,
        "model": None, "peak_tflops": None, "hparams": run.hparams, "tags": [f"imported:{run.kind}", *run.tags],
        "flush_every_steps": None, "flush_every_s": None, "memory_every_steps": None, "hw_every_s": 0.0,
    }
    write_json_atomic(os.path.join(attempt_dir, META_FILE), meta)
    table = rows.table
    kv = json.dumps({"schema_version": SCHEMA_VERSION, "rank": 0, "attempt_id": aid, "dropped_rows_total": 0}).encode()
    parts = 0
    for first in range(0, max(table.num_rows, 1), ROWS_PER_PART):
        part = table.slice(first, ROWS_PER_PART).replace_schema_metadata({PARQUET_META_KEY: kv})
        pq.write_table(part, os.path.join(attempt_dir, part_file_name(parts)), compression="zstd",
                       use_dictionary=False, row_group_size=ROW_GROUP_ROWS)
        parts += 1
    last = table.column("step")[-1].as_py() if table.num_rows else None
    times = table.column("time")
    walls = np.concatenate([run.superseded.column("time"), times.to_numpy(zero_copy_only=False)])
    end_time = float(np.nanmax(walls)) if len(walls) and not np.isnan(walls).all() else run.start_time
    write_json_atomic(os.path.join(attempt_dir, END_FILE), {
        "schema_version": SCHEMA_VERSION, "end_time": end_time, "reason": f"imported:{run.kind}",
        "rows_written": table.num_rows, "parts_written": parts, "dropped_rows_total": 0,
        "dropped_rows_by_reason": {"disk": 0, "stuck": 0, "unconvertible": 0, "rejected": 0},
        "writer_wait_s": 0.0, "last_step": last,
    })
    _write_superseded(os.path.join(tmp, IMPORTED_DIR, SUPERSEDED_FILE), run)
    write_json_atomic(os.path.join(tmp, IMPORTED_DIR, SOURCE_FILE), {
        "kind": run.kind, "source": os.path.abspath(run.source), "about": run.about,
        "files": [{"path": os.path.abspath(f.path), "size": f.size} for f in run.files],
        "columns": {tag: col for tag, col in sorted(plan.columns.items())}, "left_out_tags": list(plan.left_out),
        "notes": list(plan.notes), "warnings": run.warnings, "errors": run.errors,
        "steps": table.num_rows, "points": rows.points, "superseded_points": len(run.superseded),
    })


def _write_superseded(path: str, run: SourceRun) -> None:
    s = run.superseded
    types = {"tag": pa.string(), "step": pa.int64(), "time": pa.float64(), "value": pa.float64(), "reason": pa.string(),
             "superseded_at_step": pa.int64()}
    table = pa.table({name: pa.array(s.column(name) if len(s) else [], type=t) for name, t in types.items()})
    pq.write_table(table, path, compression="zstd", use_dictionary=False)


def _files(top: str) -> list[str]:
    out = []
    for folder, dirs, files in os.walk(top):
        dirs.sort()
        out += [os.path.relpath(os.path.join(folder, f), top) for f in sorted(files)]
    return out


def _same(new: str, old: str) -> bool:
    """True when ``old`` (a run folder) holds exactly the import's files of ``new``, byte for byte."""
    theirs = [f for sub in (rank_dir_name(0), IMPORTED_DIR) for f in _files(os.path.join(old, sub))]
    mine = [f for sub in (rank_dir_name(0), IMPORTED_DIR) for f in _files(os.path.join(new, sub))]
    return theirs == mine and all(
        filecmp.cmp(os.path.join(new, sub, f), os.path.join(old, sub, f), shallow=False)
        for sub in (rank_dir_name(0), IMPORTED_DIR) for f in _files(os.path.join(new, sub)))


def _publish(tmp: str, run_dir: str) -> str:
    if not os.path.isdir(run_dir):
        os.rename(tmp, run_dir)
        return "new"
    if _same(tmp, run_dir):
        return "unchanged"
    # The import's own folders are replaced; anything else there (ingested/) stays, and ingest
    # finds the inputs changed.
    for sub in (rank_dir_name(0), IMPORTED_DIR):
        old = os.path.join(run_dir, sub)
        trash = os.path.join(tmp, f".old-{sub}")
        if os.path.exists(old):
            os.rename(old, trash)
        os.rename(os.path.join(tmp, sub), old)
    return "updated"
