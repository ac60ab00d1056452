"""Which of a run's what-if costs (summary.json ``what_if``, findings/whatif.py) a finding supports, and
the materiality rule of findings: what the what-if sentence says (browse/diagnosis.py: CLI screen, run page,
report), what the hosts across runs add up (findings/host_table.py) and which findings are warnings (findings/__init__.py).

Materiality: a cost is material when it is at least MATERIAL_FRAC of the run's time and at least MATERIAL_S.
A straggler, data stall or slow episode under it is severity info (timer noise: a clean 2-rank run's ranks
differ by about 1 % of each step, in blocks of 0.1-0.4 s over a long run). The what-if is said, and a rank
named, only where a straggler finding (warning or error) supports it: its saving is counted over those
findings' steps only (whatif.py), so a clean run's noise names no rank and adds up to no host's cost.
"""

from __future__ import annotations

import math

# The straggler sample runs cost 10-21 % of their time; the clean ones' noise sums to 0.8-1.1 % over the whole
# run, and any one stretch of it to far less.
MATERIAL_FRAC = 0.01
MATERIAL_S = 1.0


def material(seconds, total_s) -> bool:
    """Worth a warning: at least MATERIAL_FRAC of the run's time and at least MATERIAL_S."""
    ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in (seconds, total_s))
    return ok and seconds >= MATERIAL_S and seconds >= MATERIAL_FRAC * total_s


def straggler_findings(summary: dict) -> list[dict]:
    """The run's straggler findings but the info ones (an immaterial straggler is info)."""
    return [f for f in summary.get("findings") or [] if isinstance(f, dict) and f.get("kind") == "straggler"
            and f.get("severity") != "info"]


def _straggler_ranks(summary: dict) -> set:
    return {r for f in straggler_findings(summary) for r in f.get("ranks") or []}


def costly_ranks(summary: dict) -> list[dict]:
    """``what_if.by_rank``'s entries a straggler finding (warning or error) names, with a positive cost,
    largest first. A clean run's ranks differ by noise: naming one as costly would be noise."""
    w = summary.get("what_if")
    if not isinstance(w, dict) or not isinstance(w.get("by_rank"), list):
        return []
    named = _straggler_ranks(summary)
    return [e for e in w["by_rank"] if isinstance(e, dict) and isinstance(e.get("cost_s"), (int, float))
            and e["cost_s"] > 0 and e.get("rank") in named]


def worth_saying(summary: dict) -> bool:
    """The what-if sentence is shown when the run has a straggler finding (warning or error) and its numbers."""
    w = summary.get("what_if")
    if not isinstance(w, dict) or not isinstance(w.get("total_s"), (int, float)) \
            or not isinstance(w.get("without_stragglers_s"), (int, float)):
        return False
    return bool(_straggler_ranks(summary))
