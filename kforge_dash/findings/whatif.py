"""What-if: how long the run would have taken without its stragglers, and what each rank cost.

After ByteDance's what-if analysis of stragglers (OSDI '25, ByteDance-Seed/StragglerAnalysis): the
run is replayed in an ideal form and the slowdown is the difference; the slowdown a worker causes
is the replay with only that worker as it really was. Here the replay works on host phase timers,
step by step (perstep.per_step's facts):

- Ideal step: every rank's own-work phases (every phase but the wait, checkpoint and eval phases)
  take the median rank's time, phase by phase; a wait phase holds the collective plus the waiting
  for the slowest rank, and in the replay the waiting goes: each step's wait is the critical
  rank's (the one that waited least: the collective's own cost). So the step is shorter by the
  critical rank's own work over the sum of the per-phase medians (never by more than the step).
- ``saved_s`` = the sum of that over the kept steps inside the run's straggler findings (warning or
  error; 0 without one): the run without the stragglers it found, so a clean run's timer noise (about
  1 % of every step between two ranks) saves nothing and the saving agrees with the findings' costs;
  ``total_s`` = goodput's wall clock (else the summed step times) and ``without_stragglers_s`` = ``total_s - saved_s``.
- Each rank alone (``by_rank``): the replay where only that rank keeps its real own work: the
  step is longer by its time above the median rank's in each own-work phase, summed over the
  blocks of steps of the straggler findings that name it (0 s for a rank no finding names). Ranks
  whose slow steps coincide each get their own cost, so the costs may add up to more than ``saved_s``.
  Per host the rank ran on (a rank restarted elsewhere has an entry per
  host), every rank (0 s included: a known cost), the ``MAX_RANKS`` costliest, largest first.

Limits: host timers see what the host waited for; a fused phase that computes and communicates
(``fwd_bwd`` under DDP) is a wait phase, so a rank slow inside it shows only through the others'
waiting, not as own work: time phases around the collective to see it. Without wait phases the
critical rank is the slowest one, which under data parallelism is a coin toss.
"""

from __future__ import annotations

import polars as pl

from kforge_dash.findings.finding import RunFacts

MAX_RANKS = 1024  # by_rank's length bound (summary.json stays small; the hosts page sums these)
METHOD = ("replay step by step over the straggler findings' steps: own-work phases ({phases}) at the median "
          "rank's, the wait phases' waiting removed (each step's wait taken as the critical rank's, the shortest); "
          "per rank: its own work above the median "
          "rank's, summed over its findings' steps, the others at the median (host phase timers: what happens inside a fused "
          "phase that also communicates is not seen)")


def what_if(facts: RunFacts, med: pl.DataFrame, blocks: pl.DataFrame, good: dict | None, found=()) -> dict | None:
    """summary.json ``what_if``, or None when the run timed no own-work phase. ``found``: the run's findings;
    the replay removes the stragglers they found (warning or error), over their steps only."""
    own = [c for c in facts.phases.own if f"{c}\0med" in med.columns]
    if not own or "crit_own" not in med.columns or med.height == 0:
        return None
    total = good.get("total_s") if isinstance(good, dict) else None
    if total is None:
        total = facts.summary.get("wall_time_s")
    if total is None:
        return None
    spans = [f for f in found if f.kind == "straggler" and f.severity in ("warning", "error") and f.first_step is not None]
    ideal = pl.sum_horizontal([pl.col(f"{c}\0med") for c in own])
    saving = (pl.col("crit_own") - ideal).clip(lower_bound=0.0)
    if "crit_st" in med.columns:  # never more than the step, nothing from a step of unknown or non-positive time
        saving = pl.when(pl.col("crit_st") > 0).then(pl.min_horizontal(saving, pl.col("crit_st"))).otherwise(0.0)
    saved = 0.0
    if spans:
        inside = pl.any_horizontal([pl.col("step").is_between(f.first_step, f.last_step) for f in spans])
        kept = med.join(facts.steps.select("step"), on="step", how="semi").filter(inside)
        saved = float(kept.select(saving.fill_null(0.0).sum()).item() or 0.0)
    saved = min(max(saved, 0.0), float(total))
    return {"total_s": float(total), "without_stragglers_s": float(total) - saved, "saved_s": saved,
            "by_rank": _by_rank(facts, blocks, own, spans),
            "method": METHOD.format(phases=", ".join(_name(c) for c in own))}


def _name(col: str) -> str:
    return col[len("time/"):-2] if col.startswith("time/") and col.endswith("_s") else col


def _by_rank(facts: RunFacts, blocks: pl.DataFrame, own: list[str], spans) -> list[dict]:
    cols = [f"{c}\0cost" for c in own if f"{c}\0cost" in blocks.columns]
    if not blocks.height or not cols:
        return []
    # a rank's cost counts over the blocks of the straggler findings that name it: elsewhere it is noise (0 s)
    named = [pl.col("rank").is_in(list(f.ranks)) & (pl.col("last") >= f.first_step) & (pl.col("first") <= f.last_step)
             for f in spans]
    counted = pl.any_horizontal(named) if named else pl.lit(False)
    per = blocks.group_by("rank", "attempt").agg(
        pl.sum_horizontal([pl.col(c).fill_null(0.0) for c in cols]).filter(counted).sum().alias("c"))
    cost: dict[tuple[int, str | None], float] = {}
    for rank, attempt, c in per.iter_rows():
        key = (rank, facts.hosts.get((attempt, rank)))
        cost[key] = cost.get(key, 0.0) + max(c or 0.0, 0.0)
    ranked = sorted(cost.items(), key=lambda kv: (-kv[1], kv[0][0]))[:MAX_RANKS]
    return [{"rank": rank, "host": host, "cost_s": c} for (rank, host), c in ranked]
