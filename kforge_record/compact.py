"""Merging a rank's small part files into bigger ones, on the writer thread, as the run goes.

Every flush is one small part file; a long job would leave thousands per rank, and a parallel
filesystem pays for every open and stat at its metadata server. So the writer thread merges
them like the tiers of an LSM tree: ``FANOUT`` parts of one tier become one part of the next,
up to ``MAX_TIER``. With FANOUT=10 and MAX_TIER=3 a folder holds at most 9 parts per tier below
the top (27) plus one top-tier part per 1,000 flushes: 19 files after 199 flushes, 36 after
9,999, and every row is rewritten at most 3 times after its flush wrote it.

Crash safety (docs/CONTRACT.md, "Shards"): a merged part is named after the flushes it holds
(``part-000000-000009.parquet``), written under a temp name and published by rename
(kforge_record.atomic) before the parts it replaces are deleted. A reader that finds both keeps
the merged one (schema.live_parts); a SIGKILL at any instant leaves either the old parts, or
the merged part with some old parts beside it, and both read the same rows once. The merged
part's key-value metadata also lists what it replaces and each flush's row count (``replaces``,
``flush_rows``), so ingest can tell which of its rows it already read. What a kill leaves (the
replaced parts, a temp file) the rank's next Recorder removes (leftovers.py).

Nothing here raises: a merge that fails (disk full, an input gone) leaves its inputs as they
are, which readers handle like any unmerged parts, with one warning.
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from .atomic import atomic_path
from .schema import PARQUET_META_KEY, merged_part_name, part_file_name

FANOUT = 10
MAX_TIER = 3
# Rows per row group of a merged part. Ingest reads a run in step windows and Parquet row groups
# are the unit it can skip, so groups stay small enough for a window of many ranks.
ROW_GROUP_ROWS = 8192
HELD_MAX_ROWS = 10_000  # a flush bigger than this (a writer that fell behind) is read back from disk

# Test hook (tests/test_record_compact.py): SIGKILL this process at the N-th point of merging
# (1-based, counted over the process's merges), to check every intermediate state on disk.
KILL_AT_ENV = "KFORGE_RECORD_TEST_KILL_AT_MERGE_POINT"


@dataclass(frozen=True)
class Part:
    """A part file of this attempt folder: its name, the flushes it holds, each flush's rows."""

    name: str
    first: int
    last: int
    flush_rows: tuple[int, ...]


class Compactor:
    """Keeps the parts of each tier and merges them when a tier is full. Writer thread only."""

    def __init__(self, attempt_dir: str, warn, *, enabled: bool = True, fanout: int = FANOUT, max_tier: int = MAX_TIER):
        self.enabled = enabled  # False: Recorder(merge_parts=False), one file per flush
        self.attempt_dir = attempt_dir
        self.warn = warn
        self.fanout = fanout
        self.tiers: list[list[Part]] = [[] for _ in range(max_tier)]
        # The rows of the flushes waiting in the first tier, as the writer wrote them, not read
        # back to merge: 0.81-0.83x the writer thread's CPU a flush (benchmarks/bench_compact.py).
        # At most fanout small tables.
        self._held: dict[str, pa.Table] = {}
        self.merges = 0
        kill_at = os.environ.get(KILL_AT_ENV)
        self._kill_at = int(kill_at) if kill_at else None
        self._points = 0

    def part_written(self, index: int, num_rows: int, table: pa.Table | None = None) -> None:
        """Flush ``index`` was published as part_file_name(index) (its rows: ``table`` when the
        caller has them at hand): merge what is now due."""
        if not self.enabled:
            return
        part = Part(part_file_name(index), index, index, (num_rows,))
        if table is not None and table.num_rows <= HELD_MAX_ROWS:
            self._held[part.name] = table
        self.tiers[0].append(part)
        for tier, parts in enumerate(self.tiers):
            if len(parts) < self.fanout:
                break
            group = parts[:self.fanout]
            del parts[:self.fanout]  # merged or not, these are not tried again (a failure stays cheap)
            if group[-1].last - group[0].first + 1 != sum(len(p.flush_rows) for p in group):
                # A flush index was skipped (a name taken by another writer in this folder): the
                # merged name would claim that file's flush too, so these stay as they are.
                for p in group:
                    self._held.pop(p.name, None)
                continue
            try:
                merged = self._merge(group)
            except Exception as e:  # the inputs stay and readers use them: nothing is lost
                self.warn(f"merge:{type(e).__name__}", f"could not merge part files in {self.attempt_dir} "
                          f"({e!r}); they are kept as they are")
                return
            finally:
                for p in group:
                    self._held.pop(p.name, None)
            self.merges += 1
            if tier + 1 < len(self.tiers):
                self.tiers[tier + 1].append(merged)

    def _point(self) -> None:
        self._points += 1
        if self._kill_at is not None and self._points == self._kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    def _merge(self, group: list[Part]) -> Part:
        sources = [self._held.get(p.name) or pq.ParquetFile(os.path.join(self.attempt_dir, p.name)) for p in group]
        try:
            schema = pa.unify_schemas([_schema(src).remove_metadata() for src in sources])
            last = pq.read_schema(os.path.join(self.attempt_dir, group[-1].name))
            kv = json.loads((last.metadata or {}).get(PARQUET_META_KEY, b"{}"))
            merged = Part(merged_part_name(group[0].first, group[-1].last), group[0].first, group[-1].last,
                          tuple(n for p in group for n in p.flush_rows))
            # dropped_rows_total stays the last input's: a count up to the last flush this part holds.
            kv.update(replaces=[p.name for p in group], flush_rows=list(merged.flush_rows))
            schema = schema.with_metadata({PARQUET_META_KEY: json.dumps(kv).encode()})
            path = os.path.join(self.attempt_dir, merged.name)
            with atomic_path(path, tmp=os.path.join(self.attempt_dir, f".{merged.name}.tmp"), exclusive=True) as tmp:
                with pq.ParquetWriter(tmp, schema, compression="zstd") as out:
                    self._copy(sources, schema, out)
                self._point()  # written whole, not yet published
        finally:
            for src in sources:
                if isinstance(src, pq.ParquetFile):
                    src.close()
        self._point()  # published; the inputs are still there
        for p in group:
            try:
                os.remove(os.path.join(self.attempt_dir, p.name))
            except FileNotFoundError:
                pass
            except OSError as e:  # readers skip it; the writer's close removes it (leftovers.py)
                self.warn(f"merge-remove:{e.errno}", f"could not remove {p.name}, replaced by {merged.name}, in "
                          f"{self.attempt_dir} ({e!r}); readers skip it, and it is tried again at close")
            self._point()
        return merged

    def _copy(self, sources: list, schema: pa.Schema, out: pq.ParquetWriter) -> None:
        """Every row of ``sources`` in order into ``out``, one input row group at a time (memory
        stays at about ROW_GROUP_ROWS rows), a column an input lacks as null."""
        buf: list[pa.Table] = []
        n = 0
        for src in sources:
            for t in _row_groups(src):
                have = set(t.column_names)
                buf.append(pa.table([t.column(c) if c in have else pa.nulls(t.num_rows, schema.field(c).type)
                                     for c in schema.names], schema=schema))
                n += t.num_rows
                if n >= ROW_GROUP_ROWS:
                    out.write_table(pa.concat_tables(buf), row_group_size=n)
                    buf, n = [], 0
                    self._point()  # a temp file half written
            self._point()  # (also counted when the rows are still buffered)
        if buf:
            out.write_table(pa.concat_tables(buf), row_group_size=n)


def _schema(src) -> pa.Schema:
    return src.schema if isinstance(src, pa.Table) else src.schema_arrow


def _row_groups(src):
    if isinstance(src, pa.Table):
        yield src
        return
    for g in range(src.num_row_groups):
        yield src.read_row_group(g, use_threads=False)  # threads cost more than they save on small groups
