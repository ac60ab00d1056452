"""Per-step facts over ranks that steps.parquet does not hold, in one pass over ranks.parquet.

"The median rank" is the lower median (an actual rank's value: with two ranks, the faster one),
so a straggler is compared with a rank that did not straggle, however few ranks there are.

When the run is one full grid of ranks x steps (the usual case), ranks.parquet is read row group
by row group, each decoded once, and cut into windows of whole straggler blocks (grid_units.py).
Otherwise it is read in step windows (the Parquet reader skips the row groups outside a window),
two at a time of about ``WINDOW_ROWS / 2`` rows each (one alone on one core), so memory stays
bounded however many ranks and steps a run has. Every way (units, a window's matrices, polars'
group-by) is checked against the rules written plainly, tests/reference_math.reference_perstep.
`python benchmarks/bench_perstep.py` times each way.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import polars as pl

from kforge_dash.findings.finding import RunFacts
from kforge_dash.findings.grid_units import per_step_units
from kforge_dash.findings.matrix import Window
from kforge_dash.ingest.inputs.footers import usable_cpus
from kforge_dash.ingest.rowpass.buffers import Buffers

WINDOW_ROWS = 2_000_000


def block_size(n_steps: int) -> int:
    """Steps per straggler block: about 100 blocks a run, at least 5 steps each."""
    return max(5, -(-n_steps // 100))


def windows(facts: RunFacts, rows: int = WINDOW_ROWS) -> list[tuple[int, int]]:
    """[lo, hi) step ranges covering the run's steps, each a whole number of straggler blocks; a
    range holding none of its steps is left out, so that the windows are at most as many as the
    steps however far apart their numbers lie (steps 1..50 and 10**12). ``hi`` may be 2**63."""
    steps = facts.steps["step"].drop_nulls().unique().sort().to_numpy()
    if len(steps) == 0:
        return []
    hi = int(steps[-1]) + 1
    W = block_size(facts.steps.height)
    n_ranks = max(1, len(facts.summary.get("ranks") or []) or 1)
    span = max(W, (rows // n_ranks) // W * W)
    out, i = [], 0
    while True:
        a = int(steps[i]) // W * W
        b = min(a + span, hi)
        out.append((a, b))
        if b >= hi:
            return out
        i = int(np.searchsorted(steps, b))  # the next step at or past b (b < 2**63 here)


def lower_median(e: pl.Expr) -> pl.Expr:
    return e.quantile(0.5, interpolation="lower")


def own_work(cols) -> pl.Expr:
    """A rank's own work in a step: the sum of its own-work phases (null when it timed none)."""
    if not cols:
        return pl.lit(None, pl.Float64)
    return pl.when(pl.any_horizontal([pl.col(c).is_not_null() for c in cols])).then(
        pl.sum_horizontal([pl.col(c).fill_null(0.0) for c in cols]))


def per_step(facts: RunFacts) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(one row per step, one row per (rank, attempt, straggler block)).

    Per step: ``own_med`` (the median rank's own work), ``data_med``, ``ckpt_max``, ``eval_max``,
    ``<phase>\\0med`` for each own-work phase, and the critical rank's ``crit_st`` (step time),
    ``crit_own`` and ``crit_side`` (its checkpoint + eval phases). The critical rank is the one
    that waited least in the wait phases: the last to reach the collective, the one every other
    rank waited for (without wait phases: the slowest rank).

    Per block (``block_size`` steps): ``first``, ``last``, ``n``, ``st`` (median of the steps'
    median step time), and per own-work phase its median excess over the median rank
    (``<phase>\\0ex``) and its summed positive excess (``<phase>\\0cost``: the others' wait).
    """
    W = block_size(facts.steps.height)
    st = facts.steps.select("step", pl.col("step_work_median_s").cast(pl.Float64).alias("_st"))
    fast = _by_units(facts, st, W)
    if fast is not None:
        meds, blocks = fast
        return pl.concat(meds, how="vertical"), (pl.concat(blocks, how="vertical") if blocks else pl.DataFrame())
    # Two windows at a time (of half the rows: the same memory as one): one is read (polars'
    # threads) while the other's numpy work runs (it releases the GIL): one thread took 1.22-1.29x
    # the wall time with a restart (`bench_perstep.py --cases restart --ways windows windows-1t`).
    # Windows are whole straggler blocks, so their size does not change the results. Each window
    # has fresh arrays: reusing them window after window saved no CPU (`--ways windows windows-fresh`).
    threads = min(2, usable_cpus())
    spans = windows(facts, WINDOW_ROWS // threads) or [(0, 0)]

    def one(span):
        return _window(facts, span, st, W, Buffers())

    if threads > 1 and len(spans) > 1:
        with ThreadPoolExecutor(threads, thread_name_prefix="kforge-perstep") as pool:
            got = list(pool.map(one, spans))
    else:
        got = [one(span) for span in spans]
    blocks = [blk for _, blk in got if blk is not None]
    return pl.concat([med for med, _ in got], how="vertical"), (pl.concat(blocks, how="vertical") if blocks else pl.DataFrame())


def _window(facts: RunFacts, span: tuple[int, int], st: pl.DataFrame, W: int, buf: Buffers | None = None):
    """(per-step rows, straggler-block rows or None) of the steps [lo, hi)."""
    (lo, hi), ph = span, facts.phases
    derived = _derived(ph)
    # A sum over one phase is that phase (the same values, -0.0, NaN and null included): the
    # matrices use the phase itself, and a column no path reads is not computed.
    alias = {"_own": ph.own[0]} if len(ph.own) == 1 else {}
    skip = set(alias) | ({"_data"} if len(ph.data) == 1 else set())
    skip |= {c for c, phases in (("_ckpt", ph.checkpoint), ("_eval", ph.eval)) if not phases}
    df = (pl.scan_parquet(facts.ranks_path, glob=False)
          .filter(pl.col("step_time_s").is_not_null() & pl.col("step").is_between(lo, hi - 1))
          .select("step", "rank", "attempt", "step_time_s", *ph.own,
                  *[e.alias(c) for c, e in derived.items() if c not in skip]).collect())
    win = Window.of(df, buf, alias=alias)
    med = (win.per_step(ph.own, ph.data) if win else None)
    if med is None:
        df = df.with_columns([e.alias(c) for c, e in derived.items() if c in skip and c != "_data"])
        win, med = None, _grouped(df.lazy(), ph)
    sts = med.select("step").join(st, on="step", how="left")["_st"].to_numpy()
    blk = win.blocks(med, sts, ph.own, W) if win is not None and ph.own else None
    if blk is None and ph.own:
        blk = _blocks_grouped(df, med.join(st, on="step", how="left"), ph.own, W)
    return med, blk


def _by_units(facts: RunFacts, st: pl.DataFrame, W: int):
    """grid_units.py's way (each row group read once), or None when the run is not one full grid."""
    cols = units_columns(facts.phases)
    return per_step_units(facts.ranks_path, facts.phases, cols.select, st, W, WINDOW_ROWS // 2, cols.alias, cols.need,
                          cols.side, min(2, usable_cpus()))


@dataclass(frozen=True)
class UnitsColumns:
    """What grid_units.py keeps of ranks.parquet for the phases ``ph``."""

    select: list[pl.Expr]  # step, rank, then each kept column (derived ones computed)
    need: list[str]  # no null allowed: step time, wait, own work
    side: list[str]  # checkpoint and eval work, NaN where null
    alias: dict[str, str]  # a column that is another (the sum over one own-work phase)


def units_columns(ph) -> UnitsColumns:
    alias = {"_own": ph.own[0]} if len(ph.own) == 1 else {}
    derived = _derived(ph)
    need = ["step_time_s", "_wait", *ph.own, *(["_own"] if not alias else []), *(["_data"] if len(ph.data) > 1 else [])]
    side = [c for c, phases in (("_ckpt", ph.checkpoint), ("_eval", ph.eval)) if phases]
    select = [pl.col("step"), pl.col("rank"), *[derived[c].alias(c) if c in derived else pl.col(c) for c in need + side]]
    return UnitsColumns(select, need, side, alias)


def _derived(ph) -> dict[str, pl.Expr]:
    return {"_own": own_work(ph.own), "_data": own_work(ph.data), "_ckpt": own_work(ph.checkpoint),
            "_eval": own_work(ph.eval), "_wait": own_work(ph.wait).fill_null(0.0)}


def _blocks_grouped(df: pl.DataFrame, med: pl.DataFrame, own, W: int) -> pl.DataFrame:
    lf = (df.lazy().select("step", "rank", "attempt", *own)
          .join(med.lazy().select("step", "_st", *[f"{c}\0med" for c in own]), on="step", how="inner")
          .with_columns([(pl.col(c) - pl.col(f"{c}\0med")).alias(c) for c in own])
          .with_columns((pl.col("step") // W).alias("_block")))
    return lf.group_by("rank", "attempt", "_block").agg(
        pl.col("step").min().alias("first"), pl.col("step").max().alias("last"), pl.len().alias("n"),
        pl.col("_st").median().alias("st"),
        *[pl.col(c).median().alias(f"{c}\0ex") for c in own],
        *[pl.col(c).clip(lower_bound=0).sum().alias(f"{c}\0cost") for c in own],
    ).collect()


def _grouped(lf: pl.LazyFrame, ph) -> pl.DataFrame:
    # Least wait first; ties (no wait phases: all zero) to the longest step.
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
