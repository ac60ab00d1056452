"""Per-step reductions over ranks (docs/CONTRACT.md, "Ingest's rules"): one kernel for every window.

A window's rows (one per (rank, step)) come in batches: a window far bigger than chunk_rows in
batches of ranks (read.read_batches), any other window as one batch. Each batch is laid out as a
(slots x steps) matrix per column (``Layout``): when every rank reported the same steps, rank by
rank (the common case), that is the rows themselves, reshaped; otherwise each row takes the next
free slot of its step, in row order, and empty cells count as not reported (a batch whose matrix
would be far bigger than its rows is first split by its steps' numbers of rows). Every rule is then a
numpy reduction down axis 0, combined with the batches before (``StepAcc``), so where a window is
cut into batches never changes a value:

* time: max of the finite end times; step_work_s/_min_s: max/min of the ranks' own step times
  (step_time_s, NaN ignored unless every one is NaN), step_work_median_s: their median (the middle
  value or the mean of the two middle ones, NaN sorted last; every time is kept, 8 bytes a row, 16
  once batches differ in steps);
  slowest_rank: the lowest rank whose time is the max (NaN equal to NaN); n_ranks: rows; attempt: max;
* tokens: the sum over the ranks that count them (null when none did, never 0);
* grad_norm/lr: the lowest reporting rank's value; memory: max;
* OR_COLUMNS: bitwise OR of the valid bitmasks (as_bits); every other scalar: the mean over
  reporting ranks, NaN/inf kept, summed one value after the other in row order (rank after rank).

tests/reference_math.py holds the same rules written plainly (a polars group_by); tests check this
kernel against it.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa

from kforge_dash.contract import REDUCED_HEAD
from kforge_dash.ingest.rowpass.arrays import np_array
from kforge_dash.ingest.rowpass.buffers import Buffers
from kforge_record.schema import FIXED_NAMES, MEM_COLUMNS

_I64_MIN, _I64_MAX = np.iinfo(np.int64).min, np.iinfo(np.int64).max


def ema_expr(col: str, *, alpha: float) -> pl.Expr:
    """The EMA of docs/CONTRACT.md: the first finite value starts it, then a*x + (1-a)*ema; NaN/inf and
    nulls do not enter and the EMA holds its last value there.

    polars' ewm_mean(adjust=False, ignore_nulls=True) is exactly that recurrence over the non-null
    values, bootstrapped with the first (checked against a plain loop in tests/test_ingest_ema.py);
    non-finite values become nulls first and the holes are forward-filled. Ingest's *_ema columns
    and the dashboard's smoothing slider both use this one expression.
    """
    finite = pl.when(pl.col(col).is_finite()).then(pl.col(col))
    return finite.ewm_mean(alpha=alpha, adjust=False, ignore_nulls=True, min_samples=1).forward_fill()


NOT_MEAN = set(FIXED_NAMES) | {"rank", "attempt", "step", "_counts"}
# Scalars that are bitmasks (NVML's clock-throttle reasons, float64 in the shards): a step's value is
# the bitwise OR over the ranks that reported one (every reason any rank gave), int64; a mean of
# bitmasks means nothing. Every other scalar is a mean.
OR_COLUMNS = frozenset({"hw/throttle_reasons"})


def step_columns(cols: list[str]) -> list[str]:
    """The columns reduce_steps gives, in order, for the output columns ``cols``."""
    return [*REDUCED_HEAD, *(c for c in cols if c not in NOT_MEAN)]


def mean_columns(cols: list[str]) -> list[str]:
    """The columns of ``cols`` reduced by the mean over reporting ranks (loss first)."""
    return ["loss", *(c for c in cols if c not in NOT_MEAN and c not in OR_COLUMNS)]


def as_bits(v: np.ndarray, has: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """A bitmask column's values as int64 bits (0 where not reported) and where a rank reported one:
    a finite value in [0, 2**63), its fraction dropped (as the hw_throttle finding reads it); any
    other value (NaN, negative, too big) counts as not reported."""
    ok = v >= 0  # (NaN and -inf fail it, +inf the next)
    ok &= v < 2.0**63
    if has is not None:
        ok &= has
    return (v if ok.all() else np.where(ok, v, 0)).astype(np.int64), ok


def reduce_steps(df: pl.DataFrame, cols: list[str], counts_col: bool, buffers: Buffers | None = None) -> pl.DataFrame:
    """One row per step of ``df`` (one row per (rank, step)): the whole window as one batch."""
    acc = StepAcc(cols, counts_col, buffers or Buffers(), expect_rows=df.height)
    acc.add(df)
    return acc.result()


def _grid(df: pl.DataFrame, buf: Buffers) -> tuple[np.ndarray, np.ndarray] | None:
    """(ranks, steps) when the rows are a full grid: rank by rank (ascending), each rank the same
    increasing steps; else None."""
    n = df.height
    rank, _ = buf.column("rank", df["rank"])  # kept until rank[starts] below
    starts = np.flatnonzero(np.r_[True, rank[1:] != rank[:-1]])
    if n % len(starts):
        return None
    n_steps = n // len(starts)
    if not np.array_equal(starts, np.arange(0, n, n_steps)) or np.any(np.diff(rank[starts]) <= 0):
        return None  # blocks of unequal length, or a rank twice (two attempts in the window)
    ranks = rank[starts]  # fancy indexing: a copy, safe from the buffer's reuse
    step = buf.column("step", df["step"])[0].reshape(len(starts), n_steps)
    if not (step == step[0]).all() or np.any(np.diff(step[0]) <= 0):
        return None
    return ranks, step[0].copy()


class Layout:
    """One batch's columns as (slots x steps) matrices: cell (k, j) holds the k-th row (in row
    order) of the j-th step. A grid's slots are its ranks, ascending, and every cell is filled
    (``cells`` None); otherwise ``cells`` gives each row's flat cell and ``filled`` the cells used,
    unless the matrices would be far bigger than the rows (then none is made: ``parts`` says how to
    split the rows so that none is)."""

    def __init__(self, df: pl.DataFrame, buf: Buffers):
        self.df, self.buf = df, buf
        grid = _grid(df, buf)
        self.cells = self.filled = self._ranks = self.parts = None
        if grid is not None:
            self.slot_ranks, self.steps = grid
            self.shape = (len(self.slot_ranks), len(self.steps))
            return
        step = df["step"].to_numpy()
        order = np.argsort(step, kind="stable")  # by step, then row order: one sort for all below
        srt = step[order]
        new = np.r_[True, srt[1:] != srt[:-1]]
        self.steps = srt[new]
        at_sorted = np.cumsum(new) - 1
        first = np.flatnonzero(new)
        at, slot = np.empty_like(at_sorted), np.empty_like(at_sorted)
        at[order] = at_sorted
        slot[order] = np.arange(len(step)) - first[at_sorted]  # each row's place among its step's rows
        self.shape = (int(np.diff(np.r_[first, len(step)]).max()), len(self.steps))
        if self.shape[0] * self.shape[1] > 4 * len(step) + 4096:
            # Far more cells than rows (a step of many ranks among many steps of few): no matrix
            # (4,096 ranks x 6M steps asked 24.6 GB for ``filled``); each row's part: its step's rows, log2.
            per_step = np.ceil(np.log2(np.diff(np.r_[first, len(step)]))).astype(np.int64)
            self.parts = per_step[at]
            return
        self.cells = slot * len(self.steps) + at
        self.filled = np.zeros(self.shape, np.bool_)
        self.filled.flat[self.cells] = True

    def __call__(self, col: str, fill, role: str = "v") -> tuple[np.ndarray, np.ndarray | None]:
        """(values, has) as (slots x steps), fill where there is no value; has is None when every
        cell has one. Valid until the next call with the same role."""
        v, has = self.buf.column(role, self.df[col], fill)
        if self.cells is None:
            return v.reshape(self.shape), None if has is None else has.reshape(self.shape)
        m = self.buf.get(role + "/cells", v.dtype, self.shape)
        m.fill(fill)
        m.flat[self.cells] = v
        if has is None:
            return m, self.filled
        h = np.zeros(self.shape, np.bool_)
        h.flat[self.cells] = has
        return m, h

    def count(self, has: np.ndarray | None) -> np.ndarray | int:
        return self.shape[0] if has is None else has.sum(axis=0)

    def lowest(self, mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per step: the slot of the lowest rank where ``mask`` (None: every cell), its rank, and
        whether there is one."""
        cols = np.arange(self.shape[1])
        if self.cells is None:  # slots are ranks, ascending: the first one is the lowest
            slot = np.zeros(self.shape[1], np.int64) if mask is None else mask.argmax(axis=0)
            return slot, self.slot_ranks[slot].astype(np.int64), np.ones(len(cols), bool) if mask is None else mask[slot, cols]
        if self._ranks is None:
            self._ranks = self("rank", _I64_MAX, "rank")[0].copy()
        r = np.where(self.filled if mask is None else mask, self._ranks, _I64_MAX)
        slot = r.argmin(axis=0)
        rank = r[slot, cols]
        return slot, rank, rank != _I64_MAX


def _sum_down(v: np.ndarray) -> np.ndarray:
    """The sum down each column, row after row, from -0.0 (numpy's own start, 0.0, turns a sum of
    -0.0 into 0.0): numpy adds the rows of a (slots x steps) matrix one after the other, but sums a
    single column (contiguous) pairwise, so that one by cumsum."""
    return v.sum(axis=0, initial=-0.0) if v.shape[1] > 1 else np.cumsum(v[:, 0])[-1:]


def _same(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """x == y, NaN equal to NaN."""
    return (x == y) | (np.isnan(x) & np.isnan(y))


class StepAcc:
    """The per-step reductions of a window, added batch after batch (``add``: each batch's ranks
    after the last batch's, a (rank, step) never split), then ``result()``."""

    def __init__(self, cols: list[str], counts_col: bool, buffers: Buffers, *, expect_rows: int):
        self.cols, self.counts_col, self.buf = cols, counts_col, buffers
        self.means = mean_columns(cols)
        self.ors = [c for c in cols if c in OR_COLUMNS]
        self.steps = np.empty(0, np.int64)
        self.a: dict[str, np.ndarray] = {}  # per step: made at the first batch
        self.kept = _Kept(buffers, expect_rows)

    def _fills(self) -> dict:
        """Every per-step array and its value before any row."""
        return {"time": -np.inf, "st_max": np.nan, "st_min": np.nan, "n_st": 0, "slowest": _I64_MAX, "n_ranks": 0,
                "attempt": _I64_MIN, "tokens": 0, "has/tokens": False,
                **{k: v for c in ("grad_norm", "lr") for k, v in ((c, 0.0), (f"rank/{c}", _I64_MAX))},
                **{k: v for c in MEM_COLUMNS for k, v in ((c, _I64_MIN), (f"has/{c}", False))},
                **{k: v for c in self.means for k, v in ((f"sum/{c}", -0.0), (f"count/{c}", 0))},
                **{k: v for c in self.ors for k, v in ((f"or/{c}", 0), (f"has/or/{c}", False))}}

    def _at(self, steps: np.ndarray):
        """Where the batch's (sorted) steps lie in the per-step arrays, grown to hold them."""
        if not self.a:  # the first batch: no union to take, no arrays to grow
            self.steps = steps
            self.a = {k: np.full(len(steps), v, np.float64 if isinstance(v, float) else np.asarray(v).dtype)
                      for k, v in self._fills().items()}
            return slice(None)
        if np.array_equal(steps, self.steps):
            return slice(None)
        union = np.union1d(self.steps, steps)
        if len(union) != len(self.steps):
            old = np.searchsorted(union, self.steps)
            for k, v in self._fills().items():
                grown = np.full(len(union), v, self.a[k].dtype)
                grown[old] = self.a[k]
                self.a[k] = grown
            self.steps = union
        return slice(None) if np.array_equal(steps, self.steps) else np.searchsorted(self.steps, steps)

    def add(self, df: pl.DataFrame) -> None:
        """One batch: one row per (rank, step), its ranks after the last batch's."""
        if not df.height:
            return
        lay = Layout(df, self.buf)
        if lay.parts is not None:
            # Sparse: the steps of 2**(p-1)+1..2**p rows for each p, whose matrices are at most twice
            # their rows. Halving the steps until the matrices fit: 13.7 s CPU, 0.57 s so (bench_reduce.py
            # --kinds every10 --ranks 1024 --steps 24000 --repeat 1 against that kernel).
            for p in np.unique(lay.parts):
                self.add(df.filter(pl.Series(lay.parts == p)))
            return
        ix, a = self._at(lay.steps), self.a
        a["n_ranks"][ix] += lay.count(lay.filled)
        a["attempt"][ix] = np.maximum(a["attempt"][ix], lay("attempt", _I64_MIN)[0].max(axis=0))
        t = lay("time", -np.inf)
        tmax = t[0].max(axis=0)
        if np.isnan(tmax).any() or np.isposinf(tmax).any():  # (rare) only finite times count
            tmax = np.where(np.isfinite(t[0]), t[0], -np.inf).max(axis=0)
        a["time"][ix] = np.maximum(a["time"][ix], tmax)
        self._step_times(lay, ix)
        self._tokens(lay, ix)
        for c in ("grad_norm", "lr"):
            v, has = lay(c, 0.0)
            slot, rank, ok = lay.lowest(has)
            take = ok & (rank < a[f"rank/{c}"][ix])
            a[c][ix] = np.where(take, v[slot, np.arange(lay.shape[1])], a[c][ix])
            a[f"rank/{c}"][ix] = np.where(take, rank, a[f"rank/{c}"][ix])
        for c in MEM_COLUMNS:
            v, has = lay(c, _I64_MIN)
            a[c][ix] = np.maximum(a[c][ix], v.max(axis=0))
            a[f"has/{c}"][ix] |= True if has is None else has.any(axis=0)
        with np.errstate(invalid="ignore", over="ignore"):  # (inf + -inf: NaN, kept)
            for c in self.means:
                v, has = lay(c, -0.0)  # -0.0: x + -0.0 is x for every x, -0.0 itself included
                v[0] += a[f"sum/{c}"][ix]  # the batches before first, then this one's rows in order
                a[f"sum/{c}"][ix] = _sum_down(v)
                a[f"count/{c}"][ix] += lay.count(has)
        for c in self.ors:
            bits, ok = as_bits(*lay(c, 0.0))
            a[f"or/{c}"][ix] |= np.bitwise_or.reduce(bits, axis=0)
            a[f"has/or/{c}"][ix] |= ok.any(axis=0)

    def _step_times(self, lay: Layout, ix) -> None:
        """step_work_s/_min_s, slowest_rank, and the times kept for the median."""
        a = self.a
        s, has = lay("step_time_s", np.nan, "s")
        n = lay.count(has)
        smax, smin = np.fmax.reduce(s, axis=0), np.fmin.reduce(s, axis=0)
        top = s == smax  # (a mask: argmax down axis 0 of the times would copy them into new pages first)
        if np.isnan(smax).any():  # every time NaN: NaN is the max
            top |= np.isnan(s) & np.isnan(smax) & (True if has is None else has)
        slow = lay.lowest(top)[1]
        best = np.fmax(a["st_max"][ix], smax)
        mine = (n > 0) & _same(smax, best)
        theirs = (a["n_st"][ix] > 0) & _same(a["st_max"][ix], best)
        a["slowest"][ix] = np.minimum(np.where(mine, slow, _I64_MAX), np.where(theirs, a["slowest"][ix], _I64_MAX))
        a["st_max"][ix] = best
        a["st_min"][ix] = np.fmin(a["st_min"][ix], smin)
        a["n_st"][ix] += n
        self.kept.add(s, lay.steps)

    def _tokens(self, lay: Layout, ix) -> None:
        v, has = lay("tokens", 0)
        if self.counts_col:
            counted = lay("_counts", False, "counted")[0]
            has = counted if has is None else has & counted
            v = np.where(has, v, 0)
        self.a["tokens"][ix] += v.sum(axis=0)  # v is 0 where has is False
        self.a["has/tokens"][ix] |= True if has is None else has.any(axis=0)

    def result(self) -> pl.DataFrame:
        """One row per step."""
        if not self.a:
            self._at(self.steps)  # (no rows: no steps)
        a, some = self.a, self.a["n_st"] > 0
        out = {"step": np_array(self.steps), "time": np_array(a["time"], mask=a["time"] == -np.inf),
               "step_work_s": np_array(a["st_max"], mask=~some), "step_work_min_s": np_array(a["st_min"], mask=~some),
               "step_work_median_s": self.kept.median(self.steps, a["n_st"]),
               "slowest_rank": np_array(a["slowest"], mask=~some), "n_ranks": np_array(a["n_ranks"]),
               "attempt": np_array(a["attempt"]), "tokens": np_array(a["tokens"], mask=~a["has/tokens"])}
        for c in ("grad_norm", "lr"):
            out[c] = np_array(a[c], mask=a[f"rank/{c}"] == _I64_MAX)
        for c in MEM_COLUMNS:
            out[c] = np_array(a[c], mask=~a[f"has/{c}"])
        for c in self.ors:
            out[c] = np_array(a[f"or/{c}"], mask=~a[f"has/or/{c}"])
        for c in self.means:
            total, count = a[f"sum/{c}"], a[f"count/{c}"]
            with np.errstate(invalid="ignore", divide="ignore"):
                out[c] = np_array(total / count, mask=count == 0)
        return pl.from_arrow(pa.table({c: out[c] for c in step_columns(self.cols)}))


class _Kept:
    """The window's step times, in buffers reused across windows: while every batch has the same
    steps, each batch's (slots x steps) block (NaN where none), stacked; from the first batch of
    other steps on, only the times that are not NaN, each with its step (``by_step``)."""

    def __init__(self, buf: Buffers, expect: int):
        self.buf, self.n, self.expect = buf, 0, max(expect, 1)
        # Taken at the first batch, on the thread that reduces: the previous window's median
        # (window.Reducer) may still be using the buffers when this window is set up.
        self.v, self.st = np.empty(0), np.empty(0, np.int64)
        self.steps: np.ndarray | None = None  # the blocks' steps; None once by_step
        self.slots = 0

    def _room(self, a: np.ndarray, role: str, dtype, need: int) -> np.ndarray:
        """``a`` if it holds ``need`` values, else a buffer of ``role`` that does, a's values copied."""
        if need <= a.size:
            return a
        if not a.size:  # the window's first: the rows the footers promised
            return self.buf.get(role, dtype, max(self.expect, need))
        grown = self.buf.get(role, dtype, 2 * need)  # more than the footers promised (rare): a new array
        grown[:self.n] = a[:self.n]
        return grown

    def _append(self, v: np.ndarray, st: np.ndarray | None) -> None:
        k = v.size
        self.v = self._room(self.v, "kept", np.float64, self.n + k)
        self.v[self.n:self.n + k] = v.ravel()
        if st is not None:
            self.st = self._room(self.st, "kept/step", np.int64, self.n + k)
            self.st[self.n:self.n + k] = st
        self.n += k

    def add(self, s: np.ndarray, steps: np.ndarray) -> None:
        """A batch's times as (slots x steps), NaN where none."""
        if self.n == 0 or (self.steps is not None and np.array_equal(steps, self.steps)):
            self.steps, self.slots = steps, self.slots + s.shape[0]
            self._append(s, None)
            return
        if self.steps is not None:  # the first batch of other steps: the blocks so far, by step
            # Every block stacked as one (slots x all steps) matrix: 3,172 MiB peak / 6.6 s CPU, 37 MiB /
            # 0.12 s so (bench_reduce.py --kinds wide_step --ranks 4096 --steps 100000 --repeat 1).
            held = self.v[:self.n].reshape(self.slots, len(self.steps))
            self.n, keep = 0, ~np.isnan(held)
            self._append(held[keep], np.broadcast_to(self.steps, held.shape)[keep])
            self.steps = None
        keep = ~np.isnan(s)
        self._append(s[keep], np.broadcast_to(steps, s.shape)[keep])

    def median(self, steps: np.ndarray, n: np.ndarray) -> pa.Array:
        """The median of each step's ``n`` times (NaN sorted last): the middle value or the mean of
        the two middle ones."""
        if self.steps is None:
            return self._by_step(steps, n)
        m = self.v[:self.n].reshape(self.slots, len(steps))
        m.sort(axis=0)  # ~4x faster than np.median's partition along axis 0 of this layout
        cols = np.arange(len(steps))
        hi = m[np.minimum(n // 2, max(self.slots - 1, 0)), cols]
        lo = m[np.maximum(n // 2 - 1, 0), cols]
        return np_array(np.where(n % 2 == 1, hi, (lo + hi) / 2), mask=n == 0)

    def _by_step(self, steps: np.ndarray, n: np.ndarray) -> pa.Array:
        """median() of the times by (step, time), as polars' group_by did: a step's NaN times (not
        kept) come after its other ones."""
        x, at = self.v[:self.n], np.searchsorted(steps, self.st[:self.n])
        x = x[np.lexsort((x, at))]
        count = np.bincount(at, minlength=len(steps))
        start, mid = np.cumsum(count) - count, n // 2

        def nth(i: np.ndarray) -> np.ndarray:  # each step's i-th time, NaN past its last
            return np.where(i < count, x[np.minimum(start + i, max(len(x) - 1, 0))] if len(x) else np.nan, np.nan)
        hi = nth(mid)
        return np_array(np.where(n % 2 == 1, hi, (nth(np.maximum(mid - 1, 0)) + hi) / 2), mask=n == 0)
