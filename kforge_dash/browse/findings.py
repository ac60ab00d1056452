"""The findings and goodput of summary.json, prepared for the dashboard. Plain functions, no Streamlit.

Text in a finding (its message, hosts) comes from disk and is shown as text, never rendered.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from kforge_dash import column_registry as reg
from kforge_dash.browse.ranks import _reading
from kforge_dash.run_view import findings_of

_PAD = 20  # steps shown either side of a finding's steps


def focus_options(summary: dict | None) -> list[str]:
    """The findings' steps as "FIRST-LAST" (what ?focus= holds), most severe first, each once."""
    out: dict[str, None] = {}
    for f in findings_of(summary):
        first, last = f.get("first_step"), f.get("last_step")
        if isinstance(first, int):
            out[f"{first}-{last if isinstance(last, int) else first}"] = None
    return list(out)


def parse_focus(value: str | None) -> tuple[int, int] | None:
    """``"151-162"`` -> (151, 162); anything else (from a URL) -> None."""
    try:
        a, b = (int(x) for x in str(value).split("-", 1))
    except (TypeError, ValueError):
        return None
    return (min(a, b), max(a, b))


# Streamlit Markdown badges per known severity (the text is ours, never a string from disk).
SEVERITY_BADGE = {"error": ":red-badge[error]", "warning": ":orange-badge[warning]", "info": ":blue-badge[info]"}


@dataclass(frozen=True)
class Waterfall:
    labels: list[str]
    values: list[float]  # seconds: the total, then each bucket as a negative step, then productive
    measures: list[str]  # plotly's "absolute" / "relative" / "total"
    fraction: float | None


def goodput_waterfall(summary: dict | None) -> Waterfall | None:
    """The job's wall clock (column_registry.JOB_WALL_CLOCK), minus each non-empty badput bucket (largest
    first), down to productive."""
    g = (summary or {}).get("goodput")
    if not isinstance(g, dict) or not isinstance(g.get("total_s"), (int, float)):
        return None
    buckets = sorted(((k, float(v)) for k, v in (g.get("buckets") or {}).items()
                      if isinstance(v, (int, float)) and v > 0), key=lambda kv: -kv[1])
    labels = [reg.JOB_WALL_CLOCK] + [k.replace("_", " ") for k, _ in buckets] + ["productive"]
    values = [float(g["total_s"])] + [-v for _, v in buckets] + [float(g.get("productive_s") or 0.0)]
    measures = ["absolute"] + ["relative"] * len(buckets) + ["total"]
    return Waterfall(labels, values, measures, g.get("fraction"))


def default_rank_metric(summary: dict | None, metrics: list[str]) -> str | None:
    """The per-rank view where the worst straggler shows: its phase timer (under DDP every rank
    shares one step time, so step time would show nothing), unless a throttled GPU on its ranks
    during its steps explains it (the straggler's ``cause``): then, as without a straggler, where the
    throttled GPU shows (its SM clock); None: keep the usual default."""
    found = findings_of(summary)
    throttles = [f for f in found if f.get("kind") == "hw_throttle" and f.get("metric") in metrics]
    for f in found:
        if f.get("kind") == "straggler" and f.get("metric") in metrics:
            cause = next((t for t in throttles if _overlap(t, f)), None)
            return (cause or f)["metric"]
    return throttles[0]["metric"] if throttles else None


def _overlap(a: dict, b: dict) -> bool:
    """Two findings on a rank in common, their steps overlapping."""
    steps = [a.get("first_step"), a.get("last_step"), b.get("first_step"), b.get("last_step")]
    if not all(isinstance(x, int) for x in steps) or not set(a.get("ranks") or []) & set(b.get("ranks") or []):
        return False
    return steps[0] <= steps[3] and steps[2] <= steps[1]


def focus_steps(steps_path: str | Path, first: int, last: int, *, pad: int = _PAD) -> pl.DataFrame:
    """The steps around ``first..last``: step, loss, grad_norm, step time and slowest rank."""
    def read(path):
        lf = pl.scan_parquet(path, glob=False)
        have = lf.collect_schema().names()
        cols = [c for c in ("step", "loss", "grad_norm", "lr", "step_time_s", "slowest_rank", "attempt") if c in have]
        return lf.filter(pl.col("step").is_between(first - pad, last + pad)).select(cols).sort("step").collect()

    return _reading(Path(steps_path), read)


def spike_spans(summary: dict | None, metric: str) -> list[tuple[int, int, str]]:
    """(first step, last step, message) of each loss/grad-norm spike finding on ``metric``: the
    compare charts' ★ goes at the raw peak within those steps."""
    out = []
    for f in findings_of(summary):
        first, last = f.get("first_step"), f.get("last_step")
        if f.get("kind") in ("loss_spike", "grad_norm_spike") and f.get("metric") == metric and isinstance(first, int):
            out.append((first, last if isinstance(last, int) and last >= first else first, str(f.get("message"))))
    return out
