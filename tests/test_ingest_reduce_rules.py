"""The per-step reduction kernel (kforge_dash/ingest/rowpass/reduce.py) against the contract's rules written
plainly (tests/reference_math.reference_steps), on varied windows: full grids, a rank missing steps,
a restart inside the window, log-only rows, one step of many ranks, a sparse window; values with
NaN/inf/null, -0.0, bitmasks valid and not, ties for the slowest rank. Each window is reduced whole
and in batches cut at random rows: every value must be the reference's, bit for bit. And the
kernel's work space (tracemalloc's peak, never a time) stays proportional to the rows when one step
of many ranks lies among many steps of one rank (once a (slots x steps) median matrix)."""

import math
import struct
import tracemalloc

import numpy as np
import polars as pl
import pytest
from reference_math import reference_steps

from kforge_dash.ingest.rowpass.buffers import Buffers
from kforge_dash.ingest.rowpass.reduce import StepAcc, mean_columns, reduce_steps

OR, X = "hw/throttle_reasons", "x"
SCHEMA = {"step": pl.Int64, "time": pl.Float64, "step_time_s": pl.Float64, "loss": pl.Float64, "grad_norm": pl.Float64,
          "lr": pl.Float64, "tokens": pl.Int64, "mem_allocated_bytes": pl.Int64, "mem_peak_bytes": pl.Int64,
          "mem_reserved_bytes": pl.Int64, "rank": pl.Int64, "attempt": pl.Int64, "_counts": pl.Boolean,
          OR: pl.Float64, X: pl.Float64}
KINDS = ["grid", "missing", "restart", "log_only", "one_step", "sparse"]


def _pick(rng, common, odd, p=0.15):
    return odd[int(rng.integers(len(odd)))] if rng.random() < p else common


def _row(rng, rank, step, attempt, ended=True):
    odd_float = [None, math.nan, math.inf, -math.inf, -0.0]
    return {"step": step, "rank": rank, "attempt": attempt,
            "time": _pick(rng, 1.7e9 + step + rng.random(), [None, math.nan, math.inf], 0.05),
            "step_time_s": _pick(rng, float(rng.integers(1, 4)) / 4, [math.nan], 0.05) if ended else None,
            "loss": _pick(rng, float(rng.normal()), odd_float), "grad_norm": _pick(rng, float(rng.random()), [None]),
            "lr": _pick(rng, 0.1 * rank, [None], 0.3), "tokens": _pick(rng, int(rng.integers(1, 100)), [None]),
            "_counts": _pick(rng, True, [False, None], 0.2),
            **{c: _pick(rng, int(rng.integers(0, 1 << 40)), [None]) for c in SCHEMA if c.startswith("mem_")},
            OR: _pick(rng, float(1 << int(rng.integers(0, 8))), [None, math.nan, -1.0, 2.0**64, 36.5], 0.4),
            X: _pick(rng, -0.0 if step % 5 == 0 else float(rng.random()), [None, math.nan], 0.2)}


def _window(rng, kind: str) -> list[dict]:
    """Rows as ingest gives a window: attempt by attempt, rank by rank, steps increasing; log-only
    rows of steps never ended last."""
    n_ranks, lo = int(rng.integers(1, 7)), int(rng.integers(0, 50))
    n_steps = 1 if kind == "one_step" else int(rng.integers(2, 12))
    steps = list(range(lo, lo + n_steps))
    if kind == "sparse":  # one step of 300 ranks among 300 steps of one rank
        return ([_row(rng, r, 0, 0) for r in range(300) if r != 1]
                + [_row(rng, 1, s, 0) for s in range(300)])
    if kind == "one_step":
        n_ranks = int(rng.integers(9, 40))
    cut = lo + n_steps // 2 if kind == "restart" else None
    rows, ended = [], set()
    for attempt, part in ((0, steps),) if cut is None else ((0, steps[:n_steps // 2]), (1, steps[n_steps // 2:])):
        for r in range(n_ranks):
            for s in part:
                if kind in ("missing", "log_only") and rng.random() < 0.25:
                    continue
                rows.append(_row(rng, r, s, attempt))
                ended.add((r, s))
    if kind in ("log_only", "restart"):  # a rank logged at steps it never ended
        for r in range(n_ranks):
            for s in steps:
                if (r, s) not in ended and rng.random() < 0.5:
                    rows.append(_row(rng, r, s, 0 if cut is None or s < cut else 1, ended=False))
    return rows


def _reduce_in_batches(df: pl.DataFrame, cols, counts_col, rng) -> pl.DataFrame:
    acc = StepAcc(cols, counts_col, Buffers(), expect_rows=df.height // 2)  # (the kept times' buffer grows)
    cuts = sorted(set(rng.integers(0, df.height + 1, int(rng.integers(1, 5))).tolist()) | {0, df.height})
    for a, b in zip(cuts, cuts[1:]):
        acc.add(df.slice(a, b - a))
    return acc.result()


def _key(v):
    """A value as compared: floats by their bits (-0.0 is not 0.0), every NaN alike."""
    if isinstance(v, float):
        return "nan" if math.isnan(v) else struct.pack("<d", v)
    return v


def _check(got: pl.DataFrame, want: dict) -> None:
    assert got["step"].to_list() == list(want)
    for row in got.iter_rows(named=True):
        w = want[row["step"]]
        for c, v in w.items():
            assert _key(row[c]) == _key(v), (row["step"], c, row[c], v)
    assert got.schema[OR] == pl.Int64


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("counts_col", [True, False])
def test_the_kernel_gives_the_reference_rules_whole_and_in_batches(kind, counts_col):
    rng = np.random.default_rng(KINDS.index(kind) * 2 + counts_col)
    cols = [c for c in SCHEMA if c != "_counts"]
    buf = Buffers()  # one work space for every window, as ingest reuses it
    for _ in range(3 if kind == "sparse" else 25):
        rows = _window(rng, kind)
        df = pl.DataFrame(rows, schema=SCHEMA)
        want = reference_steps(rows, mean_columns(cols), [OR], counts_col)
        _check(reduce_steps(df, cols, counts_col, buf), want)
        _check(_reduce_in_batches(df, cols, counts_col, rng), want)


def test_the_reference_itself_on_a_hand_worked_step():
    """Two ranks of one step, worked by hand: the reference is the contract, not the kernel's echo."""
    rows = [_row(np.random.default_rng(0), r, 7, 0) for r in (3, 1)]
    rows[0].update(time=10.0, step_time_s=0.5, loss=1.0, grad_norm=None, lr=0.3, tokens=5, _counts=True, **{OR: 4.0, X: -0.0})
    rows[1].update(time=math.nan, step_time_s=0.5, loss=math.inf, grad_norm=2.0, lr=0.1, tokens=7, _counts=False,
                   **{OR: 32.0, X: -0.0})
    want = reference_steps(rows, ["loss", X], [OR], counts_col=True)[7]
    assert (want["time"], want["step_work_s"], want["slowest_rank"], want["step_work_median_s"]) == (10.0, 0.5, 1, 0.5)
    assert (want["loss"], want["grad_norm"], want["lr"], want["tokens"], want[OR]) == (math.inf, 2.0, 0.1, 5, 36)
    assert math.copysign(1, want[X]) == -1 and want["n_ranks"] == 2
    cols = [c for c in SCHEMA if c != "_counts"]
    _check(reduce_steps(pl.DataFrame(rows, schema=SCHEMA), cols, True), {7: want})


def _wide_step_then_long_rank(ranks: int, steps: int) -> pl.DataFrame:
    """``ranks`` ranks at step 0, then rank 0 alone at steps 1..steps-1 (an elastic shrink's shape)."""
    rank = np.r_[np.arange(ranks), np.zeros(steps - 1, np.int64)]
    step = np.r_[np.zeros(ranks, np.int64), np.arange(1, steps)]
    n = len(rank)
    rng = np.random.default_rng(0)
    return pl.DataFrame({"step": step, "rank": rank, "attempt": np.zeros(n, np.int64)}).with_columns(
        time=pl.Series(1e9 + step.astype(float)), step_time_s=pl.Series(rng.integers(1, 9, n) / 4),
        loss=pl.Series(rng.random(n)), grad_norm=pl.lit(1.0), lr=pl.lit(0.1), tokens=pl.lit(7, pl.Int64),
        mem_allocated_bytes=pl.lit(5, pl.Int64), mem_peak_bytes=pl.lit(6, pl.Int64),
        mem_reserved_bytes=pl.lit(7, pl.Int64), _counts=pl.lit(True), **{OR: pl.lit(4.0), X: pl.lit(0.5)},
    ).select([pl.col(c).cast(t) for c, t in SCHEMA.items()])


def test_a_wide_step_among_long_steps_needs_memory_of_the_rows_not_ranks_times_steps():
    df = _wide_step_then_long_rank(1024, 20_000)
    cols = [c for c in SCHEMA if c != "_counts"]
    row_bytes = df.height * 8  # one float64 a row: what each per-row array of the kernel costs
    tracemalloc.start()
    try:
        got = reduce_steps(df, cols, True, Buffers())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # 6.2 MB today (the ~25 per-step arrays, 4 MB, most of it); a (slots x steps) step-time median
    # matrix took 171 MB here: 1,024 x 20k x 8 bytes
    assert peak < 100 * row_bytes, f"peak {peak / 1e6:.1f} MB for {df.height} rows"
    want = reference_steps(df.to_dicts(), mean_columns(cols), [OR], True)
    _check(got, want)
