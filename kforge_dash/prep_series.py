"""Series for the compare view: x-axis conversion, smoothing, downsampling and markers.

Order matters and is the point of this file: each run's steps.parquet is scanned lazily, the
x-axis and the smoothed series are computed at full resolution in one polars query per run
(all runs collected together), and only then is each series downsampled for drawing. Smoothing
a downsampled series would smooth a different signal; downsampling with MinMaxLTTB keeps local
extremes, so a one-step spike in a million steps is still drawn.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl
from tsdownsample import MinMaxLTTBDownsampler

X_AXES = ("step", "tokens", "wall time", "time since start")
X_LABELS = {
    "step": "step",
    "tokens": "tokens (cumulative, global)",
    "wall time": "wall time (UTC)",
    "time since start": "time since start (s)",
}
# Charts offered first, in this order; other float columns (user scalars, phases) follow.
CORE_METRICS = (
    "loss", "grad_norm", "lr", "tokens_per_sec", "mfu", "step_time_s",
    "mem_peak_bytes", "mem_allocated_bytes", "mem_reserved_bytes",
)
# Columns of steps.parquet that are bookkeeping or already-derived, not metrics to chart.
_NOT_METRICS = {
    "step", "time", "slowest_rank", "n_ranks", "attempt", "tokens",
    "step_time_min_s", "step_time_median_s",
}
DEFAULT_POINTS = 2000


def available_metrics(schemas: list[pl.Schema]) -> list[str]:
    """Chartable metrics present in any of the runs' steps.parquet schemas, core metrics first."""
    names = set()
    for schema in schemas:
        for name, dtype in schema.items():
            if name in _NOT_METRICS or name.endswith("_ema") or not dtype.is_numeric():
                continue
            names.add(name)
    core = [m for m in CORE_METRICS if m in names]
    return core + sorted(names - set(core))


def steps_schema(path: str | Path) -> pl.Schema:
    """Column names and types of an ingested steps.parquet (reads only the footer)."""
    try:
        return pl.scan_parquet(path).collect_schema()
    except Exception as e:  # polars raises several types for a bad file; name the file
        raise ValueError(f"{path}: not a readable Parquet file ({e})") from None


def x_expr(axis: str, *, start_time: float | None = None) -> pl.Expr:
    """The x value of every step for `axis` (an expression over steps.parquet columns).

    - step: the step number.
    - tokens: cumulative global tokens up to and including the step. A step with unknown
      tokens keeps the previous total (forward fill); steps before any known count are null.
    - wall time: the step's end time as a UTC datetime.
    - time since start: seconds from `start_time` (the run's first launch) to the step's end;
      without it, from the first step's end.
    """
    if axis == "step":
        return pl.col("step")
    if axis == "tokens":
        return pl.col("tokens").cum_sum().forward_fill()
    if axis == "wall time":
        return (pl.col("time") * 1e6).round().cast(pl.Int64).cast(pl.Datetime("us", "UTC"))
    if axis == "time since start":
        start = pl.lit(start_time, pl.Float64) if start_time is not None else pl.col("time").min()
        return pl.col("time") - start
    raise ValueError(f"x axis {axis!r}: expected one of {', '.join(X_AXES)}")


def ema_expr(col: str, *, alpha: float) -> pl.Expr:
    """EMA as ingest defines it: the first finite value starts it, then a*x + (1-a)*ema;
    NaN/inf (and nulls) do not enter and the EMA holds its last value there."""
    finite = pl.when(pl.col(col).is_finite()).then(pl.col(col))
    return finite.ewm_mean(alpha=alpha, adjust=False, ignore_nulls=True, min_samples=1).forward_fill()


def downsample_indices(y: np.ndarray, n_out: int) -> np.ndarray:
    """Indices of the points of `y` to draw: all finite ones when few, else MinMaxLTTB's choice.

    Non-finite values are left out here (they are drawn as markers instead); null is NaN here.
    """
    finite = np.flatnonzero(np.isfinite(y))
    if len(finite) <= n_out:
        return finite
    yf = np.ascontiguousarray(y[finite])
    # MinMaxLTTB: min and max of 4*n_out bins are preselected, then LTTB picks among them, so
    # local extremes survive; it needs at least 3 output points.
    chosen = MinMaxLTTBDownsampler().downsample(yf, n_out=max(n_out, 3), parallel=True)
    return finite[chosen]


@dataclass
class Series:
    """One drawn line: run × metric × kind ('raw' or 'smoothed')."""
    run: str
    metric: str
    kind: str
    x: np.ndarray
    y: np.ndarray
    step: np.ndarray
    n_total: int  # points before downsampling (finite ones)


@dataclass
class Marker:
    """Points to mark on a chart: non-finite values ('nan', 'inf', '-inf') or 'restart'."""
    run: str
    metric: str
    kind: str
    x: np.ndarray
    y: np.ndarray  # where to draw it: the last finite value before it (a NaN has no height)
    step: np.ndarray
    text: list[str]


@dataclass
class CompareData:
    x_axis: str
    metrics: list[str]
    series: list[Series] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # e.g. a run without token counts

    def points(self) -> int:
        return sum(len(s.x) for s in self.series)


@dataclass
class RunSource:
    """What the compare view needs from one run: its steps.parquet and its summary."""
    name: str
    steps_path: Path
    summary: dict


def run_start_time(summary: dict) -> float | None:
    starts = [a.get("start_time") for a in summary.get("attempts") or [] if a.get("start_time") is not None]
    return min(starts) if starts else None


def _scan_run(src: RunSource, metrics: list[str], schema: pl.Schema, *, x_axis: str, alpha: float | None) -> pl.LazyFrame:
    present = [m for m in metrics if m in schema]
    exprs = [pl.col("step"), x_expr(x_axis, start_time=run_start_time(src.summary)).alias("__x")]
    exprs += [pl.col(m).cast(pl.Float64) for m in present]
    if alpha is not None:
        exprs += [ema_expr(m, alpha=alpha).alias(f"{m}__smoothed") for m in present]
    # Sorting by step is a no-op for contract-conforming files and makes the EMA order certain.
    return pl.scan_parquet(src.steps_path).sort("step").select(exprs)


def _prev_finite(y: np.ndarray) -> np.ndarray:
    """For each position, the last finite value at or before it (NaN before any finite one)."""
    finite = np.isfinite(y)
    idx = np.where(finite, np.arange(len(y)), -1)
    np.maximum.accumulate(idx, out=idx)
    out = np.full(len(y), np.nan)
    ok = idx >= 0
    out[ok] = y[idx[ok]]
    return out


def _nonfinite_markers(run: str, metric: str, x, y, step) -> list[Marker]:
    """NaN/inf values (nulls were removed before): drawn at the last finite value before them,
    or the first one after when the series starts non-finite."""
    bad = np.flatnonzero(~np.isfinite(y))
    if len(bad) == 0:
        return []
    height = _prev_finite(y)[bad]
    after = _prev_finite(y[::-1])[::-1][bad]
    height = np.where(np.isnan(height), after, height)
    out = []
    for kind, sel in (("nan", np.isnan(y[bad])), ("inf", np.isposinf(y[bad])), ("-inf", np.isneginf(y[bad]))):
        if sel.any():
            idx = bad[sel]
            out.append(Marker(run, metric, kind, x[idx], height[sel], step[idx],
                              [f"{metric} = {kind} at step {s}" for s in step[idx]]))
    return out


def _restart_markers(run: str, metric: str, summary: dict, x, y, step) -> Marker | None:
    restarts = summary.get("restarts") or []
    if not restarts or len(step) == 0:
        return None
    at = np.array([r["resumed_at_step"] for r in restarts if r.get("resumed_at_step") is not None], dtype=np.int64)
    if len(at) == 0:
        return None
    pos = np.clip(np.searchsorted(step, at), 0, len(step) - 1)
    height = _prev_finite(y)
    text = [
        f"restart: attempt {r.get('attempt')} resumed at step {r.get('resumed_at_step')}"
        f" (previous attempt reached {r.get('previous_last_step')}, {r.get('superseded_steps')} steps superseded)"
        for r in restarts if r.get("resumed_at_step") is not None
    ]
    return Marker(run, metric, "restart", x[pos], height[pos], step[pos], text)


def prepare_compare(
    runs: list[RunSource],
    metrics: list[str],
    *,
    x_axis: str = "step",
    smoothing: float = 0.0,
    max_points: int | None = DEFAULT_POINTS,
) -> CompareData:
    """Everything the compare charts draw, for `runs` × `metrics`.

    `smoothing` is TensorBoard's weight in [0, 1): the EMA's alpha is 1 - smoothing, and 0 means
    no smoothed line. `max_points=None` draws every point (what the benchmark compares against).
    """
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"smoothing {smoothing!r}: must be in [0, 1)")
    if x_axis not in X_AXES:
        raise ValueError(f"x axis {x_axis!r}: expected one of {', '.join(X_AXES)}")
    alpha = None if smoothing == 0.0 else 1.0 - smoothing
    data = CompareData(x_axis, list(metrics))
    schemas = [steps_schema(r.steps_path) for r in runs]
    absent: dict[str, list[str]] = {}  # metric -> runs without a single value of it
    frames = pl.collect_all([_scan_run(r, metrics, s, x_axis=x_axis, alpha=alpha) for r, s in zip(runs, schemas)])
    for src, schema, df in zip(runs, schemas, frames):
        for m in metrics:
            if m not in schema:
                absent.setdefault(m, []).append(src.name)
        if x_axis == "tokens" and (len(df) == 0 or df["__x"].null_count() == len(df)):
            data.notes.append(f"{src.name}: no token counts, so it has no tokens axis")
            continue
        has_x = df["__x"].is_not_null().to_numpy()
        x_all = df["__x"].to_numpy()
        step_all = df["step"].to_numpy()
        for m in metrics:
            if m not in schema:
                continue
            col = df[m]
            y_all = col.to_numpy().astype(np.float64, copy=False)  # null -> NaN here
            is_null = col.is_null().to_numpy()
            # Nulls are "not reported", not NaN: they are neither drawn nor marked.
            keep = has_x & ~is_null
            if not keep.any():
                absent.setdefault(m, []).append(src.name)
                continue
            x, y, step = x_all[keep], y_all[keep], step_all[keep]
            kinds = [("raw", y)]
            if alpha is not None:
                kinds.append(("smoothed", df[f"{m}__smoothed"].to_numpy().astype(np.float64, copy=False)[keep]))
            for kind, values in kinds:
                idx = downsample_indices(values, max_points) if max_points else np.flatnonzero(np.isfinite(values))
                data.series.append(Series(src.name, m, kind, x[idx], values[idx], step[idx], int(np.isfinite(values).sum())))
            data.markers += _nonfinite_markers(src.name, m, x, y, step)
            restart = _restart_markers(src.name, m, src.summary, x, y if alpha is None else kinds[1][1], step)
            if restart is not None:
                data.markers.append(restart)
    data.notes += [f"no {m} in {', '.join(names)}" for m, names in absent.items()]
    return data
