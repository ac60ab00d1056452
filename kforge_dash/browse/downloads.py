"""Download of the selected series at full resolution (not the downsampled drawing)."""

from __future__ import annotations

import io

import polars as pl

from kforge_dash.browse.series import RunSource, steps_schema


def selected_series(runs: list[RunSource], metrics: list[str]) -> pl.DataFrame:
    """One row per (run, step): run, step, time, tokens and the selected metrics.

    Runs lacking a metric get nulls in its column; NaN/inf are exported as they are.
    """
    parts = []
    for r in runs:
        schema = steps_schema(r.steps_path)
        cols = [c for c in ("step", "time", "tokens", *metrics) if c in schema]
        parts.append(pl.scan_parquet(r.steps_path, glob=False).select(pl.lit(r.name).alias("run"), *cols))
    if not parts:
        return pl.DataFrame(schema={"run": pl.String, "step": pl.Int64})
    return pl.concat(parts, how="diagonal_relaxed").collect()


def to_csv_bytes(df: pl.DataFrame) -> bytes:
    return df.write_csv().encode("utf-8")


def to_parquet_bytes(df: pl.DataFrame) -> bytes:
    buf = io.BytesIO()
    df.write_parquet(buf)
    return buf.getvalue()
