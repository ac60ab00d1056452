"""Replicas that disagree: a minority of ranks whose replica-identical value differs from the majority's.

Data-parallel replicas compute some values from the same bytes, so they agree to the bit. Two such
values are checked:

- the gradient norm after the all-reduce;
- the parameter checksum (``kforge_record.replica.param_checksum``), which a bit flipped in one
  rank's parameters changes from that step on, while the reduced gradient norm stays equal on
  every rank.

The data-parallel layout is every rank of a launch. Under model parallelism, each data-parallel group
records its own checksum as ``param_checksum/GROUP`` (``replica.group_checksum_name``): each such
column is compared among the ranks that recorded it, so a group is checked on its own.

A step is checked where at least 3 ranks of a launch report the value and a strict majority of them
agree on it, bit for bit (NaN/inf are the ``nonfinite`` finding's). The ranks with another value are
the minority. One ``replica_divergence`` finding (error) per metric and launch names:

- the minority's ranks and hosts;
- each rank's first diverging step, and by how much it differs.

The check is off for a metric of a launch whose ranks agree at fewer than half of its steps of 2 or
more ranks: a rank-local value, such as a pre-reduce local norm. It is off with one warning, and
never a finding.
"""

from __future__ import annotations

import polars as pl

from kforge_dash import text
from kforge_dash.findings.finding import Finding, RunFacts, steps_range
from kforge_record.replica import PARAM_CHECKSUM

METRICS = ("grad_norm", PARAM_CHECKSUM)
GROUP_PREFIX = f"{PARAM_CHECKSUM}/"  # param_checksum/GROUP: compared among the ranks that record it (one group)
MIN_RANKS = 3  # a majority needs at least two ranks agreeing against one
MIN_AGREEING_SHARE = 0.5  # below this share of steps with a majority, the value is not replica-identical
WINDOW_ROWS = 500_000  # rank-steps read at once (see _step_windows)


def replica_divergence_findings(facts: RunFacts, warnings: list[str]) -> list[Finding]:
    lf = pl.scan_parquet(facts.ranks_path, glob=False)
    schema = lf.collect_schema()
    out = []
    for metric in [c for c in schema if c in METRICS or c.startswith(GROUP_PREFIX)]:
        out += _metric_findings(facts, lf, metric, warnings)
    return out


def _step_windows(facts: RunFacts) -> list[tuple[int, int]]:
    """Step ranges of about WINDOW_ROWS rank-steps: a (step, value) group per rank of a whole run held
    at once took 1.0 GB more at 64 ranks x 100k steps (1.59 GB peak; 0.66 GB in 500k-row windows, `/usr/bin/time -f %M
    kforge-ingest --force` on benchmarks/bench_ingest.py's write_run(64, 100_000, 10_000))."""
    steps = facts.steps["step"].unique().sort().to_list() if facts.steps.height else []
    width = max(1, WINDOW_ROWS // max(1, len(facts.summary.get("ranks") or []) or 1))
    # by the steps there are, not their numeric range: a step 10**12 after step 40 is one window more, not 10**12 / width
    return [(steps[i], steps[min(i + width, len(steps)) - 1]) for i in range(0, len(steps), width)]


def _metric_findings(facts: RunFacts, lf: pl.LazyFrame, metric: str, warnings: list[str]) -> list[Finding]:
    vals = (lf.select("attempt", "step", "rank", pl.col(metric).alias("v"))
            .filter(pl.col("v").is_not_null() & pl.col("v").is_finite()))
    windows = _step_windows(facts)
    steps = pl.concat([_step_majority(vals.filter(pl.col("step").is_between(a, b))) for a, b in windows]) if windows else None
    if steps is None or steps.height == 0:
        return []
    shares = (steps.group_by("attempt").agg(pl.col("majority").mean().alias("share"), pl.len().alias("steps"))
              .sort("attempt"))
    checked = []
    for row in shares.iter_rows(named=True):
        if row["share"] < MIN_AGREEING_SHARE:
            warnings.append(f"replica check: {metric} differs between ranks at {text.percent(1 - row['share'], 0)} of attempt "
                            f"{row['attempt']}'s {row['steps']} steps: a rank-local value, not one replicas share; "
                            "not checked for it")
        else:
            checked.append(row["attempt"])
    if not checked:
        return []
    majority = (steps.filter(pl.col("majority") & (pl.col("n") >= MIN_RANKS) & pl.col("attempt").is_in(checked))
                .select("attempt", "step", pl.col("v").alias("mode")))
    rows = pl.concat([_diverging(vals.filter(pl.col("step").is_between(a, b)), majority) for a, b in windows])
    out = []
    for (attempt,), g in rows.sort("attempt", "step", "rank").group_by(["attempt"], maintain_order=True):
        out.append(_finding(facts, metric, int(attempt), g))
    return out


def _step_majority(vals: pl.LazyFrame) -> pl.DataFrame:
    """Per (attempt, step) of 2+ ranks: n, whether a strict majority of its ranks agree, and if so on which
    value v (held by n_v ranks). A strict majority's value holds the middle of the step's sorted values,
    so the lower median is the one candidate: its count decides (v and n_v mean nothing where majority is false)."""
    # One group_by, not a (step, value) group_by sorted by count: 2.5-2.9 -> 0.7-0.8 CPU-s at 64 ranks x 100k steps
    # (this stage's row of `PYTHONPATH=. python3 benchmarks/bench_ingest_stages.py RUN`, RUN from bench_ingest_vs_duckdb)
    c = pl.col("v").quantile(0.5, "lower")
    return (vals.group_by("attempt", "step").agg(pl.len().alias("n"), c.alias("c"), (pl.col("v") == c).sum().alias("n_v"))
            .filter(pl.col("n") >= 2).with_columns(majority=pl.col("n_v") * 2 > pl.col("n"))
            .select("attempt", "step", "n", pl.col("c").alias("v"), "n_v", "majority").collect())


def _diverging(vals: pl.LazyFrame, majority: pl.DataFrame) -> pl.DataFrame:
    """(attempt, step, rank, v, mode) of each rank whose value differs from its step's majority."""
    return (vals.join(majority.lazy(), on=["attempt", "step"]).filter(pl.col("v") != pl.col("mode"))
            .select("attempt", "step", "rank", "v", "mode").collect())


def _finding(facts: RunFacts, metric: str, attempt: int, g: pl.DataFrame) -> Finding:
    per_rank = (g.group_by("rank").agg(pl.col("step").min().alias("first"), pl.col("step").max().alias("last"),
                                      pl.len().alias("n"), ((pl.col("v") - pl.col("mode")).abs()
                                                            / pl.col("mode").abs()).max().alias("rel"))
                .sort("first", "rank"))
    ranks = tuple(sorted(per_rank["rank"].to_list()))
    parts = []
    for r in per_rank.iter_rows(named=True):
        how = "" if metric.startswith(PARAM_CHECKSUM) or r["rel"] is None else f", by up to {_rel(r['rel'])}"
        parts.append(f"{text.rank_list([r['rank']])} from step {r['first']} ({text.counted(r['n'], 'step')}{how})")
    first, last = int(g["step"].min()), int(g["step"].max())
    what = "parameter checksum" if metric == PARAM_CHECKSUM else \
        f"parameter checksum of {metric[len(GROUP_PREFIX):]}" if metric.startswith(GROUP_PREFIX) else metric
    return Finding(
        kind="replica_divergence", metric=metric, severity="error", first_step=first, last_step=last, ranks=ranks,
        hosts=facts.hosts_of(ranks, {attempt}), score=float(len(g)),
        message=(f"{what} differs from the other replicas' on {'; '.join(parts)} over {steps_range(first, last)}: "
                 "a silent data corruption on those ranks' GPUs or hosts, or replicas that were never in step; "
                 "check them before trusting the run."),
    )


def _rel(x: float) -> str:
    return "an infinite factor" if x != x or x == float("inf") else text.percent(x, 2) if x >= 1e-4 else f"{x:.1e} (relative)"
