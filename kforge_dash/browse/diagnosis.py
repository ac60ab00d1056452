"""The run's what-if and MFU waterfall (summary.json), prepared for the run page. Plain functions, no Streamlit."""

from __future__ import annotations

from kforge_dash.browse.findings import Waterfall
from kforge_dash.ingest.findings.whatif import what_if_sentence


def what_if_text(summary: dict | None) -> str | None:
    """"Without its stragglers this run would have taken ... instead of ...; rank R (host) alone cost ...",
    as the run page and the report show it: only the first letter raised (a host name keeps its case)."""
    text = what_if_sentence((summary or {}).get("what_if"))
    return text[:1].upper() + text[1:] if text else None


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
    labels = ["peak"] + [k.replace("_", " ") for k, _ in lost] + ["achieved MFU"]
    values = [1.0] + [-v for _, v in lost] + [float(parts["achieved"])]
    return Waterfall(labels, values, ["absolute"] + ["relative"] * len(lost) + ["total"], float(parts["achieved"]))
