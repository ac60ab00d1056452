"""Stragglers: ranks whose own work is persistently slower than the median rank's.

Step time cannot show a straggler under DDP: the other ranks wait for it inside the gradient
all-reduce, so every rank's step takes as long as the slowest one's, and "which rank was slowest"
is a coin toss. What differs is where the time goes. The slow rank spends it in its own work
(data loading, its forward, a user phase); the others spend it waiting in the phase that holds the
collective. So each rank's time in each own-work phase (every phase but the wait phases, which
hold collectives, and checkpoint/eval, accounted in goodput) is compared with the median rank's,
step by step, and a rank straggles where its excess stays above ``straggler_min_frac`` of the
median step time for blocks covering at least ``straggler_min_steps`` steps. A rank 0 that
evaluates, checkpoints or prints while the others wait makes the others wait in a wait phase: it
never makes them look slow. The cost is the excess summed over the episode: the seconds every
other rank waited.

The per (rank, attempt, block of steps) excesses come from perstep.per_step's one pass over
ranks.parquet, window by window.
"""

from __future__ import annotations

import polars as pl

from kforge_dash.ingest.findings.model import Finding, RunFacts, phase_name, steps_range


def straggler_findings(facts: RunFacts, blocks: pl.DataFrame) -> list[Finding]:
    """``blocks``: perstep.per_step's per (rank, attempt, block) excesses."""
    out = []
    for c in facts.phases.own:
        if blocks.height and f"{c}\0ex" in blocks.columns:
            out += _phase_findings(facts, blocks, c)
    return out


def _phase_findings(facts: RunFacts, blocks: pl.DataFrame, col: str) -> list[Finding]:
    opts = facts.opts
    slow = blocks.filter(pl.col(f"{col}\0ex") > opts.straggler_min_frac * pl.col("st")).sort("attempt", "_block", "rank")
    if slow.height == 0:
        return []
    # Episodes: runs of consecutive slow blocks of one attempt (whatever rank: two slow ranks of
    # one host are one finding), long enough to be persistent.
    episodes: list[dict] = []
    for row in slow.iter_rows(named=True):
        e = episodes[-1] if episodes else None
        if e and e["attempt"] == row["attempt"] and row["_block"] - e["block"] <= 1:
            e["block"] = row["_block"]
        else:
            e = {"attempt": row["attempt"], "block": row["_block"], "rows": []}
            episodes.append(e)
        e["rows"].append(row)
    out = []
    for e in episodes:
        rows = e["rows"]
        first, last = min(r["first"] for r in rows), max(r["last"] for r in rows)
        if last - first + 1 < opts.straggler_min_steps:
            continue
        ranks = tuple(sorted({r["rank"] for r in rows}))
        cost: dict[int, float] = {}  # per block the worst rank's excess: what the others waited
        for r in rows:
            cost[r["_block"]] = max(cost.get(r["_block"], 0.0), r[f"{col}\0cost"] or 0.0)
        waited = sum(cost.values())
        frac = sorted(r[f"{col}\0ex"] / r["st"] for r in rows if r["st"])[len(rows) // 2] if rows else None
        name = phase_name(col)
        hosts = facts.hosts_of(ranks, {e["attempt"]})
        where = f" on {', '.join(hosts)}" if hosts else ""
        who = f"Rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}{where}"
        out.append(Finding(
            kind="straggler", phase=name, metric=col, severity="warning", first_step=first, last_step=last,
            ranks=ranks, hosts=hosts, score=frac,
            message=(f"{who} straggled in its {name!r} phase at {steps_range(first, last)}: "
                     f"{100 * (frac or 0):.0f}% of a step longer than the median rank, so the other ranks waited "
                     f"{waited:.1f} s for it in all; look at that phase on that host."),
        ))
    return out
