"""The Hosts page's data: the hosts of the runs under the root (kforge_dash/findings/host_table.py) and the
findings naming one host across runs. Plain functions, no Streamlit; names from disk stay text."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from kforge_dash.browse.runs import RunInfo
from kforge_dash.findings.host_table import host_table
from kforge_dash.run_view import FindingCard, finding_cards, findings_of

HOSTS_SCHEMA = {"host": pl.String, "runs": pl.Int64, "straggler_runs": pl.Int64, "throttle_runs": pl.Int64,
                "divergence_runs": pl.Int64, "cost_s": pl.Float64, "cost_runs": pl.Int64}
COST_FORMAT = "%.1f"  # cost (s) as the CLI screen prints it (host_lines: 38.4 s), not 38.3795


@dataclass(frozen=True)
class HostFinding:
    """One finding that names the host, in its run: the card as the run page shows it (message whole,
    ``card.focus`` the run page's ?focus= value of its steps)."""
    run: str
    card: FindingCard


def hosts_table(runs: list[RunInfo]) -> pl.DataFrame:
    """One row per host of the ingested runs, most costly first (cost_s null: unknown)."""
    rows = [{k: e[k] for k in HOSTS_SCHEMA} for e in host_table(r.summary for r in runs if r.ingested)]
    return pl.DataFrame(rows, schema=HOSTS_SCHEMA)


def host_findings(runs: list[RunInfo], host: str) -> list[HostFinding]:
    """Every finding that names ``host``, run by run (runs by name; in a run, most severe first)."""
    out = []
    for r in sorted((r for r in runs if r.ingested), key=lambda r: r.name):
        named = [f for f in findings_of(r.summary) if host in (f.get("hosts") or [])]
        out += [HostFinding(r.name, c) for c in finding_cards({"findings": named})]
    return out
