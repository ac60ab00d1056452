"""The plotly charts an AppTest page drew with views/chart.py's element: their specs, in page order."""

from __future__ import annotations

import json


def chart_elements(at) -> list:
    """The page's chart elements (not the element that only loads plotly.js)."""
    return [e for e in at.get("bidi_component")
            if e.proto.component_name == "kforge_chart" and json.loads(e.proto.json).get("spec")]


def chart_spec(element) -> dict:
    """One chart element's plotly spec ({"data", "layout", "config"})."""
    return json.loads(json.loads(element.proto.json)["spec"])


def chart_specs(at) -> list[dict]:
    return [chart_spec(e) for e in chart_elements(at)]
