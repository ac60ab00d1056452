"""Plotly figures of the findings and goodput (data from kforge_dash.browse.findings). No Streamlit."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kforge_dash import column_registry as reg
from kforge_dash import text
from kforge_dash.browse.figures import text as plotly_text
from kforge_dash.browse.findings import Waterfall

_LABELS = {m: reg.lookup(m).titled for m in ("loss", "grad_norm", "step_time_s")}  # "step time (s)"
_LAYOUT = dict(margin=dict(l=10, r=10, t=40, b=10), height=340, hovermode="closest")


def waterfall_figure(w: Waterfall) -> go.Figure:
    """Wall clock -> each badput bucket -> productive time (Google's goodput buckets)."""
    frac = "" if w.fraction is None else f": {text.percent(w.fraction)} goodput"
    fig = go.Figure(go.Waterfall(
        x=w.labels, y=w.values, measure=w.measures, textposition="outside",
        text=[text.duration(abs(v)) for v in w.values],
        hovertemplate="%{x}: %{text}<extra></extra>",
        decreasing=dict(marker=dict(color="#d62728")), totals=dict(marker=dict(color="#2ca02c")),
        increasing=dict(marker=dict(color="#7f7f7f")),
    ))
    fig.update_layout(title=dict(text=f"where the job's wall clock went{frac}", x=0), yaxis_title="s", showlegend=False,
                      **_LAYOUT)
    return fig


def mfu_waterfall_figure(w: Waterfall) -> go.Figure:
    """Peak (1.0) -> each goodput bucket's share of the wall clock -> below peak -> achieved MFU."""
    fig = go.Figure(go.Waterfall(
        x=[plotly_text(label) for label in w.labels], y=w.values, measure=w.measures, textposition="outside",  # keys from disk
        text=[text.percent(abs(v)) for v in w.values], hovertemplate="%{x}: %{text}<extra></extra>",
        decreasing=dict(marker=dict(color="#d62728")), totals=dict(marker=dict(color="#2ca02c")),
        increasing=dict(marker=dict(color="#7f7f7f")),
    ))
    title = f"where the MFU went: {reg.ACHIEVED_MFU} {text.percent(w.fraction)}"  # (over the job wall clock)
    fig.update_layout(title=dict(text=title, x=0),
                      yaxis=dict(title="share of peak", tickformat=".0%"), showlegend=False, **_LAYOUT)
    return fig


def focus_figure(df, first: int, last: int) -> go.Figure:
    """Loss, grad norm and step time around a finding's steps, the steps shaded."""
    metrics = [m for m in ("loss", "grad_norm", "step_time_s") if m in df.columns]
    fig = make_subplots(rows=len(metrics), cols=1, shared_xaxes=True, vertical_spacing=0.04)
    for i, m in enumerate(metrics, start=1):
        fig.add_trace(go.Scatter(x=df["step"].to_list(), y=df[m].to_list(), mode="lines+markers", name=_LABELS[m],
                                 hovertemplate=f"step %{{x}}<br>{_LABELS[m]}: %{{y:.8g}}<extra></extra>"), row=i, col=1)
        fig.update_yaxes(title_text=_LABELS[m], row=i, col=1)
        fig.add_vrect(x0=first - 0.5, x1=last + 0.5, fillcolor="#ff7f0e", opacity=0.15, line_width=0, row=i, col=1)
    fig.update_layout(title=dict(text=text.step_range(first, last), x=0), showlegend=False,
                      **{**_LAYOUT, "height": 160 * max(1, len(metrics)) + 60})
    fig.update_xaxes(title_text="step", row=len(metrics), col=1)
    return fig
