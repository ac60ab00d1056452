"""Tables for display: a missing value as the one dash (kforge_dash.text.MISSING), the config diff as text.

Plain functions shared by the pages and kforge-report.
"""

from __future__ import annotations

import math

from kforge_dash.text import MISSING, NOT_SET


def with_missing_as_dash(rows: list[dict], formats: dict) -> list[dict]:
    """Table rows where each column of `formats` that has a missing value becomes text: the value
    formatted, "—" where missing, left-padded with spaces to one width so that text still sorts
    as the numbers do (for values of one sign). Columns without a gap are left as numbers."""
    out = [dict(r) for r in rows]
    for col, fmt in formats.items():
        if not any(r.get(col) is None for r in rows):
            continue
        texts = [MISSING if r.get(col) is None else fmt(r[col]) for r in rows]
        width = max(len(t) for t in texts)
        for r, t in zip(out, texts):
            r[col] = t if t == MISSING else t.rjust(width)
    return out


def frame_missing_as_dash(df, fmt=lambda v: f"{v:.6g}"):
    """A polars frame for display: its columns with a null as text ("—" there, numbers via `fmt`)."""
    import polars as pl

    formats = {c: (fmt if df[c].dtype.is_numeric() else str) for c in df.columns}
    rows = with_missing_as_dash(df.to_dicts(), formats)
    return pl.DataFrame(rows, schema={c: (pl.String if df[c].null_count() else df[c].dtype) for c in df.columns})


def _short_json(text: str | None) -> str | None:
    """A JSON float to 6 significant digits (0.10822273790836334 -> 0.108223); anything else as it is."""
    import json

    try:
        v = json.loads(text) if text is not None else None
    except ValueError:
        return text
    return f"{v:.6g}" if isinstance(v, float) and math.isfinite(v) else text


def config_diff_text(diff, changes: dict[str, dict[str, list]] | None = None):
    """browse.runs.config_diff for display: a key a run lacks (null there) reads "(not set)", so the
    table never mixes Python's None with JSON's null (a key set to null); floats read to 6
    significant digits, unless that would make two differing values of a key look the same.
    ``changes`` (runs.launch_changes): a value a resume changed says so, "0.001 (changed between
    launches: 0.003 → 0.001)"."""
    import polars as pl

    if diff.width <= 1:
        return diff
    changes = changes or {}
    runs = diff.columns[1:]
    rows = []
    for key, *vals in diff.iter_rows():
        short = [_short_json(v) for v in vals]
        shown = short if len(set(short)) == len(set(vals)) else vals
        cells = [NOT_SET if v is None else v for v in shown]
        for i, run in enumerate(runs):
            per_launch = changes.get(run, {}).get(key)
            if per_launch:
                cells[i] += f" (changed between launches: {' → '.join(_short_json(v) or 'null' for v in per_launch)})"
        rows.append([key, *cells])
    return pl.DataFrame(rows, schema={c: pl.String for c in diff.columns}, orient="row")
