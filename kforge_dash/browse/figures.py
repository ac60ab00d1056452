"""Plotly figures from prepared data, and the spec plotly.js draws of each (the dashboard's element, views/chart.py,
and kforge-report draw the same). No Streamlit here.

Lines are SVG scatter traces (not WebGL): about 1,000 points per series draw fast in SVG and
render in any browser. WebGL (scattergl) was measured and rejected: headless Chromium without a GPU
draws it in software (SwiftShader), and the 7 landing charts took ~45 s instead of ~5 s under load.
"""

from __future__ import annotations

import html
import json
import math
import re

import numpy as np
import plotly.graph_objects as go

from kforge_dash import column_registry as reg
from kforge_dash.browse.groups import GroupData
from kforge_dash.browse.overlap import identical_runs
from kforge_dash.browse.ranks import Heatmap
from kforge_dash.browse.series import X_LABELS, CompareData
from kforge_dash.text import counted

_MARKER_SYMBOL = {"nan": "x", "inf": "triangle-up", "-inf": "triangle-down", "restart": "diamond", "spike": "star"}
_LAYOUT = dict(margin=dict(l=10, r=10, t=40, b=10), height=360, hovermode="closest",
               legend=dict(orientation="h", yanchor="top", y=-0.22, x=0))
GIB = 2**30
IMAGE_FORMATS = ("png", "svg")
TEMPLATE = "plotly_white"  # white with light grid lines, as Streamlit's theme drew the charts
BASIC_TRACES = frozenset({"scatter", "bar", "pie"})  # the trace types of plotly.js-basic-dist-min


def text(s) -> str:
    """A name from disk as plotly text: plotly reads <b>, <a href> and entities in names and titles,
    so every one is escaped (plotly turns the entities back into the characters)."""
    return html.escape(str(s), quote=True)


def _unit(metric: str) -> tuple[float, str, str]:
    """(scale, y tick format, hover format) a person reads: MFU in %, memory in GiB."""
    if metric == "mfu":
        return 1.0, ".1%", ".2%"
    if metric.startswith("mem_") and metric.endswith("_bytes"):
        return 1.0 / GIB, "", ".4g"
    return 1.0, "", ".8g"


def chart_title(metric: str) -> str:
    """A chart's title: the column registry's label with its unit ("step time (s)", "tokens/s"; a user
    scalar by its name), as the run page's charts and the per-rank views name the same column."""
    return reg.lookup(metric).titled


def _axis_title(metric: str) -> str:
    """The y axis: the registry's unit ("s", "GiB", "tokens/s"); none where the ticks show it (MFU in %)."""
    if _unit(metric)[1].endswith("%"):
        return ""
    unit = reg.lookup(metric).unit
    if unit is None and not reg.known(metric) and metric.endswith("_s"):
        return "s"  # a user scalar timed in seconds (its name says so)
    return unit or ""


def figure_spec(fig: go.Figure, name: str) -> dict:
    """{"data", "layout", "config"} of `fig` as plotly.js draws it, on TEMPLATE; `name` names a saved image."""
    import plotly.io

    fig.update_layout(template=TEMPLATE)
    spec = json.loads(plotly.io.to_json(fig, validate=False))
    return {"data": spec["data"], "layout": spec["layout"], "config": {**chart_config(name), "responsive": True}}


def bundle_for(spec: dict) -> str:
    """"basic" when plotly.js-basic-dist-min draws every trace of the spec, else "full"."""
    return "basic" if all(t.get("type", "scatter") in BASIC_TRACES for t in spec["data"]) else "full"


def chart_config(metric: str, *, image_format: str = "png") -> dict:
    """plotly's own modebar: the camera button saves the chart as PNG or SVG under the metric's name."""
    if image_format not in IMAGE_FORMATS:
        raise ValueError(f"image format {image_format!r}: expected one of {', '.join(IMAGE_FORMATS)}")
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", metric).strip("_") or "chart"
    return {"displaylogo": False, "toImageButtonOptions": {"format": image_format, "filename": f"kforge-{name}", "scale": 2}}


def _finish(fig: go.Figure, metric: str, x_axis: str, *, log_y: bool, select_zoom: bool) -> go.Figure:
    _, tick, _ = _unit(metric)
    # Unified hover: every run's value at the x under the pointer, not only the nearest run's.
    fig.update_layout(title=dict(text=text(chart_title(metric)), x=0), xaxis_title=X_LABELS[x_axis],
                      **{**_LAYOUT, "hovermode": "x unified"})
    fig.update_yaxes(tickformat=tick or None, title_text=_axis_title(metric) or None)
    if select_zoom:  # a drag selects a step range, which the app re-reads at full resolution
        fig.update_layout(dragmode="select", selectdirection="h")
    if log_y:
        fig.update_yaxes(type="log")
    flat = flat_y_range(fig, log_y=log_y)
    if flat is not None:
        fig.update_yaxes(range=flat)
    return fig


FLAT_REL = 1e-6  # a series whose values differ by less than this share of their size is drawn as flat
FLAT_PAD = 0.1  # a flat line's y axis: its value ± this share


def flat_y_range(fig: go.Figure, *, log_y: bool = False) -> list[float] | None:
    """The y range for a chart whose lines are (near) constant, around their value (v × [0.9, 1.1]);
    None otherwise, or for a line at 0, where plotly's own range is right. plotly pads a flat line
    by ±1 whatever its size, so lr = 1e-3 would sit on an axis from -1 to 1 and read as 0."""
    ys = [np.asarray(t.y, dtype=np.float64) for t in fig.data if t.y is not None and len(t.y)]
    ys = [y[np.isfinite(y)] for y in ys]
    ys = [y for y in ys if len(y)]
    if not ys:
        return None
    lo, hi = min(float(y.min()) for y in ys), max(float(y.max()) for y in ys)
    mid = (lo + hi) / 2
    if mid == 0.0 or hi - lo > FLAT_REL * abs(mid):
        return None
    a, b = sorted((mid * (1 - FLAT_PAD), mid * (1 + FLAT_PAD)))
    if log_y:
        return [math.log10(a), math.log10(b)] if a > 0 else None
    return [a, b]


def _dash(run: str, dashes: dict[str, str] | None, same: dict[str, str]) -> str:
    """A run's dash pattern; a run whose line equals an earlier run's is dashed over it, so both show."""
    own = (dashes or {}).get(run, "solid")
    return "dash" if own == "solid" and run in same else own


def metric_figure(data: CompareData, metric: str, colours: dict[str, str], *, log_y: bool = False,
                  select_zoom: bool = False, dashes: dict[str, str] | None = None, legend: bool = True) -> go.Figure:
    """One chart: every run's raw (faint when smoothed) and smoothed line, plus markers.

    Hover shows the run, the exact step and the value (MFU in %, memory in GiB); a marker's hover
    starts with its run's name. `dashes` (run -> plotly dash) tells apart runs sharing a colour;
    `legend=False` leaves the legend to the page (the dashboard has one legend per page).
    """
    fig = go.Figure()
    same = identical_runs(data, metric)
    scale, _, fmt = _unit(metric)
    smoothed = {s.run for s in data.series if s.metric == metric and s.kind == "smoothed"}
    on_steps = data.x_axis == "step"
    show_x = "" if on_steps else f" · {X_LABELS[data.x_axis]} %{{x}}"
    for s in data.series:
        if s.metric != metric:
            continue
        faint = s.kind == "raw" and s.run in smoothed
        y = s.y * scale if scale != 1.0 else s.y
        custom, hover = _hover_data(s, scale, fmt, show_x)
        fig.add_trace(go.Scatter(
            x=_compact(s.x), y=y, customdata=custom,
            mode="lines", name=text(s.run), legendgroup=text(s.run), showlegend=not faint,
            opacity=0.3 if faint else 1.0, connectgaps=False,
            line=dict(color=colours.get(s.run), width=1 if faint else 1.8, dash=_dash(s.run, dashes, same)),
            # One hover row per run: a smoothed line's row has its raw value beside; the faint raw line has none.
            hoverinfo="skip" if faint else None,
            hovertemplate=None if faint else hover,
        ))
    for b in data.branches:  # the steps a restart superseded: faint, leaving the kept line where it went back to
        if b.metric == metric:
            fig.add_trace(go.Scatter(
                x=_compact(b.x), y=b.y * scale if scale != 1.0 else b.y, customdata=b.step, mode="lines",
                name=text(f"{b.run}: superseded"), legendgroup=text(b.run), showlegend=False, opacity=0.35,
                line=dict(color=colours.get(b.run), width=1, dash="dot"),
                hovertemplate=f"{text(b.run)} · {text(b.text)}: %{{y:{fmt}}} (step %{{customdata}})<extra></extra>"))
    for m in data.markers:
        if m.metric != metric:
            continue
        fig.add_trace(go.Scatter(
            x=m.x, y=m.y * scale if scale != 1.0 else m.y, customdata=m.step, text=[text(f"{m.run}: {t}") for t in m.text],
            mode="markers", legendgroup=text(m.run), name=text(f"{m.run}: {m.kind}"), showlegend=False,
            marker=dict(symbol=_MARKER_SYMBOL.get(m.kind, "circle"), size=11, color=colours.get(m.run),
                        line=dict(width=1.5, color="black")),
            hovertemplate="%{text}",
        ))
        if m.kind == "restart":
            for x in m.x:
                # named as the run's legendgroup: the report's run list hides it with the run's traces
                fig.add_vline(x=x, line=dict(color=colours.get(m.run), dash="dot", width=1), name=text(m.run))
    if not legend:
        fig.update_layout(showlegend=False)
    return _finish(fig, metric, data.x_axis, log_y=log_y, select_zoom=select_zoom)


def _hover_data(s, scale: float, fmt: str, show_x: str):
    """(customdata, hovertemplate) of a line: "1.234 (smoothed; raw 1.301) · step 120" or "1.301 (raw) · step
    120"; customdata holds the step off the step axis (show_x: the x shown beside it), then the raw value
    beside a smoothed line. On the step axis x is the step: no second copy of it (a third of each chart's bytes)."""
    cols = ([_compact(s.step)] if show_x else []) + ([] if s.raw is None else [s.raw * scale if scale != 1.0 else s.raw])
    step = "%{x}" if not show_x else "%{customdata}" if s.raw is None else "%{customdata[0]}"
    if s.raw is None:
        return (cols[0] if cols else None), f"%{{y:{fmt}}} ({s.kind}) · step {step}{show_x}"
    raw = f"%{{customdata[{len(cols) - 1}]:{fmt}}}"
    return np.column_stack(cols), f"%{{y:{fmt}}} ({s.kind}; raw {raw}) · step {step}{show_x}"


def _compact(a):
    """Integer steps as int32 when they fit (half the bytes sent to the browser); anything else as it is."""
    if getattr(a, "dtype", None) is not None and a.dtype.kind == "i" and len(a) and -(2**31) < a.min() and a.max() < 2**31:
        return a.astype("int32")
    return a


def _rgba(colour: str, alpha: float) -> str:
    c = colour.lstrip("#")
    if len(c) != 6:
        return colour
    r, g, b = (int(c[i:i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


def group_figure(data: GroupData, metric: str, colours: dict[str, str], *, log_y: bool = False,
                 select_zoom: bool = False, dashes: dict[str, str] | None = None, legend: bool = True) -> go.Figure:
    """One chart: each group's mean line over its band (min–max or ±std of the group's runs);
    `dashes` and `legend` as in metric_figure."""
    fig = go.Figure()
    scale, _, fmt = _unit(metric)
    for b in data.bands:
        if b.metric != metric:
            continue
        colour, name = colours.get(b.group, "#1f77b4"), text(f"{b.group} ({counted(len(b.runs), 'run')})")
        fig.add_trace(go.Scatter(x=b.x, y=b.lo * scale, mode="lines", line=dict(width=0), showlegend=False,
                                 legendgroup=name, hoverinfo="skip", name=name))
        fig.add_trace(go.Scatter(x=b.x, y=b.hi * scale, mode="lines", line=dict(width=0), fill="tonexty",
                                 fillcolor=_rgba(colour, 0.2), showlegend=False, legendgroup=name,
                                 hoverinfo="skip", name=f"{name} band"))
        fig.add_trace(go.Scatter(
            x=b.x, y=b.mean * scale, customdata=list(zip(b.step.tolist(), (b.lo * scale).tolist(),
                                                         (b.hi * scale).tolist(), b.n_runs.tolist())),
            mode="lines", name=name, legendgroup=name, line=dict(color=colour, width=1.8, dash=(dashes or {}).get(b.group)),
            hovertemplate=f"mean %{{y:{fmt}}} [%{{customdata[1]:{fmt}}}, %{{customdata[2]:{fmt}}}]"
                          " of %{customdata[3]} runs · step %{customdata[0]}",
        ))
    if not legend:
        fig.update_layout(showlegend=False)
    return _finish(fig, metric, data.x_axis, log_y=log_y, select_zoom=select_zoom)


# The relative heatmap colours log2(ratio to the median rank), clipped to 0.5x-4x: a log scale puts 2x
# as far above 1x as 0.5x is below it, and the clip keeps one extreme window (a 230x data stall) from
# stretching the scale until a steady 1.4x straggler is the colour of every other rank. Diverging at
# 1x: the median rank is near white, slower ranks red (1.25x already salmon), faster ones blue.
RATIO_RANGE = (0.5, 4.0)
_RATIO_TICKS = (0.5, 0.75, 1, 1.25, 1.5, 2, 3, 4)
_RATIO_COLOURS = ((0.5, "#2166ac"), (0.75, "#92c5de"), (1.0, "#f7f7f7"), (1.25, "#f4a582"), (1.5, "#d6604d"),
                  (2.0, "#b2182b"), (4.0, "#67001f"))


def _log2_ratio(v: float | None) -> float | None:
    lo, hi = RATIO_RANGE
    return None if v is None else math.log2(min(max(v, lo), hi))


def _ratio_text(v: float) -> str:
    return f"{'≤' if v == RATIO_RANGE[0] else '≥' if v == RATIO_RANGE[1] else ''}{v:g}×"


def heatmap_figure(h: Heatmap) -> go.Figure:
    seconds = h.seconds if h.seconds is not None else h.z
    custom = [[[f"{a}–{b}", "" if s is None else f"{s:.4g}"] for a, b, s in zip(h.window_start, h.window_end, row)]
              for row in seconds]
    if h.relative:
        lo, hi = (math.log2(v) for v in RATIO_RANGE)
        colours = dict(z=[[_log2_ratio(v) for v in row] for row in h.z], zmin=lo, zmax=hi,
                       colorscale=[((math.log2(r) - lo) / (hi - lo), c) for r, c in _RATIO_COLOURS],
                       colorbar=dict(title=text(h.value), tickvals=[math.log2(t) for t in _RATIO_TICKS],
                                     ticktext=[_ratio_text(t) for t in _RATIO_TICKS]),
                       text=[["" if v is None else f"{v:.3g}×" for v in row] for row in h.z],
                       hovertemplate="rank %{y}<br>steps %{customdata[0]}<br>%{text} the median rank"
                                     f" (%{{customdata[1]}} {h.unit})<extra></extra>")
    else:
        colours = dict(z=h.z, colorscale="Viridis", colorbar=dict(title=text(h.value)),
                       hovertemplate=f"rank %{{y}}<br>steps %{{customdata[0]}}<br>%{{z:.6g}} {h.unit}<extra></extra>")
    fig = go.Figure(go.Heatmap(x=h.window_start, y=h.ranks, customdata=custom, hoverongaps=False, **colours))
    fig.update_layout(xaxis_title="step window (first step)", yaxis_title="rank", **_LAYOUT)
    fig.update_yaxes(autorange="reversed", dtick=1 if len(h.ranks) <= 32 else None)
    return fig


def bar_figure(x, y, *, x_title: str, y_title: str, title: str) -> go.Figure:
    fig = go.Figure(go.Bar(x=x, y=y, hovertemplate=f"{x_title} %{{x}}<br>{y_title}: %{{y:.8g}}<extra></extra>"))
    fig.update_layout(title=dict(text=title, x=0), xaxis_title=x_title, yaxis_title=y_title, **_LAYOUT)
    fig.update_xaxes(dtick=1 if len(x) <= 32 else None)  # ranks are integers
    return fig


def phase_figure(breakdown) -> go.Figure:
    """Stacked areas of mean seconds per step of each phase over step windows."""
    fig = go.Figure()
    for phase in breakdown["phase"].unique(maintain_order=True).to_list():
        part = breakdown.filter(breakdown["phase"] == phase).sort("window_start")
        fig.add_trace(go.Scatter(
            x=part["window_start"].to_list(), y=part["seconds"].to_list(), name=text(phase), stackgroup="phases",
            mode="lines", hovertemplate="%{fullData.name}<br>window from step %{x}<br>%{y:.6g} s/step<extra></extra>",
        ))
    fig.update_layout(title=dict(text="phase time per step", x=0), xaxis_title="step", yaxis_title="s", **_LAYOUT)
    return fig


_COLORS = ("#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3")  # plotly's own, one per launch
_SEGMENT_PATTERN = {"kept": "", "recomputed": "/", "unrecorded": ".", "rolled back": "\\"}
_SEGMENT_TEXT = {"kept": "steps {a}–{b} recorded and kept", "recomputed": "steps {a}–{b} run again by a later launch",
                 "unrecorded": "steps {a}–{b} trained, not recorded (its heartbeat)",
                 "rolled back": "steps {a}–{b} rolled back in its own process and run again"}


def timeline_figure(timeline, rollbacks=()) -> go.Figure:
    """Each attempt (launch) as a bar over the steps it ran, up to the step its heartbeat reached: the steps it
    kept, those a later launch ran again, those it trained but never recorded and those it rolled back in its
    own process (``rollbacks``: summary ``restarts`` entries) marked (launch_segments)."""
    from kforge_dash.browse.launch_segments import launch_segments

    fig = go.Figure()
    started = {r["attempt"]: r["start_time"] for r in timeline.iter_rows(named=True)}
    shown: set[str] = set()
    for seg in launch_segments(timeline, rollbacks):
        label = f"attempt {seg.attempt}"
        fig.add_trace(go.Bar(
            y=[label], x=[seg.last - seg.first + 1], base=[seg.first], orientation="h",
            name=seg.kind, legendgroup=seg.kind, showlegend=seg.kind not in shown,
            marker=dict(color=_COLORS[seg.attempt % len(_COLORS)], pattern=dict(shape=_SEGMENT_PATTERN[seg.kind])),
            opacity=1.0 if seg.kind == "kept" else 0.55,
            hovertemplate=f"{label}: {_SEGMENT_TEXT[seg.kind].format(a=seg.first, b=seg.last)}"
                          f"<br>started {started.get(seg.attempt)}<extra></extra>",
        ))
        shown.add(seg.kind)
    fig.update_layout(title=dict(text="attempts (launches) over steps", x=0), xaxis_title="step",
                      barmode="overlay", **{**_LAYOUT, "height": 200 + 30 * len(timeline)})
    return fig
