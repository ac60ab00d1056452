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

from kforge_dash import text
from kforge_dash.findings.finding import Finding, RunFacts, phase_name, steps_range


def straggler_findings(facts: RunFacts, blocks: pl.DataFrame, med: pl.DataFrame | None = None) -> list[Finding]:
    """``blocks``: perstep.per_step's per (rank, attempt, block) excesses; ``med``: its per-step rows (the
    median rank's phase times, to place an episode's first and last step within their blocks)."""
    out = []
    for c in facts.phases.own:
        if blocks.height and f"{c}\0ex" in blocks.columns:
            out += _phase_findings(facts, blocks, c, med)
    return out


def _episodes(slow: pl.DataFrame) -> list[dict]:
    """Runs of consecutive slow blocks of one attempt (whatever rank: two slow ranks of one host are one
    finding)."""
    episodes: list[dict] = []
    for row in slow.iter_rows(named=True):
        e = episodes[-1] if episodes else None
        if e and e["attempt"] == row["attempt"] and row["_block"] - e["block"] <= 1:
            e["block"] = row["_block"]
        else:
            e = {"attempt": row["attempt"], "first_block": row["_block"], "block": row["_block"], "rows": []}
            episodes.append(e)
        e["rows"].append(row)
    return episodes


def _across_restarts(episodes: list[dict], blocks: pl.DataFrame) -> list[dict]:
    """An episode that runs to its launch's last block and one of the same rank(s) that starts at the next
    launch's first block are one straggler (a slow rank, a slow loader, restarted with the job): merged."""
    span = {a: (lo, hi) for a, lo, hi in blocks.group_by("attempt").agg(
        pl.col("_block").min().alias("lo"), pl.col("_block").max().alias("hi")).iter_rows()}
    order = sorted(span)
    out: list[dict] = []
    for e in sorted(episodes, key=lambda e: (e["attempt"], e["first_block"])):
        p = out[-1] if out else None
        nxt = order[order.index(p["attempt"]) + 1] if p and order.index(p["attempt"]) + 1 < len(order) else None
        if (p is not None and e["attempt"] == nxt and p["block"] == span[p["attempt"]][1]
                and e["first_block"] == span[e["attempt"]][0]
                and {r["rank"] for r in p["rows"]} & {r["rank"] for r in e["rows"]}):
            p.update(attempt=e["attempt"], block=e["block"], rows=p["rows"] + e["rows"],
                     attempts=p.get("attempts", {p["attempt"]}) | {e["attempt"]})
        else:
            out.append(dict(e))
    return out


def _edge(facts: RunFacts, med: pl.DataFrame | None, col: str, ranks, attempt: int, lo: int, hi: int,
          first: bool) -> int | None:
    """The first (or last) step of [lo, hi] (an episode's first or last block) where one of ``ranks``' own
    time in ``col`` is over the median rank's by ``straggler_min_frac`` of the step time: the episode
    begins (ends) there, not at its block's edge (a straggler from step 151 is reported from 151, not 150)."""
    if med is None or f"{col}\0med" not in med.columns:
        return None
    st = facts.steps.select("step", pl.col("step_work_median_s").cast(pl.Float64).alias("_st"))
    slow = (pl.scan_parquet(facts.ranks_path, glob=False)
            .filter(pl.col("step").is_between(lo, hi) & pl.col("rank").is_in(list(ranks)) & (pl.col("attempt") == attempt))
            .select("step", pl.col(col).cast(pl.Float64).alias("_x")).collect()
            .join(med.select("step", pl.col(f"{col}\0med").alias("_m")), on="step", how="inner")
            .join(st, on="step", how="inner")
            .filter((pl.col("_st") > 0) & (pl.col("_x") - pl.col("_m") > facts.opts.straggler_min_frac * pl.col("_st"))))
    v = slow["step"].min() if first else slow["step"].max()
    return int(v) if v is not None else None


def _phase_findings(facts: RunFacts, blocks: pl.DataFrame, col: str, med: pl.DataFrame | None) -> list[Finding]:
    opts = facts.opts
    # a block whose step time is unknown or not positive has no "fraction of a step" (issue 32.4)
    slow = (blocks.filter((pl.col("st") > 0) & (pl.col(f"{col}\0ex") > opts.straggler_min_frac * pl.col("st")))
            .sort("attempt", "_block", "rank"))
    if slow.height == 0:
        return []
    out = []
    for e in _across_restarts(_episodes(slow), blocks):
        rows = e["rows"]
        first, last = min(r["first"] for r in rows), max(r["last"] for r in rows)
        if last - first + 1 < opts.straggler_min_steps:
            continue
        ranks = tuple(sorted({r["rank"] for r in rows}))
        attempts = e.get("attempts", {e["attempt"]})
        head = [r for r in rows if r["first"] == first]
        tail = [r for r in rows if r["last"] == last]
        first = _edge(facts, med, col, ranks, head[0]["attempt"], first, max(r["last"] for r in head), True) or first
        last = _edge(facts, med, col, ranks, tail[0]["attempt"], min(r["first"] for r in tail), last, False) or last
        cost: dict[tuple, float] = {}  # per block the worst rank's excess: what the others waited
        for r in rows:
            k = (r["attempt"], r["_block"])
            cost[k] = max(cost.get(k, 0.0), r[f"{col}\0cost"] or 0.0)
        waited = sum(cost.values())
        frac = sorted(r[f"{col}\0ex"] / r["st"] for r in rows)[len(rows) // 2]
        name = phase_name(col)
        hosts = facts.hosts_of(ranks, attempts)
        where = f" on {', '.join(hosts)}" if hosts else ""
        who = f"{text.rank_list(ranks).capitalize()}{where}"
        across = f" (across {len(attempts)} launches)" if len(attempts) > 1 else ""
        out.append(Finding(
            kind="straggler", phase=name, metric=col, severity="warning", first_step=first, last_step=last,
            ranks=ranks, hosts=hosts, score=frac, cost_s=waited,
            message=(f"{who} straggled in its {name!r} phase at {steps_range(first, last)}{across}: "
                     f"{text.percent(frac, 0)} of a step longer than the median rank, so the other ranks waited "
                     f"{text.duration(waited)} for it in all; look at that phase on that host."),
        ))
    return out
