"""Across runs: the hosts that keep doing it (straggling, throttling, costing time), from summary.json alone.

One entry per host seen in the runs' summaries (``host_ranks``, the hosts named by findings and by
``what_if.by_rank``): ``{host, runs, straggler_runs, throttle_runs, divergence_runs, cost_s, cost_runs}``.

- ``straggler_runs`` / ``throttle_runs`` / ``divergence_runs``: runs with a ``straggler`` / ``hw_throttle`` /
  ``replica_divergence`` finding naming it.
- ``cost_s``: the what-if seconds attributed to its ranks (``what_if.by_rank[].cost_s``), summed
  over the runs where that is known; ``cost_runs`` says over how many runs. Only the costs a straggler
  finding supports count (``straggler_costs.costly_ranks``); a clean rank's noise counts
  as 0. A run without a what-if (null, absent, an older ingest) or without an entry for the host adds
  nothing and does not count: unknown, not 0. ``cost_s`` is null when no run knows it.

Largest ``cost_s`` first (unknown last), then most straggler runs, throttle runs, runs, and by name.
Plain functions on dicts (no I/O): kforge-ingest --json, its screen and the dashboard's Hosts page.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from kforge_dash import text
from kforge_dash.ingest.straggler_costs import costly_ranks

STRAGGLER_KIND = "straggler"
THROTTLE_KIND = "hw_throttle"
DIVERGENCE_KIND = "replica_divergence"  # findings/replicas.py


def _hosts_named(items) -> set[str]:
    return {h for h in items if isinstance(h, str) and h}


def run_hosts(summary: dict) -> set[str]:
    """Every host a run's summary names: its ranks' hosts, its findings' and its what-if's."""
    out = set()
    for e in summary.get("host_ranks") or []:
        if isinstance(e, dict):
            out |= _hosts_named([e.get("host")])
    for f in summary.get("findings") or []:
        if isinstance(f, dict):
            out |= _hosts_named(f.get("hosts") or [])
    return out | set(_costs(summary))


def _costs(summary: dict) -> dict[str, float]:
    """host -> what-if seconds of its ranks in this run; hosts without a known cost absent. A rank's cost
    counts only where a straggler finding names it (straggler_costs.costly_ranks); the others'
    noise counts as a known 0, so a host is not ranked by how many runs it took part in."""
    w = summary.get("what_if")
    out: dict[str, float] = {}
    if not isinstance(w, dict) or not isinstance(w.get("by_rank"), list):
        return out
    costly = {id(e) for e in costly_ranks(summary)}
    for e in w["by_rank"]:
        if not isinstance(e, dict) or not _hosts_named([e.get("host")]):
            continue
        c = e.get("cost_s")
        if isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(c):
            out[e["host"]] = out.get(e["host"], 0.0) + (float(c) if id(e) in costly else 0.0)
    return out


def _named_by(summary: dict, kind: str) -> set[str]:
    """Hosts a finding of ``kind`` names; an info one (an immaterial straggler: timer noise) names none."""
    return {h for f in summary.get("findings") or [] if isinstance(f, dict) and f.get("kind") == kind
            and f.get("severity") != "info" for h in _hosts_named(f.get("hosts") or [])}


def host_table(summaries: Iterable[dict]) -> list[dict]:
    """The hosts of ``summaries`` (one per run), largest what-if cost first."""
    acc: dict[str, dict] = {}
    for s in summaries:
        if not isinstance(s, dict):
            continue
        stragglers, throttles, costs = _named_by(s, STRAGGLER_KIND), _named_by(s, THROTTLE_KIND), _costs(s)
        diverged = _named_by(s, DIVERGENCE_KIND)
        for h in run_hosts(s):
            e = acc.setdefault(h, {"host": h, "runs": 0, "straggler_runs": 0, "throttle_runs": 0, "divergence_runs": 0,
                                   "cost_s": None, "cost_runs": 0})
            e["runs"] += 1
            e["straggler_runs"] += h in stragglers
            e["throttle_runs"] += h in throttles
            e["divergence_runs"] += h in diverged
            if h in costs:
                e["cost_s"] = (e["cost_s"] or 0.0) + costs[h]
                e["cost_runs"] += 1
    return sorted(acc.values(), key=lambda e: (e["cost_s"] is None, -(e["cost_s"] or 0.0), -e["straggler_runs"],
                                               -e["throttle_runs"], -e["runs"], e["host"]))


def host_lines(hosts: list[dict], top: int = 5) -> list[str]:
    """The screen's few lines: the hosts that cost most (or straggled, throttled) across the runs."""
    if not hosts:
        return []
    lines = [f"hosts ({len(hosts)} across the runs; most costly first):"]
    for e in hosts[:top]:
        runs = text.counted(e["runs"], "run")
        cost = ("cost unknown" if e["cost_s"] is None
                else f"cost {text.duration(e['cost_s'])} (known in {e['cost_runs']} of its {runs})")
        diverged = f", replicas diverged in {e['divergence_runs']}" if e.get("divergence_runs") else ""
        lines.append(f"  {e['host']}: in {runs}, straggling in {e['straggler_runs']}, "
                     f"throttled in {e['throttle_runs']}{diverged}, {cost}")
    if len(hosts) > top:
        lines.append(f"  ... and {len(hosts) - top} more (--json)")
    return lines
