"""One window of ranks.parquet as numpy matrices (steps x ranks), when every step of it has one
row per rank: the usual case, far cheaper than polars' per-group quantiles. Windows that are not
full matrices (a rank missing at a step, nulls where a median is taken, two attempts in a
straggler block's window) go the group-by way (perstep.py); both give the same values
(tests/test_findings_perstep.py).
"""

from __future__ import annotations

import numpy as np
import polars as pl


class Window:
    """Rows of steps [s0, s0 + S) x the ranks ``ranks``; ``col(name)`` is an S x R matrix."""

    def __init__(self, df: pl.DataFrame, order: np.ndarray, s0: int, S: int, ranks: np.ndarray):
        self.df, self.order, self.s0, self.S, self.ranks = df, order, s0, S, ranks
        self._cols: dict[tuple[str, bool], np.ndarray] = {}  # a column is gathered once (per_step, blocks)

    @classmethod
    def of(cls, df: pl.DataFrame) -> Window | None:
        n = df.height
        if n == 0 or df["step"].null_count() or df["rank"].null_count():
            return None
        steps, ranks = df["step"].to_numpy(), df["rank"].to_numpy()
        s0, r0 = int(steps.min()), int(ranks.min())
        S, R = int(steps.max()) - s0 + 1, int(ranks.max()) - r0 + 1
        if S * R == n:  # ranks r0..r0+R-1 (the usual case): a rank's column is its offset, no search
            order = np.full(n, -1, dtype=np.int64)
            order[(steps - s0) * R + (ranks - r0)] = np.arange(n)
            # n rows in n cells: a cell left empty means another holds two rows
            return cls(df, order, s0, S, np.arange(r0, r0 + R)) if order.min() >= 0 else None
        uniq = np.unique(ranks)
        R = len(uniq)
        if S * R != n:
            return None
        pos = (steps - s0) * R + np.searchsorted(uniq, ranks)
        if np.bincount(pos, minlength=n).max() != 1:
            return None  # a (step, rank) twice, so another one missing
        order = np.empty(n, dtype=np.int64)
        order[pos] = np.arange(n)
        return cls(df, order, s0, S, uniq)

    def col(self, name: str, *, nan: bool = False) -> np.ndarray:
        """The column as an S x R matrix (read-only: shared by every caller)."""
        key = (name, nan)
        if key not in self._cols:
            s = self.df[name]
            if nan and s.null_count() == s.len():  # e.g. no checkpoint phase timed: nothing to gather
                m = np.full((self.S, len(self.ranks)), np.nan)
            else:
                a = (s.fill_null(np.nan) if nan else s).to_numpy()
                m = np.take(a, self.order).reshape(self.S, len(self.ranks))
            m.flags.writeable = False
            self._cols[key] = m
        return self._cols[key]

    def lower_median(self, name: str) -> np.ndarray:
        k = (len(self.ranks) - 1) // 2  # an actual rank's value
        return np.partition(self.col(name), k, axis=1)[:, k]

    def per_step(self, own, data) -> pl.DataFrame | None:
        """perstep.per_step's columns for this window; None when a needed value is null."""
        need = ["step_time_s", "_own", "_wait", *own] + (["_data"] if len(data) > 1 else [])
        if any(self.df[c].null_count() for c in need):
            return None
        S = self.S
        st, wait = self.col("step_time_s"), self.col("_wait")
        least = wait == wait.min(axis=1, keepdims=True)
        crit = np.where(least, st, -np.inf).argmax(axis=1)  # least wait; ties to the longest step
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
        """A checkpoint/eval column as a matrix (NaN where null); None when it is null throughout
        (no such phase timed, the usual case): nothing to gather or scan."""
        s = self.df[name]
        return None if s.null_count() == s.len() else self.col(name, nan=True)

    def blocks(self, med: pl.DataFrame, st_med: np.ndarray, own, W: int) -> pl.DataFrame | None:
        """perstep's straggler blocks for this window (``st_med``: the steps' median step time)."""
        attempt = self.df["attempt"]
        if attempt.null_count() or attempt.min() != attempt.max():
            return None
        att = np.int64(attempt.min())  # one attempt in the window (checked without building its matrix)
        steps = np.arange(self.s0, self.s0 + self.S)
        cut = np.flatnonzero(np.diff(steps // W)) + 1
        bounds = list(zip(np.r_[0, cut], np.r_[cut, self.S]))
        R = len(self.ranks)
        ex = {c: self.col(c) - med[f"{c}\0med"].to_numpy()[:, None] for c in own}
        out = {"rank": np.tile(self.ranks, len(bounds)), "attempt": np.full(R * len(bounds), att),
               "_block": np.repeat([steps[a] // W for a, _ in bounds], R),
               "first": np.repeat([steps[a] for a, _ in bounds], R),
               "last": np.repeat([steps[b - 1] for _, b in bounds], R),
               "n": np.repeat([b - a for a, b in bounds], R).astype(np.uint32),
               "st": np.repeat([np.median(st_med[a:b]) for a, b in bounds], R)}
        for c in own:
            out[f"{c}\0ex"] = np.concatenate([np.median(ex[c][a:b], axis=0) for a, b in bounds])
            out[f"{c}\0cost"] = np.concatenate([np.clip(ex[c][a:b], 0, None).sum(axis=0) for a, b in bounds])
        return pl.DataFrame(out)


def _at(m: np.ndarray | None, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """m[rows, cols] with NaN as 0.0 (a phase not timed adds nothing); zeros for an all-null m."""
    return np.zeros(len(rows)) if m is None else np.nan_to_num(m[rows, cols])


def _nanmax(m: np.ndarray | None, S: int) -> np.ndarray:
    """Row max ignoring NaN; NaN (then null) where the whole row is NaN, never 0.0 (all NaN: m None)."""
    if m is None:
        return np.full(S, np.nan)
    have = ~np.isnan(m)
    return np.where(have.any(axis=1), np.where(have, m, -np.inf).max(axis=1), np.nan)
