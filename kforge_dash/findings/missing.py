"""Steps that some ranks of their launch did not record (``missing_ranks``).

A step that every rank ended but one rank's rows of which are gone (a part file that could not be
read and was skipped with a warning, a rank killed before its last flush while the others flushed
further) stays in steps.parquet, reduced over the ranks that did record it: its step time,
straggler view and goodput there are those of fewer ranks, which nothing else says. Per launch,
stretches of consecutive steps whose ``n_ranks`` is below the launch's world size become one
finding each, naming the ranks with no rows there (read from ranks.parquet for those steps only).
"""

from __future__ import annotations

import polars as pl

from kforge_dash import text
from kforge_dash.findings.finding import Finding, RunFacts, steps_range

MAX_FINDINGS = 20  # stretches reported one by one; the rest are counted in the last message


def missing_rank_findings(facts: RunFacts) -> list[Finding]:
    sizes = {a["attempt"]: a.get("world_size") for a in facts.summary.get("attempts") or []}
    steps = facts.steps
    if not sizes or not {"step", "n_ranks", "attempt", "step_time_s"} <= set(steps.columns):
        return []
    stretches = (
        steps.lazy()
        .select("step", "attempt", "n_ranks", "step_time_s")
        .with_columns(size=pl.col("attempt").replace_strict(sizes, default=None, return_dtype=pl.Int64))
        # a step some rank ended (log-only rows end none) with fewer ranks than its launch had
        .with_columns(short=(pl.col("step_time_s").is_not_null() & (pl.col("n_ranks") < pl.col("size"))).fill_null(False))
        .with_columns(stretch=((pl.col("short") != pl.col("short").shift(1))
                               | (pl.col("attempt") != pl.col("attempt").shift(1))).fill_null(True).cum_sum())
        .filter(pl.col("short"))
        .group_by("stretch", maintain_order=True)
        .agg(pl.col("attempt").first(), pl.col("size").first(), first=pl.col("step").first(),
             last=pl.col("step").last(), n_steps=pl.len(), fewest=pl.col("n_ranks").min())
        .collect()
    )
    out = []
    for s in stretches.head(MAX_FINDINGS).iter_rows(named=True):
        absent, everywhere = _absent_ranks(facts.ranks_path, s)
        more = stretches.height - MAX_FINDINGS if len(out) == MAX_FINDINGS - 1 and stretches.height > MAX_FINDINGS else 0
        out.append(_finding(facts, s, absent, everywhere, more))
    return out


def _absent_ranks(ranks_path: str, s: dict) -> tuple[tuple[int, ...], bool]:
    """The launch's ranks with fewer ended steps than the stretch has, in the stretch; and whether
    they have none there at all."""
    ended = (
        pl.scan_parquet(ranks_path, glob=False)
        .filter((pl.col("attempt") == s["attempt"]) & pl.col("step").is_between(s["first"], s["last"])
                & pl.col("step_time_s").is_not_null())
        .group_by("rank").agg(n=pl.col("step").n_unique())
        .collect()
    )
    have = dict(ended.iter_rows())
    absent = tuple(r for r in range(s["size"]) if have.get(r, 0) < s["n_steps"])
    return absent, all(have.get(r, 0) == 0 for r in absent)


def _finding(facts: RunFacts, s: dict, absent: tuple[int, ...], everywhere: bool, more: int) -> Finding:
    size, fewest = s["size"], s["fewest"]
    who = text.rank_list(absent[:8]) + (" ..." if len(absent) > 8 else "")
    have = "have" if len(absent) > 1 else "has"
    tail = f" ({more} more such stretches not listed)" if more else ""
    were = "was" if s["first"] == s["last"] else "were"
    message = (f"{steps_range(s['first'], s['last']).capitalize()} of launch {s['attempt']} {were} recorded by as few as "
               f"{fewest} of its {size} ranks: {who} {have} no rows for {'them' if everywhere else 'some of them'} (a part "
               "file that could not be read, see the warnings, or a rank killed before its last flush); step time, "
               "stragglers and goodput there are over the ranks that recorded them, and tokens, tokens/s and MFU count "
               f"only their tokens (a dip that is not a slowdown){tail}.")
    return Finding(kind="missing_ranks", severity="warning", first_step=s["first"], last_step=s["last"],
                   ranks=absent, hosts=facts.hosts_of(absent, {s["attempt"]}), score=float(s["n_steps"]), message=message)
