"""What the per-rank heatmap can show and how each is named: step time, a phase timer, or a column of
the recorder's GPU telemetry (docs/CONTRACT.md, ``hw/*``)."""

from __future__ import annotations

from kforge_dash import column_registry as reg
from kforge_record.schema import PHASE_PREFIX, PHASE_SUFFIX

# GPU telemetry by rank: where a throttled or hot GPU shows (the throttle-reasons bitmask has no mean).
HW_VIEWS = {c: (reg.label(c), reg.lookup(c).unit) for c in ("hw/sm_clock_mhz", "hw/gpu_temp_c", "hw/gpu_power_w",
                                                              "hw/gpu_util_pct")}  # (label, unit): the column registry's
# Where a healthy rank's value is the higher one: the median rank of a window is then the upper median
# (of two ranks the healthy one, so a throttled clock reads below 1x); times keep the lower median.
HIGH_IS_NORMAL = frozenset({"hw/sm_clock_mhz", "hw/gpu_util_pct"})


def phase_columns(columns) -> list[str]:
    return sorted(c for c in columns if c.startswith(PHASE_PREFIX) and c.endswith(PHASE_SUFFIX))


def phase_name(col: str) -> str:
    return col[len(PHASE_PREFIX):-len(PHASE_SUFFIX)]


def phase_label(col: str, *, waiting: bool = False) -> str:
    """A per-rank phase table's header: the registry's label and unit ("data phase (s)", "step time (s)"),
    "incl. waiting" inside the brackets for a phase that includes waiting in the collective."""
    entry = reg.lookup(col)
    return f"{entry.label} ({entry.unit}, incl. waiting)" if waiting else entry.titled


def metric_label(metric: str) -> tuple[str, str]:
    """(name, unit) of a per-rank metric, e.g. ("step time", "s"), ("data phase", "s"), ("SM clock", "MHz")."""
    entry = reg.lookup(metric)  # the column registry's words; a user scalar by its name
    return entry.label, entry.unit or ""


def median_rank(metric: str) -> str:
    """The quantile interpolation that picks a window's median rank for ``metric`` ("lower" or "higher")."""
    return "higher" if metric in HIGH_IS_NORMAL else "lower"


def view_metrics(columns) -> list[str]:
    """Step time, every phase timer, then the GPU telemetry the run recorded (in HW_VIEWS' order)."""
    return ["step_time_s", *phase_columns(columns), *(c for c in HW_VIEWS if c in columns)]
