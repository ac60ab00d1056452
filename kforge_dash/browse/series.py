"""Series for the compare view: x-axis conversion, smoothing, downsampling and markers.

Order matters and is the point of this file: each run's steps.parquet is scanned lazily, the
x-axis and the smoothed series are computed at full resolution in one polars query per run
(all runs collected together), and only then is each series downsampled for drawing. Smoothing
a downsampled series would smooth a different signal; downsampling with MinMaxLTTB keeps local
extremes, so a one-step spike in a million steps is still drawn. A zoom (`StepRange`) filters the
full-resolution series after smoothing and before downsampling, so a zoomed range is drawn from
every recorded step of it, not from the points of the whole-run drawing.

The smoothing weight is per step of a series logged every step: a series logged every k steps
is smoothed with weight**k per point (its own density), and one of fewer than MIN_SMOOTH_POINTS
points is not smoothed at all, so an eval loss logged every 100 steps reads its true last value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl
from tsdownsample import MinMaxLTTBDownsampler

from kforge_dash import text
from kforge_dash.browse import lineage
from kforge_dash.browse.findings import spike_spans
from kforge_dash.browse.smoothing import MIN_SMOOTH_POINTS, series_weight, smooth_columns  # noqa: F401 (re-exported)
from kforge_dash.contract import EMA_COLUMNS

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
    "step_work_s", "step_work_min_s", "step_work_median_s",
}
# Points per line at landing (and per zoomed range, which is re-read at full resolution): about two
# per pixel column of a chart in the two-column grid. Drawing is most of the landing page's time
# in the browser (benchmarks/bench_dash_browser.py), and MinMaxLTTB keeps every local extreme.
DEFAULT_POINTS = 1000
MAX_MARKERS = 500  # per run, metric and kind; the Run detail page lists every non-finite step
DEFAULT_CHARTS = ("loss", "grad_norm", "lr", "tokens_per_sec", "mfu", "step_time_s", "mem_peak_bytes")
# Drawn raw even when smoothing is on: a schedule and memory levels are not noisy, and an EMA
# would only add lag (and cost a full-resolution pass per run).
UNSMOOTHED = ("lr", "mem_peak_bytes", "mem_allocated_bytes", "mem_reserved_bytes")
TIME_AXES = ("wall time", "time since start")  # axes on which a restart's downtime is a gap


def smoothed(metric: str) -> bool:
    return metric not in UNSMOOTHED


def available_metrics(schemas: list[pl.Schema]) -> list[str]:
    """Chartable metrics present in any of the runs' steps.parquet schemas, core metrics first."""
    names = set()
    for schema in schemas:
        for name, dtype in schema.items():
            if name in _NOT_METRICS or name in EMA_COLUMNS or not dtype.is_numeric():
                continue
            names.add(name)
    core = [m for m in CORE_METRICS if m in names]
    return core + sorted(names - set(core))


def steps_schema(path: str | Path) -> pl.Schema:
    """Column names and types of an ingested steps.parquet (reads only the footer)."""
    try:
        return pl.scan_parquet(path, glob=False).collect_schema()
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


def downsample_indices(y: np.ndarray, n_out: int | None, *, finite: np.ndarray | None = None) -> np.ndarray:
    """Indices of the points of `y` to draw: every finite one when few (or n_out is None),
    else MinMaxLTTB's choice among the finite ones.

    Non-finite values are left out (they are drawn as markers instead). `finite` is
    np.isfinite(y) when the caller already has it.
    """
    finite = np.isfinite(y) if finite is None else finite
    all_finite = bool(finite.all())
    n = len(y) if all_finite else int(np.count_nonzero(finite))
    if n_out is None or n <= n_out:
        return np.arange(len(y)) if all_finite else np.flatnonzero(finite)
    # MinMaxLTTB: min and max of 4*n_out bins are preselected, then LTTB picks among them, so
    # local extremes survive; it needs at least 3 output points. Sequential: for one series of
    # 1M points the thread start costs more than it saves, and series are many.
    ds = MinMaxLTTBDownsampler()
    if all_finite:  # the common case: no copy
        return ds.downsample(np.ascontiguousarray(y), n_out=max(n_out, 3), parallel=False)
    idx = np.flatnonzero(finite)
    return idx[ds.downsample(np.ascontiguousarray(y[idx]), n_out=max(n_out, 3), parallel=False)]


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
    raw: np.ndarray | None = None  # a smoothed line's raw value at each of its points (one hover row shows both)


@dataclass
class Marker:
    """Points to mark on a chart: non-finite values ('nan', 'inf', '-inf'), 'restart' or 'spike'
    (a loss/grad-norm spike finding of summary.json, at its first step)."""
    run: str
    metric: str
    kind: str
    x: np.ndarray
    y: np.ndarray  # where to draw it: the last finite value before it (a NaN has no height)
    step: np.ndarray
    text: list[str]
    count: int = 0  # how many steps it stands for (more than drawn when capped)

    def __post_init__(self):
        self.count = self.count or len(self.step)


@dataclass
class CompareData:
    x_axis: str
    metrics: list[str]
    series: list[Series] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # e.g. a run without token counts
    branches: list[lineage.Branch] = field(default_factory=list)  # steps restarts superseded, drawn faint

    def points(self) -> int:
        return sum(len(s.x) for s in self.series)

    def points_total(self) -> int:
        return sum(s.n_total for s in self.series)

    def drawn_metrics(self) -> list[str]:
        """The requested metrics that have at least one line (in request order)."""
        have = {s.metric for s in self.series}
        return [m for m in self.metrics if m in have]

    def nonfinite_lines(self) -> list[str]:
        """One line per (run, metric, kind) of NaN/inf values, for a warning above the charts."""
        return [f"{m.run}: {m.metric} is {m.kind} at {m.count} step(s), first at step {m.step[0]}"
                for m in self.markers if m.kind in ("nan", "inf", "-inf")]


@dataclass
class RunSource:
    """What the compare view needs from one run: its steps.parquet and its summary."""
    name: str
    steps_path: Path
    summary: dict


@dataclass(frozen=True)
class StepRange:
    """A zoom: the steps first..last (inclusive) re-read at full resolution."""
    first: int
    last: int

    def __post_init__(self):
        if isinstance(self.first, bool) or isinstance(self.last, bool) or self.first > self.last:
            raise ValueError(f"step range {self.first}..{self.last}: first must be <= last")


@dataclass
class RunFrame:
    """One run at full resolution: step, __x, each metric (Float64) and METRIC__smoothed where smoothed."""
    src: RunSource
    schema: pl.Schema
    df: pl.DataFrame
    weights: dict[str, float]  # metric -> the per-point EMA weight used (absent: not smoothed)


def run_start_time(summary: dict) -> float | None:
    starts = [a.get("start_time") for a in summary.get("attempts") or [] if a.get("start_time") is not None]
    return min(starts) if starts else None


def _scan_run(src: RunSource, metrics: list[str], schema: pl.Schema, *, x_axis: str, sort: bool = False) -> pl.LazyFrame:
    present = [m for m in metrics if m in schema]
    exprs = [pl.col("step"), x_expr(x_axis, start_time=run_start_time(src.summary)).alias("__x")]
    exprs += [pl.col(m).cast(pl.Float64) for m in present]
    lf = pl.scan_parquet(src.steps_path, glob=False)
    # steps.parquet is sorted by step (CONTRACT); sorting 1M rows again would double the cost,
    # so the caller checks the order and asks for the sort only for a file that breaks it.
    return (lf.sort("step") if sort else lf).select(exprs)


def run_frames(runs: list[RunSource], metrics: list[str], *, x_axis: str, smoothing: float,
               step_range: StepRange | None = None) -> list[RunFrame]:
    """Each run's series at full resolution (all runs collected together), smoothed, then cut to `step_range`."""
    schemas = [steps_schema(r.steps_path) for r in runs]
    frames = pl.collect_all([_scan_run(r, metrics, s, x_axis=x_axis) for r, s in zip(runs, schemas)])
    out = []
    for src, schema, df in zip(runs, schemas, frames):
        if not df["step"].is_sorted():  # cheap check; the EMA needs step order
            df = _scan_run(src, metrics, schema, x_axis=x_axis, sort=True).collect()
        df, weights = smooth_columns(df, [m for m in metrics if smoothed(m)], smoothing)
        if step_range is not None:  # after smoothing: the EMA at a step does not depend on the zoom
            df = df.filter(pl.col("step").is_between(step_range.first, step_range.last))
        out.append(RunFrame(src, schema, df.rechunk(), weights))  # rechunk: to_numpy below is a view
    return out


def _finite_neighbour(y: np.ndarray, finite: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The last finite value at or before each index in `at`, else the first one after it
    (NaN when the series has no finite value at all): where a marker without a height is drawn."""
    fin = np.flatnonzero(finite)
    if len(fin) == 0:
        return np.full(len(at), np.nan)
    before = np.searchsorted(fin, at, side="right") - 1
    return y[fin[np.where(before >= 0, before, 0)]]


def _nonfinite_markers(run: str, metric: str, x, y, step, finite) -> list[Marker]:
    """NaN/inf values (nulls were removed before), each drawn at its finite neighbour's height."""
    bad = np.flatnonzero(~finite)
    height = _finite_neighbour(y, finite, bad)
    out = []
    for kind, sel in (("nan", np.isnan(y[bad])), ("inf", np.isposinf(y[bad])), ("-inf", np.isneginf(y[bad]))):
        if sel.any():
            idx, h, count = bad[sel], height[sel], int(sel.sum())
            if count > MAX_MARKERS:  # a diverged run: evenly spaced markers, the count stays exact
                pick = np.linspace(0, count - 1, MAX_MARKERS).round().astype(np.int64)
                idx, h = idx[pick], h[pick]
            more = f" ({text.counted(count, 'such step')})" if count > 1 else ""
            out.append(Marker(run, metric, kind, x[idx], h, step[idx],
                              [f"{metric} = {kind} at step {s}{more}" for s in step[idx]], count))
    return out


def _restart_markers(run: str, metric: str, summary: dict, x, y, step) -> Marker | None:
    restarts = summary.get("restarts") or []
    if not restarts or len(step) == 0:
        return None
    at = np.array([r["resumed_at_step"] for r in restarts if r.get("resumed_at_step") is not None], dtype=np.int64)
    if len(at) == 0:
        return None
    pos = np.clip(np.searchsorted(step, at), 0, len(step) - 1)
    height = _finite_neighbour(y, np.isfinite(y), pos)
    hover = [
        f"{'rollback in' if r.get('in_process') else 'restart:'} attempt {r.get('attempt')} resumed at step "
        f"{r.get('resumed_at_step')} ({'it' if r.get('in_process') else 'previous attempt'} reached {r.get('previous_last_step')}"
        + (f", {text.counted(r['superseded_steps'], 'step')} superseded)" if isinstance(r.get("superseded_steps"), int) else ")")
        for r in restarts if r.get("resumed_at_step") is not None
    ]
    return Marker(run, metric, "restart", x[pos], height, step[pos], hover)


def _spike_markers(run: str, metric: str, summary: dict, x, y, step) -> Marker | None:
    """A ★ at each spike finding's raw peak: the highest finite raw value within its steps (`y` is
    the raw line, never the smoothed one, whose rising edge would hide the peak), else its first step."""
    spikes = spike_spans(summary, metric)
    if not spikes or len(step) == 0:
        return None
    finite = np.isfinite(y)
    pos = []
    for first, last, _ in spikes:
        a, b = np.searchsorted(step, first), np.searchsorted(step, last, side="right")
        inside = np.flatnonzero(finite[a:b])
        pos.append(a + inside[np.argmax(y[a:b][inside])] if len(inside) else min(a, len(step) - 1))
    idx = np.array(pos, dtype=np.int64)
    return Marker(run, metric, "spike", x[idx], _finite_neighbour(y, finite, idx), step[idx],
                  [msg for _, _, msg in spikes])


def _break_at_restarts(s: Series, restarts: np.ndarray) -> Series:
    """On a time axis, a NaN point just before each restart, so the line breaks over the downtime."""
    pos = np.unique(np.searchsorted(s.step, restarts))
    pos = pos[(pos > 0) & (pos < len(s.step))]
    if len(pos) == 0:
        return s
    return Series(s.run, s.metric, s.kind, np.insert(s.x, pos, s.x[pos]), np.insert(s.y, pos, np.nan),
                  np.insert(s.step, pos, s.step[pos]), s.n_total, None if s.raw is None else np.insert(s.raw, pos, np.nan))


def _restart_steps(summary: dict) -> np.ndarray:
    at = [r.get("resumed_at_step") for r in summary.get("restarts") or []]
    return np.array(sorted(a for a in at if isinstance(a, int)), dtype=np.int64)


def _metric_lines(data: CompareData, f: RunFrame, m: str, keep, x_all, step_all, *, max_points) -> None:
    """The raw (and smoothed) line of one run's metric, its non-finite and restart markers."""
    lines = [("raw", f.df[m].to_numpy())]
    if m in f.weights:
        lines.append(("smoothed", f.df[f"{m}__smoothed"].to_numpy()))
    x, step = (x_all, step_all) if keep is None else (x_all[keep], step_all[keep])
    restarts = _restart_steps(f.src.summary) if data.x_axis in TIME_AXES else None
    raw = None
    for kind, values in lines:
        values = values.astype(np.float64, copy=False)
        values = values if keep is None else values[keep]
        finite = np.isfinite(values)
        idx = downsample_indices(values, max_points, finite=finite)
        s = Series(f.src.name, m, kind, x[idx], values[idx], step[idx], int(np.count_nonzero(finite)),
                   None if raw is None else raw[idx])  # (raw comes first: set for the smoothed line)
        data.series.append(s if restarts is None or len(restarts) == 0 else _break_at_restarts(s, restarts))
        if kind == "raw":
            raw = values
            if not finite.all():
                data.markers += _nonfinite_markers(f.src.name, m, x, values, step, finite)
    # Restarts sit on the line the eye follows: the smoothed one when there is one; a spike's ★ at its raw peak.
    for marks, on in ((_restart_markers, values), (_spike_markers, raw)):
        marker = marks(f.src.name, m, f.src.summary, x, on, step)
        if marker is not None:
            data.markers.append(marker)


def _run_lines(data: CompareData, f: RunFrame, absent: dict[str, list[str]], *, max_points) -> None:
    df = f.df
    if data.x_axis == "tokens" and (len(df) == 0 or df["__x"].null_count() == len(df)):
        data.notes.append(f"{f.src.name}: no token counts, so it has no tokens axis")
        return
    has_x = None if df["__x"].null_count() == 0 else df["__x"].is_not_null().to_numpy()
    x_all, step_all = df["__x"].to_numpy(), df["step"].to_numpy()
    for m in data.metrics:
        if m not in f.schema:
            continue
        col = df[m]
        # Nulls are "not reported", not NaN: they are neither drawn nor marked.
        keep = has_x
        if col.null_count():
            keep = col.is_not_null().to_numpy() if keep is None else keep & col.is_not_null().to_numpy()
        if len(col) == 0 or (keep is not None and not keep.any()):
            absent.setdefault(m, []).append(f.src.name)
            continue
        _metric_lines(data, f, m, keep, x_all, step_all, max_points=max_points)


def check_view(*, x_axis: str, smoothing: float) -> None:
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"smoothing {smoothing!r}: must be in [0, 1)")
    if x_axis not in X_AXES:
        raise ValueError(f"x axis {x_axis!r}: expected one of {', '.join(X_AXES)}")


def prepare_compare(
    runs: list[RunSource],
    metrics: list[str],
    *,
    x_axis: str = "step",
    smoothing: float = 0.0,
    max_points: int | None = DEFAULT_POINTS,
    step_range: StepRange | None = None,
) -> CompareData:
    """Everything the compare charts draw, for `runs` × `metrics` (within `step_range` when zoomed).

    `smoothing` is TensorBoard's weight in [0, 1) per step (see series_weight); 0 means no
    smoothed line. `max_points=None` draws every point (what the benchmark compares against).
    """
    check_view(x_axis=x_axis, smoothing=smoothing)
    data = CompareData(x_axis, list(metrics))
    absent: dict[str, list[str]] = {}  # metric -> runs without a single value of it
    for f in run_frames(runs, metrics, x_axis=x_axis, smoothing=smoothing, step_range=step_range):
        for m in metrics:
            if m not in f.schema:
                absent.setdefault(m, []).append(f.src.name)
        _run_lines(data, f, absent, max_points=max_points)
        data.branches += lineage.branches(f.src.name, f.src.steps_path, f.src.summary, metrics, f.df, x_axis, step_range)
    where = "" if step_range is None else f" in steps {step_range.first}..{step_range.last}"
    data.notes += [f"no {m} in {', '.join(names)}{where}" for m, names in absent.items()]
    return data
