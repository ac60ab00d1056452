"""The Hosts page's data: the hosts of the runs under the root (kforge_dash/ingest/hosts.py) and the
findings naming one host across runs. Plain functions, no Streamlit; names from disk stay text."""

from __future__ import annotations

import urllib.parse

import polars as pl

from kforge_dash.browse.findings import findings_of, focus_link
from kforge_dash.browse.runs import RunInfo
from kforge_dash.ingest.hosts import host_table

HOSTS_SCHEMA = {"host": pl.String, "runs": pl.Int64, "straggler_runs": pl.Int64, "throttle_runs": pl.Int64,
                "cost_s": pl.Float64, "cost_runs": pl.Int64, "findings": pl.String}
FINDINGS_SCHEMA = {"run": pl.String, "severity": pl.String, "kind": pl.String, "steps": pl.String, "ranks": pl.String,
                   "message": pl.String, "open": pl.String}


def host_link(host: str) -> str:
    """The Hosts page's URL (relative) that lists ``host``'s findings."""
    return "hosts?" + urllib.parse.urlencode({"host": host})


def hosts_table(runs: list[RunInfo]) -> pl.DataFrame:
    """One row per host of the ingested runs, most costly first (cost_s null: unknown)."""
    rows = [dict(e, findings=host_link(e["host"])) for e in host_table(r.summary for r in runs if r.ingested)]
    return pl.DataFrame(rows, schema=HOSTS_SCHEMA)


def host_findings(runs: list[RunInfo], host: str) -> pl.DataFrame:
    """Every finding that names ``host``, run by run (runs by name), each with its run-detail link."""
    rows = []
    for r in sorted((r for r in runs if r.ingested), key=lambda r: r.name):
        for f in findings_of(r.summary):
            if host not in (f.get("hosts") or []):
                continue
            first, last = f.get("first_step"), f.get("last_step")
            rows.append({"run": r.name, "severity": f.get("severity"), "kind": f.get("kind"),
                         "steps": None if first is None else (str(first) if first == last else f"{first}–{last}"),
                         "ranks": ", ".join(str(x) for x in f.get("ranks") or []) or None,
                         "message": f.get("message"), "open": focus_link(r.name, first, last)})
    return pl.DataFrame(rows, schema=FINDINGS_SCHEMA)
