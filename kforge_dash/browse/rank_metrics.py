"""What the per-rank heatmap can show and how each is named: step time, a phase timer, or a column of
the recorder's GPU telemetry (docs/CONTRACT.md, ``hw/*``)."""

from __future__ import annotations

from kforge_record.schema import PHASE_PREFIX, PHASE_SUFFIX

# GPU telemetry by rank: where a throttled or hot GPU shows (the throttle-reasons bitmask has no mean).
HW_VIEWS = {"hw/sm_clock_mhz": ("SM clock", "MHz"), "hw/gpu_temp_c": ("GPU temperature", "°C"),
            "hw/gpu_power_w": ("GPU power", "W"), "hw/gpu_util_pct": ("GPU utilisation", "%")}
# Where a healthy rank's value is the higher one: the median rank of a window is then the upper median
# (of two ranks the healthy one, so a throttled clock reads below 1x); times keep the lower median.
HIGH_IS_NORMAL = frozenset({"hw/sm_clock_mhz", "hw/gpu_util_pct"})


def phase_columns(columns) -> list[str]:
    return sorted(c for c in columns if c.startswith(PHASE_PREFIX) and c.endswith(PHASE_SUFFIX))


def phase_name(col: str) -> str:
    return col[len(PHASE_PREFIX):-len(PHASE_SUFFIX)]


def metric_label(metric: str) -> tuple[str, str]:
    """(name, unit) of a per-rank metric, e.g. ("step time", "s"), ("data phase", "s"), ("SM clock", "MHz")."""
    if metric in HW_VIEWS:
        return HW_VIEWS[metric]
    if metric == "step_time_s":
        return "step time", "s"
    if metric.startswith(PHASE_PREFIX) and metric.endswith(PHASE_SUFFIX):
        return f"{phase_name(metric)} phase", "s"
    return metric, ""


def median_rank(metric: str) -> str:
    """The quantile interpolation that picks a window's median rank for ``metric`` ("lower" or "higher")."""
    return "higher" if metric in HIGH_IS_NORMAL else "lower"


def view_metrics(columns) -> list[str]:
    """Step time, every phase timer, then the GPU telemetry the run recorded (in HW_VIEWS' order)."""
    return ["step_time_s", *phase_columns(columns), *(c for c in HW_VIEWS if c in columns)]
