"""One window of ranks.parquet as numpy matrices (steps x ranks), when every step of it has one
row per rank: the usual case, far cheaper than polars' per-group quantiles. Windows that are not
full matrices (a rank missing at a step, nulls where a median is taken, two attempts in a
straggler block's window) go the group-by way (perstep.py); both are checked against
tests/reference_math.reference_perstep. (Where they part: a block's median excess over a NaN is
NaN here, a number in polars' median, which leaves NaN out; a one-step block's summed -0.0 excess
is +0.0 here, -0.0 there.)

A matrix is filled into a window's ``Buffers`` (its roles shared by the window's columns), and
the usual row layout (rank by rank, steps ascending, in one or a few row-pass windows:
"segments") is copied segment by segment with no index at all; any other layout is gathered
through an index. Every
reduction is the same numpy call on the same (steps x ranks) layout as before, so the values
are the same bits (a partition or sum in another layout may break ties of -0.0 and 0.0, or add
in another order).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from kforge_dash.ingest.rowpass.buffers import Buffers

# More segments than this (rows in an odd order) and one gather is cheaper than many copies.
MAX_SEGMENTS = 32


class Window:
    """Rows of steps [s0, s0 + S) x the ranks ``ranks``; ``col(name)`` is an S x R matrix.

    ``alias`` names a column that holds the same values as another (a sum over one phase: the
    phase itself), so it is neither read nor gathered twice."""

    def __init__(self, df: pl.DataFrame | None, s0: int, S: int, ranks: np.ndarray, buf: Buffers, *,
                 order: np.ndarray | None = None, segments: list[tuple[int, int, int]] | None = None,
                 alias: dict[str, str] | None = None, attempt: int | None = None):
        self.df, self.s0, self.S, self.ranks, self.buf = df, s0, S, ranks, buf
        self.order, self.segments, self.alias, self.attempt = order, segments, alias or {}, attempt
        self._cols: dict[tuple[str, bool], np.ndarray] = {}  # a column is filled once (per_step, blocks)
        self._meds: dict[str, np.ndarray] = {}
        self.by_rank: dict[str, np.ndarray] = {}

    @classmethod
    def of_matrices(cls, mats: dict[tuple[str, bool], np.ndarray], s0: int, S: int, ranks: np.ndarray,
                    buf: Buffers, *, attempt: int, alias: dict[str, str] | None = None,
                    by_rank: dict[str, np.ndarray] | None = None) -> Window:
        """A window already filled (grid_units.py): no nulls in its own-work, wait and step-time
        matrices, side matrices NaN where null, one ``attempt``."""
        win = cls(None, s0, S, ranks, buf, alias=alias, attempt=attempt)
        win._cols = dict(mats)
        win.by_rank = by_rank or {}  # own-work columns also as (ranks x steps): blocks' lanes contiguous
        return win

    @classmethod
    def of(cls, df: pl.DataFrame, buf: Buffers | None = None, *, alias: dict[str, str] | None = None) -> Window | None:
        n, buf = df.height, buf or Buffers()
        if n == 0 or df["step"].null_count() or df["rank"].null_count():
            return None
        steps, ranks = buf.flat("step", df["step"]), buf.flat("rank", df["rank"])
        seg = _segments(steps, ranks, buf)
        if seg is not None:
            uniq, segments = seg
            s0, S = segments[0][1], sum(k for _, _, k in segments)
            return cls(df, s0, S, uniq, buf, segments=segments, alias=alias)
        s0, r0 = int(steps.min()), int(ranks.min())
        S, R = int(steps.max()) - s0 + 1, int(ranks.max()) - r0 + 1
        if S * R == n:  # ranks r0..r0+R-1: a rank's column is its offset, no search
            order = np.full(n, -1, dtype=np.int64)
            order[(steps - s0) * R + (ranks - r0)] = np.arange(n)
            # n rows in n cells: a cell left empty means another holds two rows
            return cls(df, s0, S, np.arange(r0, r0 + R), buf, order=order, alias=alias) if order.min() >= 0 else None
        uniq = np.unique(ranks)
        R = len(uniq)
        if S * R != n:
            return None
        pos = (steps - s0) * R + np.searchsorted(uniq, ranks)
        if np.bincount(pos, minlength=n).max() != 1:
            return None  # a (step, rank) twice, so another one missing
        order = np.empty(n, dtype=np.int64)
        order[pos] = np.arange(n)
        return cls(df, s0, S, uniq, buf, order=order, alias=alias)

    def series(self, name: str) -> pl.Series:
        return self.df[self.alias.get(name, name)]

    def col(self, name: str, *, nan: bool = False) -> np.ndarray:
        """The column as an S x R matrix (read-only: shared by every caller; valid for this window)."""
        name = self.alias.get(name, name)
        key = (name, nan)
        if key not in self._cols:
            s = self.df[name]
            if nan and s.null_count() == s.len():  # e.g. no checkpoint phase timed: nothing to gather
                m = np.full((self.S, len(self.ranks)), np.nan)
            else:
                a = self.buf.flat("flat", s.fill_null(np.nan) if nan else s)
                m = self.buf.get(f"col/{name}/{nan}", a.dtype, (self.S, len(self.ranks)))
                self._fill(a, m)
            m.flags.writeable = False
            self._cols[key] = m
        return self._cols[key]

    def _fill(self, a: np.ndarray, m: np.ndarray) -> None:
        if self.segments is None:
            np.take(a, self.order, out=m.reshape(-1), mode="clip")  # indices all valid
            return
        R = len(self.ranks)
        for p, lo, k in self.segments:  # rows p.. are R blocks of k steps from lo: a (R x k) matrix
            m[lo - self.s0:lo - self.s0 + k] = a[p:p + R * k].reshape(R, k).T

    def lower_median(self, name: str) -> np.ndarray:
        name = self.alias.get(name, name)
        if name not in self._meds:
            k = (len(self.ranks) - 1) // 2  # an actual rank's value
            m = self.col(name)
            part = self.buf.get("partition", m.dtype, m.shape)
            part[:] = m
            part.partition(k, axis=1)  # np.partition's own algorithm, in place: the same values
            self._meds[name] = part[:, k].copy()
        return self._meds[name]

    def per_step(self, own, data) -> pl.DataFrame | None:
        """perstep.per_step's columns for this window; None when a needed value is null."""
        need = ["step_time_s", "_own", "_wait", *own] + (["_data"] if len(data) > 1 else [])
        if self.df is not None and any(self.series(c).null_count() for c in need):
            return None
        S = self.S
        st, wait = self.col("step_time_s"), self.col("_wait")
        least = np.equal(wait, wait.min(axis=1, keepdims=True), out=self.buf.get("least", np.bool_, wait.shape))
        cand = self.buf.get("cand", st.dtype, st.shape)
        cand[:] = -np.inf
        np.copyto(cand, st, where=least)
        crit = cand.argmax(axis=1)  # least wait; ties to the longest step
        rows = np.arange(S)
        ckpt, ev = self._side("_ckpt"), self._side("_eval")
        med = {c: self.lower_median(c) for c in own}
        out = {
            "step": np.arange(self.s0, self.s0 + S, dtype=np.int64), "own_med": self.lower_median("_own"),
            "data_med": (med[data[0]] if len(data) == 1 else self.lower_median("_data")) if data else np.full(S, np.nan),
            "ckpt_max": _nanmax(ckpt, S), "eval_max": _nanmax(ev, S), "crit_st": st[rows, crit],
            "crit_own": self.col("_own")[rows, crit],
            "crit_side": _at(ckpt, rows, crit) + _at(ev, rows, crit),
            **{f"{c}\0med": m for c, m in med.items()},
        }
        return pl.DataFrame(out).with_columns(pl.col(pl.Float64).fill_nan(None))

    def _side(self, name: str) -> np.ndarray | None:
        """A checkpoint/eval column as a matrix (NaN where null); None when it is absent or null
        throughout (no such phase timed, the usual case): nothing to gather or scan."""
        if self.df is None:
            return self._cols.get((name, True))
        if name not in self.df.columns:
            return None
        s = self.df[name]
        return None if s.null_count() == s.len() else self.col(name, nan=True)

    def blocks(self, med: pl.DataFrame, st_med: np.ndarray, own, W: int) -> pl.DataFrame | None:
        """perstep's straggler blocks for this window (``st_med``: the steps' median step time)."""
        if self.df is None:
            att = np.int64(self.attempt)
        else:
            attempt = self.df["attempt"]
            if attempt.null_count() or attempt.min() != attempt.max():
                return None
            att = np.int64(attempt.min())  # one attempt in the window (checked without building its matrix)
        steps = np.arange(self.s0, self.s0 + self.S, dtype=np.int64)  # (dtype: s0 + S may be 2**63)
        cut = np.flatnonzero(np.diff(steps // W)) + 1
        bounds = list(zip(np.r_[0, cut], np.r_[cut, self.S]))
        R = len(self.ranks)
        out = {"rank": np.tile(self.ranks, len(bounds)), "attempt": np.full(R * len(bounds), att),
               "_block": np.repeat([steps[a] // W for a, _ in bounds], R),
               "first": np.repeat([steps[a] for a, _ in bounds], R),
               "last": np.repeat([steps[b - 1] for _, b in bounds], R),
               "n": np.repeat([b - a for a, b in bounds], R).astype(np.uint32),
               "st": np.repeat([np.median(st_med[a:b]) for a, b in bounds], R)}
        cost = {}
        for c in own:
            m, by_rank = self.col(c), self.by_rank.get(c)
            med_c = med[f"{c}\0med"].to_numpy()
            if by_rank is not None and R > 1 and not np.signbit(by_rank).any():
                out[f"{c}\0ex"], cost[f"{c}\0cost"] = self._by_rank_blocks(by_rank, med_c, bounds)
                continue
            ex = np.subtract(m, med_c[:, None], out=self.buf.get("ex", m.dtype, m.shape))
            pos = self.buf.get("pos", m.dtype, m.shape)
            # the sums first: the medians below partition ex in place (np.median's own algorithm)
            cost[f"{c}\0cost"] = np.concatenate([np.clip(ex[a:b], 0, None, out=pos[a:b]).sum(axis=0) for a, b in bounds])
            out[f"{c}\0ex"] = np.concatenate([np.median(ex[a:b], axis=0, overwrite_input=True) for a, b in bounds])
        return pl.DataFrame(out | cost)

    def _by_rank_blocks(self, m: np.ndarray, med: np.ndarray, bounds) -> tuple[np.ndarray, np.ndarray]:
        """(median excess, summed positive excess) per (block, rank) from (ranks x steps) ``m``: a
        block's lane is contiguous (half the time of np.median down the steps x ranks layout at
        1,024 ranks). The same bits as the steps x ranks way when no value has its sign bit set
        (so no -0.0 anywhere, nor in an excess) and there are two ranks or more: np.median
        partitions the same lanes and takes the same middle values; the steps x ranks sum adds
        each lane in step order (one rank: pairwise, hence not here), as cumsum does."""
        # the steps x ranks way's buffers, and per_step's "cand" (done with by now), in this shape
        ex = np.subtract(m, med[None, :], out=self.buf.get("ex", m.dtype, m.shape))
        pos, acc = self.buf.get("pos", m.dtype, m.shape), self.buf.get("cand", m.dtype, m.shape)
        cost = np.concatenate([np.cumsum(np.clip(ex[:, a:b], 0, None, out=pos[:, a:b]), axis=1, out=acc[:, a:b])[:, -1]
                               for a, b in bounds])
        return np.concatenate([np.median(ex[:, a:b], axis=1, overwrite_input=True) for a, b in bounds]), cost


def _segments(steps: np.ndarray, ranks: np.ndarray, buf: Buffers) -> tuple[np.ndarray, list[tuple[int, int, int]]] | None:
    """(ranks, [(first row, first step, steps)]) when the rows are segments of consecutive steps,
    each rank by rank (ranks ascending, each with the same steps, ascending), one after another
    (the order ingest writes ranks.parquet in); None otherwise."""
    n = len(ranks)
    d = np.subtract(ranks[1:], ranks[:-1], out=buf.get("d", ranks.dtype, n - 1))
    cut = np.flatnonzero(np.less(d, 0, out=buf.get("less", np.bool_, n - 1))) + 1  # back to the first rank
    if len(cut) >= MAX_SEGMENTS:
        return None
    runs = np.flatnonzero(d) + 1
    same = buf.get("same", np.bool_, n)
    bounds, uniq, out, nxt = np.r_[0, cut, n], None, [], None
    for p, q in zip(bounds[:-1], bounds[1:]):
        starts = runs[np.searchsorted(runs, p, "right"):np.searchsorted(runs, q, "left")]
        R = len(starts) + 1
        k = (q - p) // R
        if (q - p) % R or not np.array_equal(starts, np.arange(p + k, q, k)):
            return None
        got = ranks[np.r_[p, starts]]
        if uniq is None:
            uniq = got
        elif not np.array_equal(got, uniq):
            return None
        lo = int(steps[p])
        eq = np.equal(steps[p:q].reshape(R, k), np.arange(lo, lo + k, dtype=np.int64), out=same[p:q].reshape(R, k))
        if (nxt is not None and lo != nxt) or not eq.all():
            return None
        out.append((int(p), lo, int(k)))
        nxt = lo + k
    return uniq, out


def _at(m: np.ndarray | None, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """m[rows, cols] with NaN as 0.0 (a phase not timed adds nothing); zeros for an all-null m."""
    return np.zeros(len(rows)) if m is None else np.nan_to_num(m[rows, cols])


def _nanmax(m: np.ndarray | None, S: int) -> np.ndarray:
    """Row max ignoring NaN; NaN (then null) where the whole row is NaN, never 0.0 (all NaN: m None)."""
    if m is None:
        return np.full(S, np.nan)
    have = ~np.isnan(m)
    return np.where(have.any(axis=1), np.where(have, m, -np.inf).max(axis=1), np.nan)
