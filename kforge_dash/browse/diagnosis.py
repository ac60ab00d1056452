"""The run's what-if and MFU waterfall (summary.json), prepared for the run page. Plain functions, no Streamlit."""

from __future__ import annotations

from kforge_dash import text
from kforge_dash.browse.findings import Waterfall
from kforge_dash.ingest import straggler_costs


def what_if_text(summary: dict | None) -> str | None:
    """"Without its stragglers this run would have taken 39.2 s instead of 49.9 s; rank 1 (vm) alone cost
    10.7 s", as the CLI screen, the run page and the report show it; durations as the run page's header
    (text.duration). None when there is nothing to say (straggler_costs.worth_saying: no straggler finding and
    no material saving); the rank is named only when a finding or the clock supports it (straggler_costs.costly_ranks)."""
    s = summary if isinstance(summary, dict) else {}
    if not straggler_costs.worth_saying(s):
        return None
    w = s["what_if"]
    out = (f"Without its stragglers this run would have taken {text.duration(w['without_stragglers_s'])} "
            f"instead of {text.duration(w['total_s'])}")
    top = (straggler_costs.costly_ranks(s) or [None])[0]
    if top is not None:
        host = f" ({top['host']})" if top.get("host") else ""
        out += f"; rank {top.get('rank')}{host} alone cost {text.duration(top['cost_s'])}"
    return out


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
