"""The run's MFU waterfall (summary.json), prepared for the run page (its what-if sentence: run_view.py). No Streamlit."""

from __future__ import annotations

from kforge_dash import column_registry as reg
from kforge_dash.browse.findings import Waterfall


def mfu_waterfall(summary: dict | None) -> Waterfall | None:
    """Peak (1.0), minus each non-empty goodput bucket's share of the wall clock (largest first), minus
    what productive time fell below peak, down to the achieved MFU. None without one."""
    m = (summary or {}).get("mfu_waterfall")
    parts = m.get("parts") if isinstance(m, dict) else None
    if not isinstance(parts, dict) or not isinstance(parts.get("achieved"), (int, float)):
        return None
    lost = sorted(((k, float(v)) for k, v in parts.items() if k not in ("achieved", "below_peak")
                   and isinstance(v, (int, float)) and v > 0), key=lambda kv: -kv[1])
    below = parts.get("below_peak")
    if isinstance(below, (int, float)) and below > 0:
        lost.append(("below_peak", float(below)))
    labels = ["peak"] + [k.replace("_", " ") for k, _ in lost] + [reg.ACHIEVED_MFU]
    values = [1.0] + [-v for _, v in lost] + [float(parts["achieved"])]
    return Waterfall(labels, values, ["absolute"] + ["relative"] * len(lost) + ["total"], float(parts["achieved"]))
