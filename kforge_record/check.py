"""Check a run directory against the on-disk contract (docs/CONTRACT.md, "Shards").

``python -m kforge_record.check RUN_DIR`` prints the problems and exits 1 when there are any.
Uses only pyarrow, like the recorder.
"""

from __future__ import annotations

import json
import os
import sys

import pyarrow as pa
import pyarrow.parquet as pq

from .heartbeat import HEARTBEAT_FILE, read_heartbeat
from .regular_file import check_regular_file, open_regular
from .schema import (
    FIXED_COLUMNS,
    META_FILE,
    PARQUET_META_KEY,
    RANK_PREFIX,
    SchemaError,
    check_schema_version,
    is_part_file,
    part_span,
    rank_dir_name,
)

_META_KEYS = ("schema_version", "run_name", "rank", "world_size", "attempt_id", "start_time", "device", "counts_tokens")
_TYPES = {"int64": pa.int64(), "float64": pa.float64()}


def check_run(run_dir: str | os.PathLike) -> list[str]:
    """Every way ``run_dir`` departs from the contract, one message each (empty: it conforms)."""
    run_dir = os.fspath(run_dir)
    if not os.path.isdir(run_dir):
        return [f"{run_dir}: not a directory"]
    ranks = sorted(d for d in os.listdir(run_dir) if d.startswith(RANK_PREFIX))
    if not ranks:
        return [f"{run_dir}: no {RANK_PREFIX}NNNNN folders"]
    problems: list[str] = []
    for rank_name in ranks:
        rank_path = os.path.join(run_dir, rank_name)
        attempts = sorted(os.listdir(rank_path))
        if not attempts:
            problems.append(f"{rank_path}: no attempt folders")
        for attempt in attempts:
            problems += check_attempt(os.path.join(rank_path, attempt), rank_name=rank_name)
    return problems


def check_attempt(path: str, *, rank_name: str | None = None) -> list[str]:
    problems: list[str] = []
    meta_path = os.path.join(path, META_FILE)
    try:
        with open_regular(meta_path, "r") as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        return [f"{meta_path}: unreadable ({e})"]
    missing = [k for k in _META_KEYS if k not in meta]
    if missing:
        problems.append(f"{meta_path}: missing keys {', '.join(missing)}")
    try:
        check_schema_version(meta.get("schema_version"), source=meta_path)
    except SchemaError as e:
        problems.append(str(e))
    if rank_name is not None and isinstance(meta.get("rank"), int) and rank_dir_name(meta["rank"]) != rank_name:
        problems.append(f"{meta_path}: rank {meta['rank']} recorded under folder {rank_name}")
    if meta.get("attempt_id") != os.path.basename(path):
        problems.append(f"{meta_path}: attempt_id {meta.get('attempt_id')!r} differs from its folder name")
    parts = sorted(n for n in os.listdir(path) if is_part_file(n))
    for name in parts:
        problems += _check_part(os.path.join(path, name))
    try:
        read_heartbeat(os.path.join(path, HEARTBEAT_FILE))  # absent (older shards) is fine
    except (OSError, ValueError) as e:
        problems.append(f"{os.path.join(path, HEARTBEAT_FILE)}: {e}")
    return problems


def _check_part(path: str) -> list[str]:
    try:
        check_regular_file(path)  # a FIFO: refused, never blocks
        schema = pq.read_schema(path)
        md = pq.read_metadata(path)
    except Exception as e:  # pyarrow raises several types for a damaged file
        return [f"{path}: not a readable Parquet file ({e})"]
    problems = []
    for name, typ in FIXED_COLUMNS:
        idx = schema.get_field_index(name)
        if idx < 0:
            problems.append(f"{path}: missing column {name}")
        elif schema.field(idx).type != _TYPES[typ]:
            problems.append(f"{path}: column {name} is {schema.field(idx).type}, expected {typ}")
    fixed = {n for n, _ in FIXED_COLUMNS}
    for field in schema:
        if field.name not in fixed and field.type != pa.float64():
            problems.append(f"{path}: scalar column {field.name} is {field.type}, expected float64")
    kv = (schema.metadata or {}).get(PARQUET_META_KEY)
    if kv is None:
        problems.append(f"{path}: no 'kforge' key-value metadata")
    else:
        try:
            kv = json.loads(kv)
            check_schema_version(kv.get("schema_version"), source=path)
            problems += _check_merged(path, kv, md.num_rows)
        except (ValueError, SchemaError) as e:
            problems.append(f"{path}: {e}")
    return problems


def _check_merged(path: str, kv: dict, num_rows: int) -> list[str]:
    """A merged part (part-A-B) must say how many rows each of its flushes A..B holds: ingest
    relies on it to skip the rows it read before (docs/CONTRACT.md, "Shards")."""
    span = part_span(os.path.basename(path))
    if span is None or span.first == span.last:
        return []
    rows = kv.get("flush_rows")
    n = span.last - span.first + 1
    if not (isinstance(rows, list) and len(rows) == n and all(isinstance(r, int) for r in rows) and sum(rows) == num_rows):
        return [f"{path}: 'flush_rows' in its kforge metadata should list the rows of its {n} flushes "
                f"({num_rows} rows in all), got {str(rows)[:80]}"]
    return []


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python -m kforge_record.check RUN_DIR [RUN_DIR ...]", file=sys.stderr)
        return 2
    bad = 0
    for run in args:
        problems = check_run(run)
        for p in problems:
            print(p)
        bad += bool(problems)
        if not problems:
            print(f"{run}: ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
