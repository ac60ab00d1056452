"""Per-step facts over ranks that steps.parquet does not hold, in one lazy pass over ranks.parquet.

"The median rank" is the lower median (an actual rank's value: with two ranks, the faster one),
so a straggler is compared with a rank that did not straggle, however few ranks there are.

ranks.parquet is read in step windows of about ``WINDOW_ROWS`` rows (the Parquet reader skips
the row groups outside a window), so memory stays bounded however many ranks and steps a run has.
"""

from __future__ import annotations

import polars as pl

from kforge_dash.ingest.findings.matrix import per_step_matrix
from kforge_dash.ingest.findings.model import RunFacts

WINDOW_ROWS = 2_000_000


def block_size(n_steps: int) -> int:
    """Steps per straggler block: about 100 blocks a run, at least 5 steps each."""
    return max(5, -(-n_steps // 100))


def windows(facts: RunFacts) -> list[tuple[int, int]]:
    """[lo, hi) step ranges covering the run, each a whole number of straggler blocks."""
    steps = facts.steps["step"]
    if steps.len() == 0:
        return []
    lo, hi = int(steps.min()), int(steps.max()) + 1
    W = block_size(facts.steps.height)
    n_ranks = max(1, len(facts.summary.get("ranks") or []) or 1)
    span = max(W, (WINDOW_ROWS // n_ranks) // W * W)
    start = lo // W * W
    return [(a, min(a + span, hi)) for a in range(start, hi, span)]


def lower_median(e: pl.Expr) -> pl.Expr:
    return e.quantile(0.5, interpolation="lower")


def own_work(cols) -> pl.Expr:
    """A rank's own work in a step: the sum of its own-work phases (null when it timed none)."""
    if not cols:
        return pl.lit(None, pl.Float64)
    return pl.when(pl.any_horizontal([pl.col(c).is_not_null() for c in cols])).then(
        pl.sum_horizontal([pl.col(c).fill_null(0.0) for c in cols]))


def per_step(facts: RunFacts) -> pl.DataFrame:
    """One row per step: ``own_med`` (the median rank's own work), ``data_med``, ``ckpt_max``,
    ``eval_max``, ``<phase>\\0med`` for each own-work phase, and the critical rank's ``crit_st``
    (step time), ``crit_own`` and ``crit_side`` (its checkpoint + eval phases).

    The critical rank is the one that waited least in the wait phases: the last to reach the
    collective, the one every other rank waited for (without wait phases: the slowest rank).
    """
    parts = [_per_step(facts, lo, hi) for lo, hi in windows(facts)]
    return pl.concat(parts, how="vertical") if parts else _per_step(facts, 0, 0)


def _per_step(facts: RunFacts, lo: int, hi: int) -> pl.DataFrame:
    ph = facts.phases
    lf = pl.scan_parquet(facts.ranks_path).filter(pl.col("step_time_s").is_not_null() & pl.col("step").is_between(
        lo, hi, closed="left"))
    lf = lf.select("step", "rank", "step_time_s", *ph.own,
                   own_work(ph.own).alias("_own"), own_work(ph.data).alias("_data"),
                   own_work(ph.checkpoint).alias("_ckpt"), own_work(ph.eval).alias("_eval"),
                   own_work(ph.wait).fill_null(0.0).alias("_wait"))
    df = lf.sort("step", "rank").collect()
    fast = per_step_matrix(df, ph.own, ph.data)
    if fast is not None:
        return fast
    return _grouped(df.lazy(), ph)


def _grouped(lf: pl.LazyFrame, ph) -> pl.DataFrame:
    # Least wait first; ties (no wait phases: all zero) to the longest step. (polars: a sort_by
    # within the group is faster here than get(arg_min()).)
    crit = ["_wait", (-pl.col("step_time_s")).alias("_neg")]

    def of_critical(c):
        return pl.col(c).sort_by(crit).first()

    return lf.group_by("step").agg(
        lower_median(pl.col("_own")).alias("own_med"),
        # one data phase (the usual case): its median is computed once, below
        (pl.lit(None, pl.Float64) if len(ph.data) == 1 else lower_median(pl.col("_data"))).alias("data_med"),
        pl.col("_ckpt").max().alias("ckpt_max"), pl.col("_eval").max().alias("eval_max"),
        of_critical("step_time_s").alias("crit_st"), of_critical("_own").alias("crit_own"),
        (of_critical("_ckpt").fill_null(0.0) + of_critical("_eval").fill_null(0.0)).alias("crit_side"),
        *[lower_median(pl.col(c)).alias(f"{c}\0med") for c in ph.own],
    ).sort("step").with_columns(
        pl.col(f"{ph.data[0]}\0med").alias("data_med") if len(ph.data) == 1 else pl.col("data_med")
    ).collect()
