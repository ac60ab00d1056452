"""pyarrow reads of part files, at the least cost per file (a run may have a million).

``open_footer``: a footer, its Arrow schema converted (and its column names and types listed)
once per distinct schema, not once per file: a run's parts share a handful. ``read_columns``: a
file's columns without ``pq.read_table``, whose pyarrow.dataset imports pandas (0.25 s, once).
"""

from __future__ import annotations

import pyarrow.compute as pc
import pyarrow.parquet as pq

try:  # the reader under pq.read_metadata, without its filesystem and nested-path set-up (~20 us a file)
    from pyarrow._parquet import ParquetReader as _Reader
except ImportError:  # a pyarrow that moved it: the public way
    _Reader = None

from kforge_record.schema import FIXED_COLUMNS

# Arrow prints float64 as "double".
_FIXED_TYPES = {n: ("double" if t == "float64" else t) for n, t in FIXED_COLUMNS}


# Arrow schema as stored by the writer (+ column count) -> (columns, index of step, of step_time_s,
# what is wrong with the columns or None).
# A run's parts share a few schemas: converting each footer's schema to Arrow was half the cost of
# reading it (~50 us of ~110), 13 s for a run of 1024 ranks x 250 parts.
_SCHEMA_FACTS: dict[tuple, tuple[dict, int, int, str | None]] = {}


def open_footer(path: str, warnings: list[str]):
    """(FileMetaData, (columns, index of step, index of step_time_s, column_problem)), or None
    with a warning."""
    try:
        md = read_metadata(path)
        key = ((md.metadata or {}).get(b"ARROW:schema"), md.num_columns)
        facts = _SCHEMA_FACTS.get(key) if key[0] is not None else None
        if facts is None:
            schema = md.schema.to_arrow_schema()
            columns = interned({f.name: str(f.type) for f in schema})
            facts = (columns, schema.get_field_index("step"), schema.get_field_index("step_time_s"),
                     column_problem(columns))
            if key[0] is not None and len(_SCHEMA_FACTS) < 4096:
                _SCHEMA_FACTS[key] = facts
        return md, facts
    except Exception as e:  # truncated, not Parquet, unreadable, a symlink loop: pyarrow raises several types
        warnings.append(f"{path}: corrupt or truncated part file ({type(e).__name__}: {e}); skipped")
        return None


def read_metadata(path: str):
    """The FileMetaData of one Parquet file (as pq.read_metadata)."""
    if _Reader is None:
        return pq.read_metadata(path)
    reader = _Reader()
    reader.open(path)
    try:
        return reader.metadata
    finally:
        reader.close()


def read_columns(path: str, columns: list[str] | None = None):
    """The ``columns`` (default all) of one Parquet file as an Arrow table (as pq.read_table)."""
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
