"""Findings along a launch's timeline: memory growth, data stalls, restarts (slow episodes: episodes.py)."""

from __future__ import annotations

import polars as pl

from kforge_dash import text
from kforge_dash.findings.finding import Finding, RunFacts, phase_name, steps_range


def _stretches(flags: pl.DataFrame, min_steps: int) -> list[tuple[int, int]]:
    """(first, last) step of each run of consecutive flagged rows covering >= min_steps steps."""
    runs = (flags.with_columns((pl.col("flag") != pl.col("flag").shift(1)).fill_null(True).cum_sum().alias("_run"))
            .filter("flag").group_by("_run").agg(pl.col("step").min().alias("a"), pl.col("step").max().alias("b"))
            .sort("a"))
    return [(a, b) for a, b in runs.select("a", "b").iter_rows() if b - a + 1 >= min_steps]


def _snap(s: pl.DataFrame, a: int, b: int) -> tuple[int, int]:
    """A centred rolling median's stretch [a, b] moved onto the steps themselves (column ``raw``:
    the step is past the threshold): each end goes to the nearest such step inside, then outward
    over the adjacent ones, so a shift at step 100 is reported from step 100."""
    inside = s.filter(pl.col("step").is_between(a, b) & pl.col("raw"))["step"]
    if inside.len() == 0:
        return a, b
    a, b = inside.min(), inside.max()
    steps, raw = s["step"].to_list(), s["raw"].to_list()
    i, j = steps.index(a), steps.index(b)
    while i > 0 and raw[i - 1]:
        i -= 1
    while j < len(steps) - 1 and raw[j + 1]:
        j += 1
    return steps[i], steps[j]


def memory_findings(facts: RunFacts) -> list[Finding]:
    """Allocated memory creeping up over a launch (a leak: tensors kept alive, a growing cache)."""
    out = []
    if "mem_allocated_bytes" not in facts.steps.columns:
        return out
    lf = pl.scan_parquet(facts.ranks_path, glob=False)
    if "mem_allocated_bytes" not in lf.collect_schema():
        return out
    lf = lf.filter(pl.col("mem_allocated_bytes").is_not_null())
    for att in facts.steps["attempt"].unique().sort().to_list():
        span = facts.steps.filter(pl.col("attempt") == att)["step"]
        lo, hi = span.min(), span.max()
        if hi is None or hi - lo < 20:
            continue
        n = hi - lo + 1
        early = (lo + n // 10, lo + n // 4)  # past the first steps' allocations (optimizer state)
        late = (hi - n // 10, hi)
        # Only the rows of the two stretches: a tenth and a sixth of the launch's, not all of them.
        per = (lf.filter((pl.col("attempt") == att) & (pl.col("step").is_between(*early) | pl.col("step").is_between(*late)))
               .group_by("rank").agg(
            pl.col("mem_allocated_bytes").filter(pl.col("step").is_between(*early)).median().alias("early"),
            pl.col("mem_allocated_bytes").filter(pl.col("step").is_between(*late)).median().alias("late"),
        ).filter(pl.col("early") > 0).with_columns(g=pl.col("late") / pl.col("early") - 1)
               .collect(engine="streaming"))  # streaming: bounded memory however long the run
        grown = per.filter(pl.col("g") > facts.opts.memory_growth_frac).sort("rank")
        if grown.height == 0:
            continue
        ranks = tuple(grown["rank"].to_list())
        g = grown["g"].max()
        worst = grown.sort("g", descending=True).row(0, named=True)
        out.append(Finding(
            kind="memory_growth", metric="mem_allocated_bytes", severity="warning", first_step=early[0], last_step=hi,
            ranks=ranks, hosts=facts.hosts_of(ranks, {att}), score=g,
            message=(f"Allocated memory grew {text.percent(g, 0)} over {steps_range(early[0], hi)} on "
                     f"{text.rank_list([worst['rank']])} ({text.gib(worst['early'])} -> {text.gib(worst['late'])}; "
                     f"{text.counted(len(ranks), 'rank')} grew): look for tensors kept across steps "
                     "(losses summed without .item()/.detach(), growing caches)."),
        ))
    return out


def data_stall_findings(facts: RunFacts, med: pl.DataFrame) -> list[Finding]:
    """The median rank's data phase takes over ``data_stall_frac`` of the step for a stretch:
    every rank waits for input (a slow loader everywhere, not one straggler)."""
    if not facts.phases.data or med.height == 0:
        return []
    opts = facts.opts
    # Only steps whose time and data phase are known: a NaN, zero or negative step time has no share (no
    # "nan%" or "inf%" of a step); analyse_run warned about the non-positive ones.
    s = (facts.steps.select("step", "step_time_s").join(med.select("step", "data_med"), on="step", how="inner")
         .filter(pl.col("step_time_s").is_finite() & (pl.col("step_time_s") > 0)
                 & pl.col("data_med").is_finite() & (pl.col("data_med") >= 0)))
    if s.height == 0:
        return []
    s = s.with_columns(share=(pl.col("data_med") / pl.col("step_time_s")))
    w = opts.stall_window
    s = s.with_columns(r=pl.col("share").rolling_median(window_size=w, min_samples=w // 2, center=True),
                       raw=pl.col("share") > opts.data_stall_frac)
    out = []
    for a, b in _stretches(s.with_columns(flag=(pl.col("r") > opts.data_stall_frac).fill_null(False)),
                           opts.stall_min_steps):
        a, b = _snap(s, a, b)
        part = s.filter(pl.col("step").is_between(a, b))
        share = part["share"].median()
        lost = float(part["data_med"].sum())
        names = ", ".join(repr(phase_name(c)) for c in facts.phases.data)
        out.append(Finding(
            kind="data_stall", phase=phase_name(facts.phases.data[0]), metric=facts.phases.data[0], severity="warning",
            first_step=a, last_step=b, ranks=facts.ranks_of(), hosts=facts.hosts_of(facts.ranks_of()), score=share,
            cost_s=lost,
            message=(f"The data phase ({names}) took {text.percent(share, 0)} of each step at {steps_range(a, b)} on the "
                     f"median rank ({text.duration(lost)} in all): add loader workers or prefetch."),
        ))
    return out


def restart_findings(facts: RunFacts, good: dict | None) -> list[Finding]:
    """Each relaunch: where it resumed, the steps it recomputed, the time lost and the time down
    (docs/restarts.md). A launch that started while an earlier one still wrote had no downtime."""
    per = {a["attempt"]: a for a in (good or {}).get("per_attempt", [])}
    firsts = {a["attempt"]: a.get("first_step") for a in facts.summary.get("attempts") or []}
    overlapped = {o["attempts"][1]: o["attempts"][0] for o in facts.summary.get("overlaps") or []}
    out = []
    for r in facts.summary.get("restarts") or []:
        k = r["attempt"]
        if r.get("in_process"):
            out.append(_rollback_finding(facts, r))
            continue
        before = [a for i, a in per.items() if i < k]
        # down: the previous launch's shutdown after its last record, then the wait for this one
        down = (before[-1]["shutdown_s"] if before else 0.0) + (per[k]["downtime_before_s"] if k in per else 0.0)
        # the progress lost to this restart: of the launches whose recomputed steps it set
        lost = sum(a["buckets"]["wasted_progress"] for i, a in per.items() if _resumed_by(i, firsts) == k)
        n = r["superseded_steps"]
        first = r["resumed_at_step"]
        last = r["previous_last_step"] if n else first
        ranks = facts.ranks_of(k)
        if k in overlapped:
            how = (f"Launch {k} started while launch {overlapped[k]} still wrote this run (no downtime between them) "
                   f"and resumed at step {first}, where launch {overlapped[k]} had reached step {r['previous_last_step']}: ")
        else:
            how = f"Launch {k} resumed at step {first} after the job had reached step {r['previous_last_step']}: "
        out.append(Finding(
            kind="restart", severity="info", first_step=first, last_step=last, ranks=ranks,
            hosts=facts.hosts_of(ranks, {k}), score=down,
            message=(f"{how}{text.counted(n, 'step')} recomputed ({text.duration(lost)} of wasted progress) and "
                     f"{text.duration(down)} down between launches; checkpoint more often to lose less."),
        ))
    return out


def _rollback_finding(facts: RunFacts, r: dict) -> Finding:
    """A launch that went back to an earlier step in its own process (ingest/lineage/rollbacks.py): no downtime."""
    n, k = r["superseded_steps"], r["attempt"]
    first, last = r["resumed_at_step"], r["previous_last_step"]
    ranks = tuple(r.get("ranks") or facts.ranks_of(k))
    # A pass that stopped short of where it went back from re-ran only some of the superseded steps.
    redone = facts.steps.filter(pl.col("step").is_between(first, last)).height if n else 0
    again = "recomputed" if redone >= n else f"superseded, {redone} of them run again"
    return Finding(
        kind="restart", severity="info", first_step=first,
        last_step=last if n else first, ranks=ranks, hosts=facts.hosts_of(ranks, {k}),
        score=0.0,
        message=(f"Launch {k} rolled back in its own process at step {last} and resumed at step "
                 f"{first} (a checkpoint reloaded): {text.counted(n, 'step')} {again} "
                 f"({text.duration(r.get('wasted_s') or 0.0)} of wasted progress), no downtime."),
    )


def _resumed_by(i: int, firsts: dict) -> int | None:
    """The later launch that superseded launch ``i``'s rows: the one with the lowest first step."""
    later = [(f, k) for k, f in firsts.items() if k > i and f is not None]
    return min(later)[1] if later else None
