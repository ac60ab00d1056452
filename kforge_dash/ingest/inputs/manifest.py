"""What the last ingest of a run saw, kept in RUN/ingested/manifest.parquet, so the next ingest
redoes no work it need not:

* every part file's footer facts and the warnings they gave, keyed by name, size and mtime
  (a part file never changes once written: the recorder writes a temp name and renames it), so
  a re-ingest of a long run does not reopen a million footers;
* the state an append (ingest_append.py) checks before it reuses steps.parquet and
  ranks.parquet: which attempts and options they were made from, the restart cut-offs, the
  output columns, and the sizes and mtimes of the outputs themselves.

The manifest is a cache: deleting it (or the whole ingested/ folder) only costs time.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from kforge_dash.contract import MANIFEST_FILE
from kforge_dash.ingest.inputs import shards as _shards
from kforge_dash.ingest.inputs.parquet_io import interned, read_columns
from kforge_dash.ingest.options import PartVanished
from kforge_record.atomic import atomic_path

_STATE_KEY = b"kforge_ingest_state"
_COLUMNS = ("rel", "size", "mtime_ns", "num_rows", "min_step", "max_step", "has_log_rows",
            "has_end_rows", "dropped_rows_total", "schema", "warnings", "bad", "group_steps")


@dataclass(frozen=True)
class PartEntry:
    """What the manifest keeps of one part file: its stat, its footer facts, the warnings its
    footer gave, and the warning if its rows failed to decode (None: they decoded)."""

    size: int
    mtime_ns: int
    info: _shards.PartInfo
    warnings: tuple[str, ...]
    bad: str | None = None

    def same_file(self, st: tuple[int, int] | None) -> bool:
        return st is not None and (self.size, self.mtime_ns) == st


@dataclass(frozen=True)
class Prior:
    """The manifest of the last ingest: footers by relative path, and its state (a dict)."""

    parts: dict[str, PartEntry]  # by path relative to the run
    state: dict


def load_prior(out_dir: str, run_dir: str) -> Prior | None:
    """The last ingest's manifest, or None when there is none or it cannot be read (no error:
    a cache that cannot be trusted is ignored)."""
    path = os.path.join(out_dir, MANIFEST_FILE)
    try:
        table = read_columns(path)
        state = json.loads((table.schema.metadata or {})[_STATE_KEY])
        cols = {c: table.column(c).to_pylist() for c in _COLUMNS}
    except Exception:  # absent, truncated, from another version: start afresh
        return None
    schemas = [interned(dict(s)) for s in state.get("schemas", [])]
    parts = {}
    for rel, size, mtime, n, lo, hi, log, end, dropped, schema, warns, bad, groups in zip(*(cols[c] for c in _COLUMNS)):
        info = _shards.PartInfo(os.path.join(run_dir, rel), n, schemas[schema], lo, hi, log, dropped, end,
                                None if groups is None else tuple(groups))
        parts[rel] = PartEntry(size, mtime, info, tuple(warns or ()), bad)
    return Prior(parts, state)


PARALLEL_MIN_PARTS = 20_000  # below this, starting worker processes costs more than it saves


class FooterCache:
    """A ``part_reader`` for shards.read_attempt: answers from the prior manifest when a part's
    size and mtime are unchanged, else reads the footer; remembers every answer for the next
    manifest. A footer that could not be read is never remembered (the error may be passing:
    an I/O error, too many open files), so it is tried again next time; there are few."""

    def __init__(self, run_dir: str, stats: dict, prior: Prior | None):
        self.run_dir = run_dir
        self.stats = stats
        self.prior = prior.parts if prior is not None else {}
        self.entries: dict[str, PartEntry] = {}  # by path relative to the run
        self.known_bad: dict[str, str] = {}  # path -> warning: rows failed to decode last time
        self.fetched: dict[str, tuple] = {}  # path -> (PartInfo | None, warnings), from prefetch()

    def _hit(self, path: str, rel: str | None = None) -> PartEntry | None:
        hit = self.prior.get(rel or _shards.rel_path(self.run_dir, path))
        return hit if hit is not None and hit.same_file(self.stats.get(path)) else None

    def prefetch(self, listing, *, min_parts: int | None = None, workers: int | None = None) -> None:
        """Read the footers the cache cannot answer in worker processes when there are many
        (ingest_footers.py); otherwise, or if that fails, __call__ reads them one by one."""
        least = PARALLEL_MIN_PARTS if min_parts is None else min_parts
        if sum(len(af.parts) for af in listing) < least:  # (before a cache look-up per part)
            return
        todo = [(p, af.rank) for af in listing for p in af.parts if self._hit(p) is None]
        from kforge_dash.ingest.inputs.footers import read_footers, usable_cpus

        workers = workers or min(usable_cpus(), 8)
        if len(todo) < least or workers < 2:
            return
        for path, (info, warns) in (read_footers(todo, workers=workers) or {}).items():
            if info is not None:
                info = replace(info, columns=interned(info.columns))
            self.fetched[path] = (info, warns)

    def __call__(self, path: str, rank: int, warnings: list[str]):
        rel = _shards.rel_path(self.run_dir, path)
        st = self.stats.get(path)
        hit = self._hit(path, rel) if self.prior else None
        if hit is not None:
            warnings.extend(hit.warnings)
            self.entries[rel] = hit
            if hit.bad is not None:
                self.known_bad[path] = hit.bad
            return hit.info
        if path in self.fetched:
            info, mine = self.fetched.pop(path)
        else:
            mine = []
            info = _shards.read_part(path, rank, mine)
        if info is None and not os.path.lexists(path):  # merged by the recorder since the listing
            raise PartVanished(path)
        warnings.extend(mine)
        if st is not None and info is not None:
            self.entries[rel] = PartEntry(st[0], st[1], info, tuple(mine))
        return info

    def mark_bad(self, bad: dict) -> None:
        """Parts whose footer was fine but whose rows failed to decode (path -> warning): an
        append retries them alone, without re-reading what the last ingest already merged."""
        for rel, entry in self.entries.items():
            path = os.path.join(self.run_dir, rel)
            msg = bad.get(path)
            if msg != entry.bad:
                self.entries[rel] = replace(entry, bad=msg)


def save_manifest(out_dir: str, cache: FooterCache, state: dict) -> None:
    """Write manifest.parquet atomically (temp name, then rename)."""
    schemas: dict[tuple, int] = {}
    rows = {c: [] for c in _COLUMNS}
    for rel, entry in cache.entries.items():
        info = entry.info
        rows["rel"].append(rel)
        rows["size"].append(entry.size)
        rows["mtime_ns"].append(entry.mtime_ns)
        rows["warnings"].append(list(entry.warnings) or None)  # null, not []: 100x cheaper for polars to build
        rows["bad"].append(entry.bad)
        rows["num_rows"].append(info.num_rows)
        rows["min_step"].append(info.min_step)
        rows["max_step"].append(info.max_step)
        rows["has_log_rows"].append(info.has_log_rows)
        rows["has_end_rows"].append(info.has_end_rows)
        rows["dropped_rows_total"].append(info.dropped_rows_total)
        rows["schema"].append(schemas.setdefault(tuple(info.columns.items()), len(schemas)))
        rows["group_steps"].append(None if info.group_steps is None else list(info.group_steps))
    types = {"rel": pa.string(), "size": pa.int64(), "mtime_ns": pa.int64(), "bad": pa.string(),
             "num_rows": pa.int64(), "min_step": pa.int64(), "max_step": pa.int64(), "has_log_rows": pa.bool_(),
             "has_end_rows": pa.bool_(), "dropped_rows_total": pa.int64(), "schema": pa.int32(),
             "warnings": pa.list_(pa.string()), "group_steps": pa.list_(pa.int64())}
    state = dict(state, schemas=[list(s) for s in schemas])
    # Through polars, not pa.array: that one's pandas check imports pandas (~0.2 s, arrays.py).
    lists = {"warnings": pl.List(pl.String), "group_steps": pl.List(pl.Int64)}
    frame = pl.DataFrame({c: pl.Series(c, rows[c], dtype=lists.get(c)) for c in _COLUMNS})
    table = frame.to_arrow().cast(pa.schema([(c, types[c]) for c in _COLUMNS]))
    table = table.replace_schema_metadata({_STATE_KEY: json.dumps(state).encode()})
    path = os.path.join(out_dir, MANIFEST_FILE)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")


def output_stat(out_dir: str, name: str) -> list[int] | None:
    """[size, mtime_ns] of an output file, None when absent: the state names the outputs it
    describes, so a replaced or deleted output is never appended to."""
    try:
        st = os.stat(os.path.join(out_dir, name))
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns]
