"""The runs table, one for the dashboard's Runs page and for kforge-report: one row per run, the columns of
column_registry.RUNS_TABLE in that order, each run's values from its RunView (run_view.py), labelled,
formatted and explained (tooltips) by the column registry. Plain functions, no Streamlit.
"""

from __future__ import annotations

import polars as pl

from kforge_dash import column_registry as reg
from kforge_dash.browse.runs import RunInfo
from kforge_dash.run_view import run_view

_DTYPES = {"count": pl.Int64, "text": pl.String, "list": pl.String}
SCHEMA = {c: _DTYPES.get(reg.REGISTRY[c].format, pl.Float64) for c in reg.RUNS_TABLE}
# Columns that, holding one value on every row, are said once above the table instead (runs_table_note).
SAID_ONCE = ("status", "device", "tags")
SAID_ONCE_MISSING = ("peak_mem_bytes",)  # ... when null on every row (CPU runs: it pushed tags off at 1280 px)


def _cell(column: str, v):
    """A value in its column's type: JSON numbers as floats in a float column (NaN/inf kept)."""
    return float(v) if v is not None and SCHEMA[column] == pl.Float64 else v


def runs_table(runs: list[RunInfo]) -> pl.DataFrame:
    """One row per run; values missing from a summary (or from a run never ingested) are null."""
    rows = []
    for r in runs:
        row = run_view(r.summary).row() if r.summary is not None else {}
        status = r.status if r.error is None else f"{r.status}: {r.error}"
        rows.append({"run": r.name, "status": status,
                     **{c: _cell(c, row.get(c)) for c in reg.RUNS_TABLE if c not in ("run", "status")}})
    return pl.DataFrame(rows, schema=SCHEMA)


def _same_everywhere(table: pl.DataFrame) -> dict[str, str | None]:
    """Of SAID_ONCE, the columns with one value (null included) on every row, with that value."""
    same = {c: table[c][0] for c in SAID_ONCE if len(table) and table[c].n_unique() == 1}
    return same | {c: None for c in SAID_ONCE_MISSING if len(table) and table[c].null_count() == len(table)}


def table_columns(table: pl.DataFrame) -> list[str]:
    """The runs_table columns to show, in RUNS_TABLE's order, less the SAID_ONCE ones that are the same on
    every row (runs_table_note says those once)."""
    same = _same_everywhere(table)
    return [c for c in reg.RUNS_TABLE if c in table.columns and c not in same]


def runs_table_note(table: pl.DataFrame) -> str | None:
    """What every run shares of the columns table_columns leaves out, as plain text ("Every run:
    ingested · device CPU · no tags"); None when there is none."""
    same = _same_everywhere(table)
    parts = [str(v) if c == "status" else f"no {reg.label(c)}" if v is None else f"{reg.label(c)} {v}"
             for c, v in same.items()]
    return ("Every run: " + " · ".join(parts)) if parts else None


def formats(table: pl.DataFrame) -> dict:
    """{column: value -> text} of the table's columns (the registry's formats)."""
    return {c: reg.REGISTRY[c].text for c in table.columns}


def table_text(table: pl.DataFrame) -> tuple[list[str], list[list[str]]]:
    """(the shown columns, each row's cells as text): the runs table as kforge-report writes it."""
    columns = table_columns(table)
    return columns, [[reg.REGISTRY[c].text(row[c]) for c in columns] for row in table.iter_rows(named=True)]
