"""Zoom that re-queries: a range dragged on a chart becomes a StepRange, which prepare_compare
re-reads from the full-resolution series (and downsamples again, for that range only).

The dashboard's chart element (views/chart.py) reports a plotly chart's box selection, not its
client-side zoom, so the charts' drag mode is a horizontal select.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kforge_dash.browse.series import StepRange


def _as_x(value, like: np.ndarray):
    """A box edge as sent by plotly (a number, or a date string on a time axis) in the series' x type."""
    if np.issubdtype(like.dtype, np.datetime64):
        return np.datetime64(str(value).replace(" ", "T")).astype(like.dtype)
    return float(value)


def step_range_from_box(drawn, x0, x1) -> StepRange | None:
    """The steps whose x lies in [x0, x1] on any drawn line (`drawn`: CompareData.series or
    GroupData.bands, each with x and step arrays); None when the box holds no point."""
    first, last = None, None
    for line in drawn:
        if len(line.x) == 0:
            continue
        try:
            a, b = sorted((_as_x(x0, line.x), _as_x(x1, line.x)))
        except (TypeError, ValueError):
            continue
        inside = line.step[(line.x >= a) & (line.x <= b)]
        if len(inside):
            lo, hi = int(inside.min()), int(inside.max())
            first = lo if first is None else min(first, lo)
            last = hi if last is None else max(last, hi)
    return None if first is None else StepRange(first, last)


def step_range_from_steps(x0, x1) -> StepRange | None:
    """On the step axis the box edges are steps already: the whole steps between them."""
    lo, hi = sorted((float(x0), float(x1)))
    first, last = math.ceil(lo), math.floor(hi)
    return StepRange(first, last) if first <= last else None


def zoom_from_inputs(first, last) -> StepRange | None:
    """The step-range inputs (either may be empty) as a StepRange, or None for the whole run."""
    if first is None and last is None:
        return None
    lo = -(2**62) if first is None else int(first)
    hi = 2**62 if last is None else int(last)
    return StepRange(lo, hi) if lo <= hi else None


# The largest integer a browser's number input holds exactly (and the bound Streamlit's inputs check).
MAX_STEP = 2**53 - 1


@dataclass(frozen=True)
class StepParam:
    """A From/To step read from the URL: the value to use (None: ignored) and a note when it was changed."""
    value: int | None
    note: str | None = None


def step_param(name: str, text: str) -> StepParam:
    """`?step_from=` / `?step_to=` as typed in a URL: an integer (also `1e6`) is kept, one beyond
    ±MAX_STEP (or ±inf) clamped to it, anything else (nan, words) ignored; each change says so."""
    shown = text if len(text) <= 24 else text[:20] + "…"
    try:
        value = int(text)
    except ValueError:
        try:
            f = float(text)
        except ValueError:
            f = math.nan
        if math.isnan(f) or (math.isfinite(f) and not f.is_integer()):
            return StepParam(None, f"{name}={shown} in the URL is not a step number: ignored")
        value = int(f) if math.isfinite(f) else (MAX_STEP + 1 if f > 0 else -MAX_STEP - 1)
    if abs(value) > MAX_STEP:
        clamped = MAX_STEP if value > 0 else -MAX_STEP
        return StepParam(clamped, f"{name}={shown} in the URL is beyond the largest step: read as {clamped:,}")
    return StepParam(value)
