"""The per-step reductions of one window added up over batches of its ranks (window.py reads a
window far bigger than ``chunk_rows`` in batches: read.read_batches), giving bit for bit what
reduce.reduce_steps gives for the whole window at once.

Batches come in the window's row order and never split a (rank, step). Per step the
accumulator keeps what combines exactly: max/min step time and time, the slowest rank (lowest on
ties), rows, the highest attempt, the tokens sum, the first reported grad_norm/lr (the lowest
reporting rank), memory maxima, the bitwise OR of each bitmask column (reduce.OR_COLUMNS) and
where one was reported, and for each mean a running total to which every rank's value is added
one after the other in row order, as the whole-window reductions add them (so means stay
bit-identical), plus the count. The median needs every value: only the window's
step_time_s is kept (8 bytes a row), in one buffer reused window after window.

Whether the whole window would have taken the matrix path (every batch a grid on the same
steps, ranks ascending) or the group-by path is known only at the end: it picks how the median
is taken (the same values either way) and whether a non-finite time is null (the matrix path's rule).
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa

from kforge_dash.ingest.arrays import np_array
from kforge_dash.ingest.buffers import Buffers
from kforge_dash.ingest.reduce import (
    as_bits,
    as_grid,
    dense_lowest_rank,
    dense_tokens,
    masked,
    mean_columns,
    median_by_group,
    median_down_rows,
    or_columns,
    order_free_aggs,
    step_columns,
)
from kforge_record.schema import MEM_COLUMNS

_I64_MIN = np.iinfo(np.int64).min


class _Kept:
    """The window's step_time_s values, batch after batch, in a buffer reused across windows."""

    def __init__(self, buf: Buffers, expect: int):
        self.buf, self.n, self.expect = buf, 0, max(expect, 1)
        # Taken at the first batch, on the thread that reduces: the previous window's median
        # (window.Reducer) may still be using the buffer when this window is set up.
        self.v = np.empty(0)
        # (first index, values, the step of each value | None, the grid's steps | None): one per batch
        self.segments: list[tuple[int, int, np.ndarray | None, np.ndarray | None]] = []

    def add(self, values: np.ndarray, steps: np.ndarray | None, grid_steps: np.ndarray | None) -> None:
        n = values.size
        if not self.segments:
            self.v = self.buf.get("kept", np.float64, self.expect)
        if self.n + n > self.v.size:  # more rows than the footers promised: grow (rare)
            grown = self.buf.get("kept", np.float64, 2 * (self.n + n))  # a new array: self.v still holds the old
            grown[:self.n] = self.v[:self.n]
            self.v = grown
        self.v[self.n:self.n + n] = values.ravel()
        self.segments.append((self.n, n, steps, grid_steps))
        self.n += n

    def median(self, steps: np.ndarray, dense_rows: int | None) -> pa.Array:
        if dense_rows is not None:  # a grid: (ranks x steps), sorted down the ranks in place
            return median_down_rows(self.v[:self.n].reshape(dense_rows, len(steps)))
        at = np.empty(self.n, np.int64)
        for start, n, st, grid in self.segments:
            at[start:start + n] = st if st is not None else np.tile(grid, n // len(grid))
        return median_by_group(self.v[:self.n], np.searchsorted(steps, at), len(steps))


class StepAcc:
    """Per-step reductions of a window, added batch after batch (``add``), then ``result()``."""

    def __init__(self, cols: list[str], counts_col: bool, buffers: Buffers, *, expect_rows: int):
        self.cols, self.counts_col, self.buf = cols, counts_col, buffers
        self.means = mean_columns(cols)
        self.ors = or_columns(cols)
        self.steps = np.empty(0, np.int64)
        self.a: dict[str, np.ndarray] = {}
        self.kept = _Kept(buffers, expect_rows)
        self.grid = True  # every batch so far a grid on the same steps, ranks ascending
        self.grid_rows = 0
        self.last_rank = None

    # -- the per-step arrays over the union of the batches' steps --

    def _fills(self) -> dict:
        """Every per-step array and its value before any row (has/NAME: whether NAME has one)."""
        f = {"time": -np.inf, "time_nan": False, "st_max": -np.inf, "st_min": np.inf, "slowest": 0, "n_ranks": 0,
             "attempt": _I64_MIN, "tokens": 0, "grad_norm": 0.0, "lr": 0.0,
             **{c: _I64_MIN for c in MEM_COLUMNS}, **{f"sum/{c}": 0.0 for c in self.means},
             **{f"count/{c}": 0 for c in self.means}, **{f"or/{c}": 0 for c in self.ors}}
        f.update({f"has/{k}": False for k in ("time", "st_max", "st_min", "slowest", "tokens", "grad_norm", "lr",
                                               *MEM_COLUMNS, *(f"or/{c}" for c in self.ors))})
        return f

    def _at(self, steps: np.ndarray):
        """Where the batch's (sorted) steps lie in the per-step arrays, grown to hold them."""
        if np.array_equal(steps, self.steps):
            return slice(None)
        union = np.union1d(self.steps, steps)
        if len(union) != len(self.steps):
            old = np.searchsorted(union, self.steps)
            for k, v in self._fills().items():
                grown = np.full(len(union), v, np.float64 if isinstance(v, float) else np.asarray(v).dtype)
                if k in self.a:
                    grown[old] = self.a[k]
                self.a[k] = grown
            self.steps = union
        return slice(None) if np.array_equal(steps, self.steps) else np.searchsorted(self.steps, steps)

    def _max(self, k: str, ix, v: np.ndarray, has: np.ndarray | None, fn=np.fmax) -> None:
        a, h = self.a[k], self.a[f"has/{k}"]
        both = h[ix] if has is None else h[ix] & has
        got = fn(a[ix], v)  # fmax/fmin: NaN ignored unless both are, as polars' max/min
        new = np.where(both, got, v) if has is None else np.where(both, got, np.where(has, v, a[ix]))
        a[ix] = new
        h[ix] = h[ix] | (True if has is None else has)

    def _first(self, k: str, ix, v: np.ndarray, has: np.ndarray | None) -> None:
        """Keep the value of an earlier batch (lower ranks, earlier rows); else this batch's."""
        a, h = self.a[k], self.a[f"has/{k}"]
        take = ~h[ix] if has is None else ~h[ix] & has
        a[ix] = np.where(take, v, a[ix])
        h[ix] = h[ix] | take

    def _slowest(self, ix, st_max: np.ndarray, has_max: np.ndarray | None, slowest: np.ndarray,
                 has_slow: np.ndarray | None) -> None:
        """Slowest rank: the lowest rank whose time is the max; to be called before st_max is combined."""
        prev, had = self.a["st_max"][ix], self.a["has/st_max"][ix]
        has_max = np.ones(len(st_max), bool) if has_max is None else has_max
        best = np.where(had & has_max, np.fmax(prev, st_max), np.where(had, prev, st_max))
        mine = has_max & (True if has_slow is None else has_slow) & _same(st_max, best)
        kept = self.a["slowest"][ix]
        theirs = self.a["has/slowest"][ix] & had & _same(prev, best)
        self.a["slowest"][ix] = np.where(mine & theirs, np.minimum(slowest, kept), np.where(mine, slowest, kept))
        self.a["has/slowest"][ix] = mine | theirs

    def _sum_rows(self, key: str, ix, v: np.ndarray, first: bool) -> None:
        """Add a grid's rows (ranks x steps) to the running totals, one rank after the other."""
        tot = self.a[key]
        if first:
            tot[ix] = v.sum(axis=0)  # numpy adds the rows one after the other (axis 0 is not contiguous)
            return
        run = tot[ix] if not isinstance(ix, slice) else tot
        for row in v:
            run += row
        if not isinstance(ix, slice):
            tot[ix] = run

    # -- batches --

    def add(self, df: pl.DataFrame) -> None:
        """One batch: one row per (rank, step), rank by rank, its ranks after the last batch's."""
        if not df.height:
            return
        g = as_grid(df, self.buf)
        first = not self.a
        if g is None:
            self.grid = False
            self._add_grouped(df)
            return
        if self.grid and not first and not (np.array_equal(g.steps, self.steps) and g.ranks[0] > self.last_rank):
            self.grid = False
        self.last_rank = int(g.ranks[-1])
        self.grid_rows += g.n_ranks
        self._add_grid(g, first)

    def _add_grid(self, g, first: bool) -> None:
        ix = self._at(g.steps)
        t = g("time", -np.inf)[0]
        tmax = t.max(axis=0)  # NaN spreads, as in the matrix path (whose time is then null)
        nan = np.isnan(tmax)
        if nan.any():
            self.a["time_nan"][ix] |= nan
            tmax = np.fmax.reduce(t, axis=0)
        self._max("time", ix, tmax, tmax != -np.inf)  # -inf: no rank's time (a null)
        s = g("step_time_s", None, "s")[0]
        smax = s.max(axis=0)
        self._slowest(ix, smax, None, g.slowest(s, smax), None)
        self._max("st_max", ix, smax, None)
        self._max("st_min", ix, s.min(axis=0), None, np.fmin)
        self.kept.add(s, None, g.steps)
        self.a["n_ranks"][ix] += g.n_ranks
        self.a["attempt"][ix] = np.maximum(self.a["attempt"][ix], g("attempt", None)[0].max(axis=0))
        tok, has = dense_tokens(g, self.counts_col)
        self._add_tokens(ix, tok, has)
        for c in ("grad_norm", "lr"):
            self._first(c, ix, *dense_lowest_rank(g, c))
        for c in MEM_COLUMNS:
            v, has = g(c, _I64_MIN)
            self._max(c, ix, v.max(axis=0), None if has is None else has.any(axis=0), np.maximum)
        for c in self.means:
            v, has = g(c, 0.0)
            self._sum_rows(f"sum/{c}", ix, v, first)
            self.a[f"count/{c}"][ix] += g.n_ranks if has is None else has.sum(axis=0)
        for c in self.ors:
            bits, ok = as_bits(*g(c, 0.0))
            self.a[f"or/{c}"][ix] |= np.bitwise_or.reduce(bits, axis=0)
            self.a[f"has/or/{c}"][ix] |= ok.any(axis=0)

    def _add_tokens(self, ix, tok: np.ndarray, has: np.ndarray | None) -> None:
        self.a["tokens"][ix] += tok if has is None else np.where(has, tok, 0)
        self.a["has/tokens"][ix] |= True if has is None else has

    def _add_grouped(self, df: pl.DataFrame) -> None:
        part = df.group_by("step").agg(order_free_aggs(self.counts_col)).sort("step")
        ix = self._at(part["step"].to_numpy())

        def col(c):
            s = part[c]
            return s.fill_null(0).to_numpy(), s.is_not_null().to_numpy()

        t, has_t = col("time")
        self._max("time", ix, t, has_t)
        smax, has_s = col("step_work_s")
        self._slowest(ix, smax, has_s, *col("slowest_rank"))
        self._max("st_max", ix, smax, has_s)
        self._max("st_min", ix, *col("step_work_min_s"), np.fmin)
        self.a["n_ranks"][ix] += part["n_ranks"].to_numpy()
        self.a["attempt"][ix] = np.maximum(self.a["attempt"][ix], part["attempt"].to_numpy())
        self._add_tokens(ix, *col("tokens"))
        for c in ("grad_norm", "lr"):
            self._first(c, ix, *col(c))
        for c in MEM_COLUMNS:
            self._max(c, ix, *col(c), np.maximum)
        at = np.searchsorted(self.steps, df["step"].to_numpy())  # each row's place in the per-step arrays
        n = len(self.steps)
        for c in self.means:  # added in row order after the totals so far: the same sums as one window
            s = df[c]
            has = s.is_not_null().to_numpy()
            tot = self.a[f"sum/{c}"]
            self.a[f"sum/{c}"] = np.bincount(np.r_[np.arange(n), at[has]], weights=np.r_[tot, s.to_numpy()[has]], minlength=n)
            self.a[f"count/{c}"] += np.bincount(at[has], minlength=n)
        for c in self.ors:
            bits, ok = as_bits(df[c].to_numpy(), df[c].is_not_null().to_numpy())
            np.bitwise_or.at(self.a[f"or/{c}"], at[ok], bits[ok])
            self.a[f"has/or/{c}"][at[ok]] = True
        st = df["step_time_s"]
        has = st.is_not_null().to_numpy()
        self.kept.add(st.to_numpy()[has], df["step"].to_numpy()[has], None)

    # -- the window's steps --

    def result(self) -> pl.DataFrame:
        """One row per step, as reduce_steps gives it for the whole window."""
        a, n = self.a, len(self.steps)
        dense = self.grid and not (n == 1 and self.grid_rows > 1)  # (one step of many ranks: the group-by path)
        time = a["time"]
        has_time = a["has/time"] & ~a["time_nan"] & np.isfinite(time) if dense else a["has/time"]
        out = {"step": np_array(self.steps), "time": masked(time, has_time),
               "step_work_s": masked(a["st_max"], a["has/st_max"]),
               "step_work_min_s": masked(a["st_min"], a["has/st_max"]),
               "step_work_median_s": self.kept.median(self.steps, self.grid_rows if dense else None),
               "slowest_rank": masked(a["slowest"], a["has/slowest"]), "n_ranks": np_array(a["n_ranks"]),
               "attempt": np_array(a["attempt"]), "tokens": masked(a["tokens"], a["has/tokens"])}
        for c in ("grad_norm", "lr", *MEM_COLUMNS):
            out[c] = masked(a[c], a[f"has/{c}"])
        for c in self.ors:
            out[c] = masked(a[f"or/{c}"], a[f"has/or/{c}"])
        for c in self.means:
            total, count = a[f"sum/{c}"], a[f"count/{c}"]
            with np.errstate(invalid="ignore", divide="ignore"):
                out[c] = np_array(total / count, mask=count == 0)
        return pl.from_arrow(pa.table(out)).select(step_columns(self.cols))


def _same(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """x == y, NaN equal to NaN (polars' float equality, as in its slowest-rank filter)."""
    return (x == y) | (np.isnan(x) & np.isnan(y))
