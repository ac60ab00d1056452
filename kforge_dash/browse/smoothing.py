"""Smoothing each series by its own density: the weight is per step, so a series logged every k
steps gets weight**k per point, and a series of a few points is not smoothed at all.

The EMA itself is ingest's (kforge_dash.ingest.rowpass.reduce.ema_expr, docs/CONTRACT.md): for a series
logged every step, the dashboard's smoothed line equals ingest's *_ema column at alpha = 1 - weight.
"""

from __future__ import annotations

import polars as pl

from kforge_dash.ingest.rowpass.reduce import ema_expr

MIN_SMOOTH_POINTS = 10  # fewer points than this: every one is a reading, none is noise to average out
MIN_WEIGHT = 0.05  # a per-point weight below this changes the line by less than the eye can see


def series_weight(smoothing: float, *, points: int, step_gap: float | None) -> float | None:
    """The EMA weight per point of one series, or None for no smoothed line.

    `smoothing` is the weight per step; a series whose points are `step_gap` steps apart (median)
    gets smoothing**step_gap per point, so smoothing spans the same number of steps whatever the
    logging interval. Fewer than MIN_SMOOTH_POINTS points, or a weight that would not show, is None.
    """
    if smoothing <= 0.0 or points < MIN_SMOOTH_POINTS:
        return None
    w = smoothing ** max(float(step_gap or 1.0), 1.0)
    return w if w >= MIN_WEIGHT else None


def smooth_columns(df: pl.DataFrame, metrics: list[str], smoothing: float) -> tuple[pl.DataFrame, dict[str, float]]:
    """Add METRIC__smoothed columns to a frame sorted by step: each series by its own density
    (series_weight). Returns the frame and {metric: the per-point weight used} of those smoothed."""
    cand = [m for m in metrics if m in df.columns]
    if smoothing <= 0.0 or not cand or df.is_empty():
        return df, {}
    stats = df.select(
        *[pl.col(m).is_not_null().sum().alias(f"{m}__n") for m in cand],
        *[pl.col("step").filter(pl.col(m).is_not_null()).diff().median().alias(f"{m}__gap") for m in cand],
    ).row(0, named=True)
    weights = {}
    for m in cand:
        w = series_weight(smoothing, points=int(stats[f"{m}__n"]), step_gap=stats[f"{m}__gap"])
        if w is not None:
            weights[m] = w
    return df.with_columns(ema_expr(m, alpha=1.0 - w).alias(f"{m}__smoothed") for m, w in weights.items()), weights
