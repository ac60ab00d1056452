"""Per-step facts over ranks that steps.parquet does not hold, in one lazy pass over ranks.parquet.

"The median rank" is the lower median (an actual rank's value: with two ranks, the faster one),
so a straggler is compared with a rank that did not straggle, however few ranks there are.
"""

from __future__ import annotations

import polars as pl

from kforge_dash.ingest.findings.model import RunFacts


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
    ph = facts.phases
    lf = pl.scan_parquet(facts.ranks_path).filter(pl.col("step_time_s").is_not_null())
    lf = lf.with_columns(own_work(ph.own).alias("_own"), own_work(ph.data).alias("_data"),
                         own_work(ph.checkpoint).alias("_ckpt"), own_work(ph.eval).alias("_eval"),
                         own_work(ph.wait).fill_null(0.0).alias("_wait"))
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
