"""Which of a run's what-if costs (summary.json ``what_if``, ingest/findings/whatif.py) a finding or the clock
supports: what the what-if sentence says (browse/diagnosis.py: CLI screen, run page, report) and what the hosts
across runs add up (ingest/hosts.py). Plain functions on summary.json dicts.

A clean rank differs from the median rank by timer noise, about 1 % of each sample run: "rank 0 alone cost
0.4 s" would name a rank no finding supports, and summed over many runs that noise would rank hosts by how
many runs they took part in. So a cost is supported where a ``straggler`` finding names the rank, or where it
is material: at least MATERIAL_FRAC of the run's wall clock and at least MATERIAL_S.
"""

from __future__ import annotations

import math

# Clean sample runs (2 ranks, no straggler) come out at 0.8-1.1 % of their wall clock from timer noise; the
# planted straggler runs at 10-21 %.
MATERIAL_FRAC = 0.05
MATERIAL_S = 1.0


def material(seconds, total_s) -> bool:
    """Worth a sentence: at least MATERIAL_FRAC of the run's wall clock and at least MATERIAL_S."""
    ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in (seconds, total_s))
    return ok and seconds >= MATERIAL_S and seconds >= MATERIAL_FRAC * total_s


def _straggler_ranks(summary: dict) -> set:
    return {r for f in summary.get("findings") or [] if isinstance(f, dict) and f.get("kind") == "straggler"
            for r in f.get("ranks") or []}


def costly_ranks(summary: dict) -> list[dict]:
    """``what_if.by_rank``'s entries a finding or the clock supports, largest first: the rank has a
    ``straggler`` finding in the run, or it alone cost a material share (``material``). A clean run's
    ranks differ by noise (about 1 % of a run on the sample runs): naming one as costly would be noise."""
    w = summary.get("what_if")
    if not isinstance(w, dict) or not isinstance(w.get("by_rank"), list):
        return []
    named = _straggler_ranks(summary)
    return [e for e in w["by_rank"] if isinstance(e, dict) and isinstance(e.get("cost_s"), (int, float))
            and (e.get("rank") in named or material(e["cost_s"], w.get("total_s")))]


def worth_saying(summary: dict) -> bool:
    """The what-if sentence is shown when the run has a straggler finding or its saving is material."""
    w = summary.get("what_if")
    if not isinstance(w, dict) or not isinstance(w.get("total_s"), (int, float)) \
            or not isinstance(w.get("without_stragglers_s"), (int, float)):
        return False
    return bool(_straggler_ranks(summary)) or material(w.get("saved_s"), w["total_s"])
