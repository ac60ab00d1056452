"""Plotly figures from prepared data. No Streamlit here: pages only pass figures to st.plotly_chart.

Lines are SVG scatter traces (not WebGL): about 2,000 points per series draw fast in SVG and
render in any browser, headless ones included.
"""

from __future__ import annotations

import plotly.graph_objects as go

from kforge_dash.browse.ranks import Heatmap
from kforge_dash.browse.series import X_LABELS, CompareData

_MARKER_SYMBOL = {"nan": "x", "inf": "triangle-up", "-inf": "triangle-down", "restart": "diamond", "spike": "star"}
_LAYOUT = dict(margin=dict(l=10, r=10, t=40, b=10), height=360, hovermode="closest",
               legend=dict(orientation="h", yanchor="top", y=-0.22, x=0))


def metric_figure(data: CompareData, metric: str, colours: dict[str, str], *, log_y: bool = False) -> go.Figure:
    """One chart: every run's raw (faint when smoothed) and smoothed line, plus markers.

    Hover shows the run, the exact step and the value to 8 significant digits.
    """
    fig = go.Figure()
    smoothed = {s.run for s in data.series if s.metric == metric and s.kind == "smoothed"}
    show_x = "" if data.x_axis == "step" else f"<br>{X_LABELS[data.x_axis]}: %{{x}}"
    for s in data.series:
        if s.metric != metric:
            continue
        faint = s.kind == "raw" and s.run in smoothed
        fig.add_trace(go.Scatter(
            x=s.x, y=s.y, customdata=s.step, mode="lines", name=s.run, legendgroup=s.run,
            showlegend=not faint, opacity=0.3 if faint else 1.0,
            line=dict(color=colours.get(s.run), width=1 if faint else 1.8),
            hovertemplate=f"<b>{s.run}</b> ({s.kind})<br>step %{{customdata}}{show_x}"
                          f"<br>{metric}: %{{y:.8g}}<extra></extra>",
        ))
    for m in data.markers:
        if m.metric != metric:
            continue
        fig.add_trace(go.Scatter(
            x=m.x, y=m.y, customdata=m.step, text=m.text, mode="markers", legendgroup=m.run,
            name=f"{m.run}: {m.kind}", showlegend=False,
            marker=dict(symbol=_MARKER_SYMBOL[m.kind], size=11, color=colours.get(m.run),
                        line=dict(width=1.5, color="black")),
            hovertemplate=f"<b>{m.run}</b><br>%{{text}}{show_x}<extra></extra>",
        ))
        if m.kind == "restart":
            for x in m.x:
                fig.add_vline(x=x, line=dict(color=colours.get(m.run), dash="dot", width=1))
    fig.update_layout(title=dict(text=metric, x=0), xaxis_title=X_LABELS[data.x_axis], **_LAYOUT)
    if log_y:
        fig.update_yaxes(type="log")
    return fig


def heatmap_figure(h: Heatmap) -> go.Figure:
    custom = [[f"{a}–{b}" for a, b in zip(h.window_start, h.window_end)] for _ in h.ranks]
    fig = go.Figure(go.Heatmap(
        z=h.z, x=h.window_start, y=h.ranks, customdata=custom, colorscale="Viridis",
        colorbar=dict(title=h.value), hoverongaps=False,
        hovertemplate="rank %{y}<br>steps %{customdata}<br>%{z:.6g}<extra></extra>",
    ))
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
            x=part["window_start"].to_list(), y=part["seconds"].to_list(), name=phase, stackgroup="phases",
            mode="lines", hovertemplate=f"{phase}<br>window from step %{{x}}<br>%{{y:.6g}} s/step<extra></extra>",
        ))
    fig.update_layout(title=dict(text="phase time per step", x=0), xaxis_title="step", yaxis_title="s", **_LAYOUT)
    return fig


def timeline_figure(timeline) -> go.Figure:
    """Each attempt (launch) as a bar over the steps it contributed."""
    fig = go.Figure()
    for row in timeline.iter_rows(named=True):
        if row["first_step"] is None or row["last_step"] is None:
            continue
        fig.add_trace(go.Bar(
            y=[f"attempt {row['attempt']}"], x=[row["last_step"] - row["first_step"] + 1], base=[row["first_step"]],
            orientation="h", name=f"attempt {row['attempt']}",
            hovertemplate=f"attempt {row['attempt']}: steps {row['first_step']}–{row['last_step']}"
                          f"<br>started {row['start_time']}<extra></extra>",
        ))
    fig.update_layout(title=dict(text="attempts (launches) over steps", x=0), xaxis_title="step",
                      barmode="overlay", **{**_LAYOUT, "height": 200 + 30 * len(timeline)})
    return fig
