"""pyarrow reads of part files, at the least cost per file (a run may have a million).

``open_footer``: a footer, its Arrow schema converted (and its column names and types listed)
once per distinct schema, not once per file: a run's parts share a handful; ``kforge_metadata``
and ``step_facts``: what shards.read_part plans from. ``read_columns``: a file's columns without
``pq.read_table``, whose pyarrow.dataset imports pandas (0.25 s, once).
"""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

try:  # the reader under pq.read_metadata, without its filesystem and nested-path set-up (~20 us a file)
    from pyarrow._parquet import ParquetReader as _Reader
except ImportError:  # a pyarrow that moved it: the public way
    _Reader = None

from kforge_record.regular_file import NotRegularFile, check_regular_file, open_regular_fd
from kforge_record.schema import FIXED_COLUMNS, PARQUET_META_KEY, SchemaError, check_schema_version

# Arrow prints float64 as "double".
_FIXED_TYPES = {n: ("double" if t == "float64" else t) for n, t in FIXED_COLUMNS}


# Arrow schema as stored by the writer (+ column count) -> (columns, index of step, of step_time_s,
# what is wrong with the columns or None).
# A run's parts share a few schemas: converting each footer's schema to Arrow was half the cost of
# reading it (~50 us of ~110), 13 s for a run of 1024 ranks x 250 parts.
_SCHEMA_FACTS: dict[tuple, tuple[dict, int, int, str | None]] = {}


def open_footer(path: str, warnings: list[str]):
    """(FileMetaData, its key-value metadata, (columns, index of step, index of step_time_s,
    column_problem)), or None with a warning."""
    try:
        md = read_metadata(path)
        metadata = md.metadata or {}  # (a fresh dict each time it is asked for)
        key = (metadata.get(b"ARROW:schema"), md.num_columns)
        facts = _SCHEMA_FACTS.get(key) if key[0] is not None else None
        if facts is None:
            schema = md.schema.to_arrow_schema()
            columns = interned({f.name: str(f.type) for f in schema})
            facts = (columns, schema.get_field_index("step"), schema.get_field_index("step_time_s"),
                     column_problem(columns))
            if key[0] is not None and len(_SCHEMA_FACTS) < 4096:
                _SCHEMA_FACTS[key] = facts
        return md, metadata, facts
    except NotRegularFile as e:  # a FIFO, a device: never opened
        warnings.append(f"{path}: {e}; skipped")
        return None
    except Exception as e:  # truncated, not Parquet, unreadable, a symlink loop: pyarrow raises several types
        warnings.append(f"{path}: corrupt or truncated part file ({type(e).__name__}: {e}); skipped")
        return None


_KV: dict[bytes, dict] = {}  # raw -> parsed kforge metadata that passed; a rank's parts mostly carry the same bytes


def kforge_metadata(path: str, metadata: dict, warnings: list[str]) -> dict | None:
    """The part's ``kforge`` key-value metadata ({} when absent or unreadable); None when it
    comes from a newer schema major (the part is refused). Treat the result as read-only."""
    raw = metadata.get(PARQUET_META_KEY)
    if raw is None:
        return {}
    kv = _KV.get(raw)
    if kv is not None:
        return kv
    try:
        kv = json.loads(raw)
        if not isinstance(kv, dict):  # (a list, a number: JSON, yet no kforge facts in it)
            warnings.append(f"{path}: unreadable kforge metadata (JSON, but not an object); rows kept")
            return {}
        check_schema_version(kv.get("schema_version"), source=path)
    except SchemaError as e:
        warnings.append(f"{e}; skipped")
        return None
    except ValueError as e:
        warnings.append(f"{path}: unreadable kforge metadata ({e}); rows kept")
        return {}
    if len(raw) <= 1024:  # not a merged part's (its list of replaced names): those are one of a kind
        if len(_KV) >= 4096:
            _KV.clear()
        _KV[raw] = kv
    return kv


def step_facts(path: str, md, i_step: int, i_time: int, warnings: list[str]):
    """(min step, max step, rows from Recorder.log, each row group's min step or None) from the
    row-group statistics, else from the two small columns. None with a warning when a step is null
    (a row that belongs nowhere)."""
    lo = hi = None
    null_steps = log_rows = 0
    mins = []
    stats_ok = md.num_rows == 0 or md.num_row_groups > 0
    for g in range(md.num_row_groups):
        rg = md.row_group(g)
        s, t = rg.column(i_step).statistics, rg.column(i_time).statistics
        if s is None or not s.has_min_max or not s.has_null_count or t is None or not t.has_null_count:
            stats_ok = False
            break
        lo = s.min if lo is None else min(lo, s.min)
        hi = s.max if hi is None else max(hi, s.max)
        mins.append(s.min)
        null_steps += s.null_count
        log_rows += t.null_count
    groups = tuple(mins) if stats_ok and len(mins) > 1 else None
    if not stats_ok:  # a writer without statistics (or only nulls in a row group): read the two small columns
        try:
            tbl = read_columns(path, ["step", "step_time_s"])
        except Exception as e:
            warnings.append(corrupt_part(path, e))
            return None
        mm = pc.min_max(tbl.column("step"))
        lo, hi = mm["min"].as_py(), mm["max"].as_py()
        null_steps, log_rows = tbl.column("step").null_count, tbl.column("step_time_s").null_count
    if null_steps:
        warnings.append(f"{path}: {null_steps} of {md.num_rows} row(s) have no step (null); part file skipped")
        return None
    return lo, hi, log_rows, groups


def corrupt_part(path: str, e: Exception) -> str:
    """The warning for a part file whose rows cannot be decoded (one wording, wherever found)."""
    return f"{path}: corrupt part file ({type(e).__name__}: {e}); skipped"


def read_metadata(path: str):
    """The FileMetaData of one Parquet file (as pq.read_metadata).

    pyarrow finds the footer by reading a file's last 64 KB: with the page cache cold that is ~70
    KB of disk a part (713 MB for 10,240 parts of 10k steps) for a ~3 KB footer, and a 64 KB copy
    when warm. So the footer is read here, exactly, and pyarrow parses it from memory, as the file
    "PAR1" + footer + trailer (84 MB of disk there; 3.4 -> 2.2 s cold, 0.93 -> 0.73 s warm). A file
    this cannot make sense of is opened the usual way, whose error names the problem."""
    _refuse_irregular(path)
    if _Reader is None:
        return pq.read_metadata(path)
    footer = _footer_file(path)
    if footer is not None:
        try:
            return _open(pa.BufferReader(footer))
        except Exception:  # not a footer after all: the usual way says why
            pass
    return _open(path)


_TAIL = [4096]  # bytes of a file's tail read first: the last footer's size (a run's parts are alike), >= 4 KB


def _footer_file(path: str) -> bytes | None:
    """b"PAR1" + the footer + its 8-byte trailer (length, "PAR1") of a Parquet file, read with one
    or two reads of its tail; None when the file is not what that expects (pyarrow then says why)."""
    try:
        fd = open_regular_fd(path)
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        k = min(size, _TAIL[0])
        tail = os.pread(fd, k, size - k)
        if k < 12 or len(tail) != k or tail[-4:] != b"PAR1":
            return None
        n = int.from_bytes(tail[-8:-4], "little")
        if n > size - 12:  # more than a file of "PAR1", footer and trailer holds: the usual way says why
            return None
        _TAIL[0] = max(4096, -(-(n + 8) // 4096) * 4096)  # (one read, not two, for the next merged part)
        if n + 8 > k:
            tail = os.pread(fd, n + 8, size - 8 - n)
            if len(tail) != n + 8:
                return None
        return b"PAR1" + tail[len(tail) - 8 - n:]
    except OSError:
        return None
    finally:
        os.close(fd)


def _open(source):
    reader = _Reader()
    reader.open(source)
    try:
        return reader.metadata
    finally:
        reader.close()


def _refuse_irregular(path: str) -> None:
    """NotRegularFile (an OSError) for a FIFO, a device, a folder: no reader may open it (one could
    block for ever). A path that cannot be stat'ed is left to the reader, whose error names it."""
    try:
        check_regular_file(path)
    except NotRegularFile:
        raise
    except OSError:
        pass


def read_columns(path: str, columns: list[str] | None = None):
    """The ``columns`` (default all) of one Parquet file as an Arrow table (as pq.read_table)."""
    _refuse_irregular(path)
    with pq.ParquetFile(path) as pf:
        return pf.read(columns=columns)


def column_max(path: str, column: str) -> float | None:
    """The largest non-null value of a numeric ``column`` of one Parquet file, None when it has none
    (or no such column).

    From the footer's row-group statistics when every row group has them (no data read: a merged
    part of 100k rows costs a footer, not 100k values), else by reading the column."""
    md = read_metadata(path)
    names = md.schema.names
    if column not in names:
        return None
    if md.num_row_groups:
        j = names.index(column)
        stats = [md.row_group(i).column(j).statistics for i in range(md.num_row_groups)]
        if all(st is not None and st.has_min_max for st in stats):
            return max(float(st.max) for st in stats)
        if all(st is not None and st.null_count == md.row_group(i).num_rows for i, st in enumerate(stats)):
            return None
    got = pc.max(read_columns(path, [column]).column(column)).as_py()
    return None if got is None else float(got)


def column_problem(columns: dict) -> str | None:
    """Why the part's columns cannot be read, or None."""
    for name in ("step", "step_time_s"):
        if columns.get(name) != _FIXED_TYPES[name]:
            return f"column {name!r} is {columns.get(name, 'missing')}, expected {_FIXED_TYPES[name]}"
    bad = [n for n, t in columns.items()
           if n in _FIXED_TYPES and t != _FIXED_TYPES[n] or n not in _FIXED_TYPES and t not in ("double", "null")]
    if bad:
        return f"unexpected column type(s) for {', '.join(bad)}"
    # A NUL cannot pass into polars (it panics on such a name): the recorder never writes one.
    nul = [n for n in columns if "\0" in n]
    if nul:
        return f"column name(s) with a NUL character {', '.join(repr(n) for n in nul)}"
    return None


_COLUMN_SETS: dict[tuple, dict] = {}


def interned(columns: dict) -> dict:
    """One shared dict per distinct schema: a run of 1M part files has a handful of schemas, and
    a dict per file would cost ~1 KB each. Treat the result as read-only."""
    return _COLUMN_SETS.setdefault(tuple(columns.items()), columns)
