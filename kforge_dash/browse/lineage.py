"""A run's lineage: the segments of its timeline (launches and in-process rollbacks) and the steps each
restart superseded, drawn faint as a branch leaving the kept line (docs/restarts.md "Lineage").

The superseded steps come from ``RUN/ingested/superseded.parquet`` (kforge_dash/ingest/lineage/rollbacks.py; ``tag``
is the steps.parquet column) and, for an imported run, from kforge-import's ``RUN/imported/superseded.parquet``
(the same format; its tags mapped to columns by ``source.json``; its purged points only).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from kforge_dash.contract import SUPERSEDED_FILE
from kforge_record.regular_file import open_regular

WHY = ("relaunch", "kill", "rollback", "overlap")  # summary restarts[].why
IMPORTED_DIR = "imported"  # kforge-import's RUN/imported/ (kforge_dash/importers/shards.py)


@dataclass(frozen=True)
class Branch:
    """The steps one restart superseded, for one metric: drawn from the kept point it left at."""

    run: str
    metric: str
    x: np.ndarray  # the kept line's point at the step before the resume first, then the superseded steps
    y: np.ndarray
    step: np.ndarray
    text: str  # what superseded them (hover)


IMPORTED_REASONS = ("purge_step", "out_of_order")  # kforge-import's restarts (not its repeated_step points)


def _read(path: Path) -> pl.DataFrame | None:
    if not path.is_file():
        return None
    try:
        return pl.read_parquet(path, glob=False)
    except (pl.exceptions.PolarsError, OSError):
        return None  # the charts stand without it


def _imported(run_dir: Path) -> pl.DataFrame | None:
    """kforge-import's superseded points (RUN/imported/), their tags as the columns source.json maps them to."""
    df = _read(run_dir / IMPORTED_DIR / SUPERSEDED_FILE)
    if df is None or not df.height:
        return None
    try:
        with open_regular(run_dir / IMPORTED_DIR / "source.json") as f:
            columns = json.load(f).get("columns") or {}
    except (OSError, ValueError, AttributeError):
        return None
    return (df.filter(pl.col("reason").is_in(IMPORTED_REASONS) & pl.col("tag").is_in(list(columns)))
            .with_columns(pl.col("tag").replace_strict(columns, default=None), attempt=pl.lit(0, pl.Int64)))


def read_superseded(steps_path: str | Path, metrics: list[str]) -> pl.DataFrame | None:
    """The superseded points of ``metrics``: ingest's beside ``steps_path``, and an imported run's
    (None: none, or unreadable files)."""
    steps_path = Path(steps_path)
    cols = ["tag", "step", "time", "value", "reason", "superseded_at_step", "attempt"]
    got = [df.select(*cols, pl.col("previous_last_step") if "previous_last_step" in df.columns
                     else pl.lit(None, pl.Int64).alias("previous_last_step"))  # one branch per restart (imports: none)
           for df in (_read(steps_path.with_name(SUPERSEDED_FILE)), _imported(steps_path.parent.parent))
           if df is not None and set(cols) <= set(df.columns)]
    df = pl.concat(got, how="vertical_relaxed").filter(pl.col("tag").is_in(metrics)) if got else None
    return df if df is not None and df.height else None


def _x(axis: str, steps: np.ndarray, times: np.ndarray, start: float | None):
    if axis == "step":
        return steps
    if axis == "wall time":
        return (times * 1e6).round().astype("int64").astype("datetime64[us]")
    if axis == "time since start" and start is not None:
        return times - start
    return None  # tokens: the superseded steps have no place on the kept line's token count


def branches(name: str, steps_path, summary: dict, metrics: list[str], kept: pl.DataFrame, axis: str,
             step_range=None) -> list[Branch]:
    """Each metric's superseded branches of one run. ``kept``: the run's full-resolution frame (step,
    ``__x`` and the metrics: series.RunFrame.df), whose point at the step before each resume the branch
    starts from."""
    sup = read_superseded(steps_path, metrics)
    if sup is None:
        return []
    starts = [a.get("start_time") for a in summary.get("attempts") or [] if a.get("start_time") is not None]
    start = min(starts) if starts else None  # series.run_start_time (which imports this module)
    out = []
    keys = ("tag", "superseded_at_step", "attempt", "reason", "previous_last_step")
    for (metric, at, attempt, reason, prev), g in sup.sort("step").group_by(*keys, maintain_order=True):
        if step_range is not None:
            g = g.filter(pl.col("step").is_between(step_range.first, step_range.last))
        x = _x(axis, g["step"].to_numpy(), g["time"].to_numpy(), start)
        if x is None or not g.height or metric not in kept.columns:
            continue
        step, y = g["step"].to_numpy(), g["value"].to_numpy()
        anchor = kept.filter((pl.col("step") < at) & pl.col(metric).is_not_null()).tail(1)
        if anchor.height:  # the branch leaves the kept line where it was rolled back to
            step = np.r_[anchor["step"].to_numpy(), step]
            y = np.r_[anchor[metric].cast(pl.Float64).to_numpy(), y]
            x = np.r_[anchor["__x"].to_numpy().astype(x.dtype) if axis != "step" else anchor["step"].to_numpy(), x]
        out.append(Branch(name, metric, x, y, step, _hover(summary, at, attempt, reason, prev)))
    return out


def _hover(summary: dict, at: int, attempt, reason, prev: int | None) -> str:
    """What superseded a branch, in a few words (one hover row beside the runs' rows): the rollback in its
    launch, or the launch that resumed at ``at``."""
    restarts = summary.get("restarts") or []
    if reason == "rollback":
        return (f"superseded by its rollback to step {at}" + (f" from {prev}" if prev is not None else "")
                + f" (launch {attempt})")
    if reason in IMPORTED_REASONS:
        return f"purged by its tracker at step {at} ({reason})"
    r = next((r for r in restarts if not r.get("in_process") and r.get("resumed_at_step") == at), None)
    if r is None:
        return f"launch {attempt}, superseded ({reason})"
    return f"launch {attempt}, superseded by launch {r.get('attempt')} ({r.get('why') or 'relaunch'})"


LINEAGE_COLUMNS = {"segment": pl.String, "first_step": pl.Int64, "last_step": pl.Int64, "resumed_from": pl.Int64,
                   "superseded_steps": pl.Int64, "wall_lost_s": pl.Float64, "why": pl.String}


def lineage_table(summary: dict) -> pl.DataFrame:
    """One row per segment of the run's timeline: a launch, or the part of a launch after a rollback in it
    (steps, the step it resumed from, the steps it ran again, the wall time lost and why it began)."""
    goodput = summary.get("goodput") if isinstance(summary.get("goodput"), dict) else {}
    per = {a.get("attempt"): a for a in goodput.get("per_attempt") or []}
    restarts = summary.get("restarts") or []
    rows = []
    for a in summary.get("attempts") or []:
        k = a.get("attempt")
        if a.get("first_step") is None:
            continue
        relaunch = next((r for r in restarts if r.get("attempt") == k and not r.get("in_process")), None)
        cuts = sorted((r for r in restarts if r.get("attempt") == k and r.get("in_process")),
                      key=lambda r: (r.get("time") or 0.0, r["resumed_at_step"]))
        last = a.get("last_step")
        begins = [(a.get("first_step"), relaunch, f"launch {k}")] + [
            (r["resumed_at_step"], r, f"launch {k}, rollback {i + 1}") for i, r in enumerate(cuts)]
        for i, (first, r, label) in enumerate(begins):
            ends = cuts[i]["previous_last_step"] if i < len(cuts) else last
            rows.append({"segment": label, "first_step": first, "last_step": ends,
                         "resumed_from": None if r is None else r["resumed_at_step"] - 1,
                         "superseded_steps": None if r is None else r.get("superseded_steps"),
                         "wall_lost_s": _lost(r, per, k, restarts), "why": None if r is None else r.get("why") or "relaunch"})
    return pl.DataFrame(rows, schema=LINEAGE_COLUMNS)


def _lost(r: dict | None, per: dict, k, restarts: list) -> float | None:
    """Wall time a restart cost: a rollback's wasted progress; a relaunch's downtime before it and the
    wasted progress of the launch before it (goodput; less that launch's own rollbacks')."""
    if r is None:
        return None
    if r.get("in_process"):
        return r.get("wasted_s")
    mine, before = per.get(k), per.get(k - 1) if isinstance(k, int) else None
    if mine is None:
        return None
    lost = mine.get("downtime_before_s") or 0.0
    if before is not None:
        own = sum(x.get("wasted_s") or 0.0 for x in restarts if x.get("in_process") and x.get("attempt") == k - 1)
        lost += (before.get("shutdown_s") or 0.0) + (before.get("buckets") or {}).get("wasted_progress", 0.0) - own
    return lost
