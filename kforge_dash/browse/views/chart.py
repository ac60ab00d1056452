"""Every plotly chart of the dashboard, drawn by kforge's own element with a plotly.js kforge ships.

st.plotly_chart makes the browser fetch and evaluate Streamlit's 4.7 MB plotly chunk (all of plotly.js,
one ~0.9 s task of the main thread) before the first chart. This element (st.components.v2, in the page's
own DOM, no iframe) loads the registry's `plotly.js-basic-dist-min` instead (scatter, bar, pie: 1.19 MB,
evaluated in ~0.2 s) for a figure of those traces only, and plotly's own full plotly.min.js (the plotly
package's, served from where it is installed) for any other; both are served by Streamlit's component
route from disk, never fetched from the network. The figure is drawn as kforge-report draws it
(figures.figure_spec: the same white template, the same config); under a dark theme (light page text) the
element draws it on a transparent background in the page's text colour.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path

import plotly
import streamlit as st
import streamlit.components.v1 as components_v1
import streamlit.components.v2 as components_v2

from kforge_dash.browse import figures as prep_figures

_BASIC = components_v1.declare_component("plotlyjs", path=str(Path(__file__).parents[1] / "plotlyjs"))
_FULL = components_v1.declare_component("plotlyjs_full", path=str(Path(plotly.__file__).parent / "package_data"))

# Each figure is drawn once its bundle has loaded; charts that were waiting for it are drawn one per frame,
# so the first is painted before the next is drawn. A selection box (dragmode "select") is reported as
# the trigger `selection`, {"box": [{"x": [x0, x1]}]} as st.plotly_chart reports one. A chart follows its
# cell's width (a sidebar opened or closed; plotly's `responsive` follows only the window's). The bundles'
# URLs are relative to the page (/compare, or under a server.baseUrlPath).
_JS = r"""
const W = window.__kforgePlotly = window.__kforgePlotly || {bundles: {}, turn: Promise.resolve()};
function bundle(src) {
  if (!W.bundles[src]) {
    W.bundles[src] = new Promise(function (ok, fail) {
      const s = document.createElement("script");
      s.src = src; s.async = true;
      s.onload = function () { ok(window.Plotly); };
      s.onerror = fail;
      document.head.appendChild(s);
    });
  }
  return W.bundles[src];
}
// Under a dark theme (the page's text is light) the white template's backgrounds go transparent and its text
// and grid lines take the page's colours; the element is drawn again when the theme changes.
function themed(layout, el) {
  const fg = getComputedStyle(el).color, m = fg.match(/[\d.]+/g);
  if (!m || 0.299 * m[0] + 0.587 * m[1] + 0.114 * m[2] < 128) { return layout; }
  const grid = "rgba(250, 250, 250, 0.15)", L = Object.assign({}, layout, {
    paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)", font: Object.assign({}, layout.font, {color: fg}),
    modebar: Object.assign({bgcolor: "rgba(0,0,0,0)", color: grid, activecolor: fg}, layout.modebar)});
  Object.keys(L).concat(["xaxis", "yaxis"]).forEach(function (k) {
    if (/^[xy]axis[0-9]*$/.test(k)) { L[k] = Object.assign({}, L[k], {gridcolor: grid, zerolinecolor: grid, linecolor: grid}); }
  });
  return L;
}
export default function (c) {
  const d = c.data, el = c.parentElement;
  if (!d.spec) { bundle(d.src); return; }
  let gd = el.querySelector(":scope > .kforge-chart");
  if (!gd) {
    gd = document.createElement("div");
    gd.className = "kforge-chart";
    el.appendChild(gd);
  }
  gd.__kforgeElement = c;  // the latest mount's (a new key, after a zoom, may reuse this node)
  const spec = JSON.parse(d.spec);
  bundle(W.bundles[d.full] ? d.full : d.src).then(function (P) {
    W.turn = W.turn.then(function () {
      if (gd.__kforgeGone) { return; }  // unmounted before its turn came
      if (gd.__kforgePlotly && gd.__kforgePlotly !== P) { gd.__kforgePlotly.purge(gd); }
      gd.__kforgePlotly = P;
      return P.react(gd, spec.data, themed(spec.layout, el), spec.config).then(function () {
        if (d.select && !gd.__kforgeSelect) {
          gd.__kforgeSelect = true;
          gd.on("plotly_selected", function (ev) {
            const x = ev && ev.range && ev.range.x;
            if (x) { gd.__kforgeElement.setTriggerValue("selection", {box: [{x: x}]}); }
          });
        }
      }).then(function () {
        if (window.ResizeObserver && !gd.__kforgeResize && !gd.__kforgeGone) {
          let w = gd.clientWidth;
          gd.__kforgeResize = new ResizeObserver(function () {
            if (gd.clientWidth !== w && gd.clientWidth > 0) { w = gd.clientWidth; gd.__kforgePlotly.Plots.resize(gd); }
          });
          gd.__kforgeResize.observe(gd);
        }
        // the next chart once this one is painted
        return new Promise(function (r) { requestAnimationFrame(function () { setTimeout(r, 0); }); });
      });
    });
  }, function () {
    gd.textContent = "plotly.js could not be loaded from " + new URL(d.src, document.baseURI) + ": chart not drawn.";
  });
  // Called when the element unmounts (a zoom's new key, another page): plotly's window resize listener
  // and the observer would keep the old chart alive (8 zoom rounds: JS heap 23 -> 97 MB, 105 listeners).
  return function () {
    if (gd.__kforgeElement !== c) { return; }  // a later mount draws on this node now
    gd.__kforgeGone = true;
    if (gd.__kforgeResize) { gd.__kforgeResize.disconnect(); gd.__kforgeResize = null; }
    if (gd.__kforgePlotly) { gd.__kforgePlotly.purge(gd); }
    gd.remove();
  };
}
"""
_ELEMENT = components_v2.component("kforge_chart", js=_JS, isolate_styles=False)


@dataclass(frozen=True)
class Drawn:
    """What a chart reports: the x range of a box dragged on it (None when none)."""
    box_x: tuple | None


def _srcs() -> tuple[str, str]:
    """The URLs of the basic and the full bundle."""
    return f"component/{_BASIC.name}/plotly-basic.min.js", f"component/{_FULL.name}/plotly.min.js"


def chart(slot, fig, *, key: str, name: str = "chart", config: dict | None = None, select: bool = False) -> Drawn:
    """Draw `fig` in `slot` (st, a column or a container); its place is reserved at the figure's height."""
    spec = prep_figures.figure_spec(fig, name)
    if config is not None:
        spec["config"] = {**config, "responsive": True}
    height = int(spec["layout"].get("height") or 450)
    basic, full = _srcs()
    data = {"spec": json.dumps(spec), "src": basic if prep_figures.bundle_for(spec) == "basic" else full, "full": full,
            "select": select}
    with contextlib.nullcontext() if slot is st else slot:
        ev = _ELEMENT(key=key, data=data, height=height, on_selection_change=lambda: None)
    sel = (ev.get("selection") if ev else None) or {}
    box = sel.get("box") or []
    return Drawn(tuple(box[0]["x"]) if box and len(box[0].get("x") or []) == 2 else None)


def preload(slot) -> None:
    """Start loading the basic bundle before any chart (an element that draws nothing)."""
    with slot:
        _ELEMENT(key="plotlyjs-preload", data={"spec": None, "src": _srcs()[0]}, height=1)
