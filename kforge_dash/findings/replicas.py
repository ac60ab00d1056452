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

import bisect

import numpy as np
import polars as pl

from kforge_dash import text
from kforge_dash.findings.finding import Finding, RunFacts, steps_range
from kforge_record.replica import PARAM_CHECKSUM

METRICS = ("grad_norm", PARAM_CHECKSUM)
GROUP_PREFIX = f"{PARAM_CHECKSUM}/"  # param_checksum/GROUP: compared among the ranks that record it (one group)
MIN_RANKS = 3  # a majority needs at least two ranks agreeing against one
MIN_AGREEING_SHARE = 0.5  # below this share of steps with a majority, the value is not replica-identical
# Rank-steps read at once at most (see _step_windows). 1M, not 500k: fewer reads of 1,024 ranks' 10M-row row-group
# runs; at 1,024 ranks x 100k steps this stage takes 10.8 CPU-s and peaks at 0.74 GiB (53.7 CPU-s and 0.89 GiB before
# this file's changes; `python3 benchmarks/bench_ingest_stages.py RUN`, its replicas row; 2M: +0.1 GiB)
WINDOW_ROWS = 1_000_000


def replica_divergence_findings(facts: RunFacts, warnings: list[str]) -> list[Finding]:
    lf = pl.scan_parquet(facts.ranks_path, glob=False)
    schema = lf.collect_schema()
    out = []
    for metric in [c for c in schema if c in METRICS or c.startswith(GROUP_PREFIX)]:
        out += _metric_findings(facts, lf, metric, warnings)
    return out


def _step_windows(facts: RunFacts) -> list[tuple[int, int]]:
    """Step ranges of at most WINDOW_ROWS rank-steps: a (step, value) group per rank of a whole run held
    at once took 1.0 GB more at 64 ranks x 100k steps (1.59 GB peak; 0.66 GB in 500k-row windows, `/usr/bin/time -f %M
    kforge-ingest --force` on benchmarks/bench_ingest.py's write_run(64, 100_000, 10_000)).

    Cut where ranks.parquet's row groups are (their step statistics), so that a window reads its row groups
    once: a row group holds some ranks' rows of a whole row-pass window, and a narrower window decoded all
    of it. A run of overlapping row groups of up to WINDOW_ROWS rows is one window (64 ranks x 100k steps:
    5 of 1.28M rows, not 13 of 500k that each decoded 1.28M); a bigger run (1,024 ranks) is cut in steps."""
    steps = facts.steps["step"].unique().sort().to_list() if facts.steps.height else []
    width = max(1, WINDOW_ROWS // max(1, len(facts.summary.get("ranks") or []) or 1))
    spans = _row_group_spans(facts.ranks_path)
    if spans is None:
        spans = [(None, None, 0)]
    out = []
    for lo, hi, rows in spans:  # windows hold the steps steps.parquet has, as before: each from one to another
        i = 0 if lo is None else bisect.bisect_left(steps, lo)
        j = len(steps) if hi is None else bisect.bisect_right(steps, hi)
        w = j - i if 0 < rows <= WINDOW_ROWS else width
        # by the steps there are, not their numeric range: a step 10**12 after step 40 is one window more, not 10**12 / width
        out += [(steps[k], steps[min(k + w, j) - 1]) for k in range(i, j, max(1, w))]
    return out


def _row_group_spans(path: str) -> list[tuple[int, int, int]] | None:
    """(first step, last step, rows) of each run of ranks.parquet's row groups whose step ranges overlap,
    in step order; None where a row group has no step statistics."""
    import pyarrow.parquet as pq

    md = pq.ParquetFile(path).metadata
    names = [md.schema.column(j).name for j in range(md.num_columns)]
    if "step" not in names:
        return None
    js = names.index("step")
    got = []
    for i in range(md.num_row_groups):
        rg = md.row_group(i)
        st = rg.column(js).statistics
        if st is None or not st.has_min_max:
            return None
        got.append((st.min, st.max, rg.num_rows))
    spans: list[list[int]] = []
    for lo, hi, n in sorted(got):
        if spans and lo <= spans[-1][1]:
            spans[-1][1], spans[-1][2] = max(spans[-1][1], hi), spans[-1][2] + n
        else:
            spans.append([lo, hi, n])
    return [(lo, hi, n) for lo, hi, n in spans]


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
    df = vals.collect()
    got = _grid_majority(df)
    if got is not None:
        return got
    # One group_by, not a (step, value) group_by sorted by count: 2.5-2.9 -> 0.7-0.8 CPU-s at 64 ranks x 100k steps
    # (this stage's row of `PYTHONPATH=. python3 benchmarks/bench_ingest_stages.py RUN`, RUN from bench_ingest_vs_duckdb)
    c = pl.col("v").quantile(0.5, "lower")
    return (df.lazy().group_by("attempt", "step").agg(pl.len().alias("n"), c.alias("c"), (pl.col("v") == c).sum().alias("n_v"))
            .filter(pl.col("n") >= 2).with_columns(majority=pl.col("n_v") * 2 > pl.col("n"))
            .select("attempt", "step", "n", pl.col("c").alias("v"), "n_v", "majority").collect())


def _grid_majority(df: pl.DataFrame) -> pl.DataFrame | None:
    """_step_majority of rows that are k blocks (ranks) of one attempt with the same increasing steps each (a
    window every rank recorded in full), as a k x steps matrix sorted down each column; None otherwise.
    With the row-group windows, replica_divergence_findings at 64 ranks x 100k steps: 0.7-0.8 -> 0.18 CPU-s
    (2.5-2.9 on the (step, value) group_by; bench_ingest_stages.py's replicas row)."""
    n = df.height
    if n < 2 or df["attempt"].n_unique() != 1 or df["v"].null_count() or df["step"].null_count():
        return None
    s = df["step"].to_numpy()
    down = np.flatnonzero(s[1:] <= s[:-1])
    width = int(down[0]) + 1 if down.size else n
    k = n // width
    if k * width != n or not (s.reshape(k, width) == s[:width]).all():
        return None
    if k < 2:  # (steps of one rank: none is checked)
        return None
    m = np.sort(df["v"].to_numpy().reshape(k, width), axis=0)
    c = m[k // 2]
    n_v = (m == c).sum(axis=0)
    # copies, not views: a frame made of views keeps the window's whole step column and sorted matrix alive
    # (1,024 ranks x 100k steps: 1.5 GiB held over the run's windows)
    return pl.DataFrame({"attempt": np.full(width, df["attempt"][0], np.int64), "step": s[:width].copy(),
                         "n": np.full(width, k, np.uint32), "v": c.copy(), "n_v": n_v.astype(np.uint32),
                         "majority": n_v * 2 > k})


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
