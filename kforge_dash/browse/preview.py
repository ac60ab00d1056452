"""A static SVG drawing of a compare chart, shown while plotly.js is still loading.

On a session's first page the browser spends most of the time to the first chart fetching and
evaluating plotly.js (1.2 MB, views/chart.py; benchmarks/bench_dash_browser.py): the page's data is ready
long before. So the first page draws each chart twice: this SVG (lines, axes, title: a few tens of
kB, drawn by the browser at once) under the interactive plotly chart, which covers it once drawn.
No plotly here, no Streamlit: plain text out of the prepared series.
"""

from __future__ import annotations

import html
import math

import numpy as np

from kforge_dash import column_registry as reg
from kforge_dash.browse.overlap import identical_runs
from kforge_dash.browse.series import CompareData, downsample_indices

WIDTH, HEIGHT = 460, 360  # a chart cell at 1400 px (plotly: 360 px high); drawn as an image scaled to the cell
_LEFT, _RIGHT, _TOP, _BOTTOM = 56, 12, 40, 44
SVG_DASHES = {"dash": "6 4", "dot": "2 3", "dashdot": "6 3 2 3"}  # plotly dash -> SVG stroke-dasharray
POINTS = 400  # per line: about one per pixel column of a chart cell


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About `n` round numbers (1, 2 or 5 times a power of ten apart) covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo] if math.isfinite(lo) else []
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _label(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1e4 else f"{v / 1e3:.3g}k" if abs(v) < 1e6 else f"{v:.2g}"


def _numeric(x: np.ndarray) -> np.ndarray:
    """x as float: datetimes as seconds."""
    if np.issubdtype(x.dtype, np.datetime64):
        return x.astype("datetime64[us]").astype(np.int64) / 1e6
    return x.astype(np.float64, copy=False)


def preview_svg(data: CompareData, metric: str, colours: dict[str, str], dashes: dict[str, str] | None = None, *,
                log_y: bool = False, scale: float = 1.0) -> str | None:
    """The chart of `metric` as an SVG document (None when nothing is drawn): each run's faint raw
    and smoothed lines in its colour and dash, y and x ticks, the metric's title
    (its registry label, as the plotly chart's: figures.chart_title)."""
    lines = []
    for s in data.series:
        if s.metric != metric or len(s.y) == 0:
            continue
        x, y = _numeric(s.x), s.y * scale
        if log_y:
            y = np.where(y > 0, np.log10(np.where(y > 0, y, 1.0)), np.nan)
        keep = np.isfinite(x) & np.isfinite(y)
        x, y = x[keep], y[keep]
        if len(y):
            idx = downsample_indices(y, POINTS)
            lines.append((s, x[idx], y[idx]))
    if not lines:
        return None
    x_lo, x_hi = min(float(x.min()) for _, x, _ in lines), max(float(x.max()) for _, x, _ in lines)
    y_lo, y_hi = min(float(y.min()) for _, _, y in lines), max(float(y.max()) for _, _, y in lines)
    pad = (y_hi - y_lo) * 0.05 or abs(y_hi) * 0.05 or 1.0
    y_lo, y_hi = y_lo - pad, y_hi + pad
    x_hi = x_hi if x_hi > x_lo else x_lo + 1.0
    w, h = WIDTH - _LEFT - _RIGHT, HEIGHT - _TOP - _BOTTOM

    def px(v):
        return _LEFT + (v - x_lo) / (x_hi - x_lo) * w

    def py(v):
        return _TOP + (y_hi - v) / (y_hi - y_lo) * h

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" '
           'preserveAspectRatio="none" font-family="sans-serif" font-size="11" fill="#555">',
           f'<rect width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>',
           f'<text x="4" y="20" font-size="15" font-weight="bold" fill="#262730">{html.escape(reg.lookup(metric).titled)}</text>']
    for t in nice_ticks(y_lo, y_hi):
        label = _label(10 ** t) if log_y else _label(t)
        out.append(f'<line x1="{_LEFT}" x2="{WIDTH - _RIGHT}" y1="{py(t):.1f}" y2="{py(t):.1f}" stroke="#eee"/>'
                   f'<text x="{_LEFT - 6}" y="{py(t) + 4:.1f}" text-anchor="end">{label}</text>')
    if data.x_axis != "wall time":  # (a date axis keeps its labels for the interactive chart)
        for t in nice_ticks(x_lo, x_hi):
            out.append(f'<text x="{px(t):.1f}" y="{HEIGHT - _BOTTOM + 16}" text-anchor="middle">{_label(t)}</text>')
    same = identical_runs(data, metric)  # drawn dashed over the line they repeat, as on the plotly chart
    for s, x, y in lines:
        faint = s.kind == "raw" and any(o.run == s.run and o.kind == "smoothed" for o, _, _ in lines)
        own = (dashes or {}).get(s.run, "solid")
        dash = SVG_DASHES.get("dash" if own == "solid" and s.run in same else own)
        pts = " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(px(x), py(y)))
        out.append(f'<polyline points="{pts}" fill="none" stroke="{colours.get(s.run, "#0072B2")}" '
                   f'stroke-width="{1 if faint else 1.8}" stroke-opacity="{0.3 if faint else 1}"'
                   + (f' stroke-dasharray="{dash}"' if dash else "") + "/>")
    out.append("</svg>")
    return "".join(out)
