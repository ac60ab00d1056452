"""Groups of runs (seeds of one config, say) drawn as one mean line with a band.

Runs are grouped by a tag, by an hparam's value or by a name pattern (the name with the pattern
removed: `-seed\\d+$` puts `lr3e-4-seed1` and `lr3e-4-seed2` in `lr3e-4`). Per group and metric,
the runs' full-resolution series (smoothed, each by its own density, when smoothing is on) are
aligned on the step, and mean, min, max and std over the runs reporting that step are taken; only
then is the result downsampled (the indices MinMaxLTTB keeps on the mean, the min and the max).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from kforge_dash.browse.series import (
    DEFAULT_POINTS,
    RunFrame,
    RunSource,
    StepRange,
    check_view,
    downsample_indices,
    run_frames,
)

GROUP_KINDS = ("tag", "hparam", "name pattern")
BANDS = ("min–max", "±std")
DEFAULT_PATTERN = r"[-_.]?seed[-_=]?\d+$"
UNGROUPED = "(none)"


@dataclass(frozen=True)
class GroupBy:
    """How runs are grouped: kind in GROUP_KINDS; `key` is the hparam name or the regex."""
    kind: str
    key: str = ""

    def __post_init__(self):
        if self.kind not in GROUP_KINDS:
            raise ValueError(f"group by {self.kind!r}: expected one of {', '.join(GROUP_KINDS)}")
        if self.kind == "name pattern":
            try:
                re.compile(self.key)
            except re.error as e:
                raise ValueError(f"name pattern {self.key!r}: not a regular expression ({e})") from None


def _hparam(summary: dict, key: str):
    v: object = summary.get("hparams") or {}
    for part in key.split("."):
        if not isinstance(v, dict) or part not in v:
            return None
        v = v[part]
    return v


def group_of(name: str, summary: dict, by: GroupBy) -> str:
    """The group a run belongs to (UNGROUPED when it has no such tag or hparam)."""
    if by.kind == "tag":
        tags = sorted(str(t) for t in summary.get("tags") or [])
        return ", ".join(tags) if tags else UNGROUPED
    if by.kind == "hparam":
        v = _hparam(summary, by.key)
        return UNGROUPED if v is None else f"{by.key}={json.dumps(v, sort_keys=True)}"
    return re.sub(by.key, "", name) or name


def _flat_keys(v, prefix: str = "") -> list[str]:
    if not isinstance(v, dict) or not v:
        return [prefix[:-1]] if prefix else []
    return [k for name, sub in v.items() for k in _flat_keys(sub, f"{prefix}{name}.")]


def hparam_keys(summaries: list[dict]) -> list[str]:
    """The hparams of the runs, nested ones as dotted keys (`optim.lr`), sorted."""
    return sorted({k for s in summaries for k in _flat_keys(s.get("hparams") or {})})


def default_hparam_key(summaries: list[dict]) -> str | None:
    """The hparam "Group runs by" opens with: one whose values differ between the runs, preferring
    one every run has and that makes real groups (fewer groups than runs: `lr` over `seed`), then
    the one with the most groups, then by name. None without hparams."""
    n = len(summaries)

    def rank(key: str):
        values = [_hparam(s, key) for s in summaries]
        distinct = len({json.dumps(v, sort_keys=True) for v in values})
        return (distinct < 2, any(v is None for v in values), not distinct < n, -distinct, key)

    keys = hparam_keys(summaries)
    return min(keys, key=rank) if keys else None


def group_runs(sources: list[RunSource], by: GroupBy) -> dict[str, list[str]]:
    """{group: [run names]}, groups in order of their first run."""
    out: dict[str, list[str]] = {}
    for s in sources:
        out.setdefault(group_of(s.name, s.summary, by), []).append(s.name)
    return out


@dataclass
class Band:
    """One group's metric: the mean line and the band (lo, hi) around it, at the drawn steps."""
    group: str
    metric: str
    runs: list[str]
    x: np.ndarray
    mean: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    step: np.ndarray
    n_runs: np.ndarray  # how many runs reported each drawn step
    n_total: int


@dataclass
class GroupData:
    x_axis: str
    metrics: list[str]
    band: str
    bands: list[Band] = field(default_factory=list)

    def drawn_metrics(self) -> list[str]:
        have = {b.metric for b in self.bands}
        return [m for m in self.metrics if m in have]


def _long(frames: list[RunFrame], metric: str) -> pl.LazyFrame | None:
    parts = []
    for f in frames:
        if metric not in f.schema:
            continue
        col = f"{metric}__smoothed" if metric in f.weights else metric
        v = pl.col(col)
        parts.append(f.df.lazy().select("step", "__x", pl.when(v.is_finite()).then(v).alias("v")))
    return pl.concat(parts) if parts else None


def _aggregate(long: pl.LazyFrame) -> pl.DataFrame:
    return (
        long.filter(pl.col("v").is_not_null() & pl.col("__x").is_not_null())
        .group_by("step")
        .agg(pl.col("__x").mean().alias("x"), pl.col("v").mean().alias("mean"), pl.col("v").min().alias("min"),
             pl.col("v").max().alias("max"), pl.col("v").std(ddof=0).alias("std"), pl.len().alias("n"))
        .sort("step")
        .collect()
    )


def _band(group: str, metric: str, runs: list[str], agg: pl.DataFrame, *, band: str, max_points) -> Band:
    mean = agg["mean"].to_numpy()
    if band == "±std":
        std = agg["std"].fill_null(0.0).to_numpy()
        lo, hi = mean - std, mean + std
    else:
        lo, hi = agg["min"].to_numpy(), agg["max"].to_numpy()
    # The union of what each downsampling keeps: the band's edges keep their extremes too.
    idx = np.unique(np.concatenate([downsample_indices(a, max_points) for a in (mean, lo, hi)]))
    x, step, n = agg["x"].to_numpy(), agg["step"].to_numpy(), agg["n"].to_numpy()
    return Band(group, metric, runs, x[idx], mean[idx], lo[idx], hi[idx], step[idx], n[idx], len(agg))


def prepare_groups(
    runs: list[RunSource],
    metrics: list[str],
    by: GroupBy,
    *,
    band: str = BANDS[0],
    x_axis: str = "step",
    smoothing: float = 0.0,
    max_points: int | None = DEFAULT_POINTS,
    step_range: StepRange | None = None,
) -> GroupData:
    """Mean and band of each group of `runs` for each metric. On a time or tokens axis a step's x
    is the mean over the group's runs of that step's x."""
    check_view(x_axis=x_axis, smoothing=smoothing)
    if band not in BANDS:
        raise ValueError(f"band {band!r}: expected one of {', '.join(BANDS)}")
    frames = {f.src.name: f for f in run_frames(runs, metrics, x_axis=x_axis, smoothing=smoothing,
                                                step_range=step_range)}
    data = GroupData(x_axis, list(metrics), band)
    for group, names in group_runs(runs, by).items():
        members = [frames[n] for n in names]
        for m in metrics:
            long = _long(members, m)
            if long is None:
                continue
            agg = _aggregate(long)
            if not agg.is_empty():
                data.bands.append(_band(group, m, names, agg, band=band, max_points=max_points))
    return data
