"""The per-step facts over ranks as numpy matrices (steps x ranks), for windows where every step
has one row per rank and no phase of the median or the critical rank is missing: the usual case,
several times faster than polars' per-group quantiles. Other windows go the group-by way
(perstep.py); both give the same values (tests/test_findings_perstep.py).
"""

from __future__ import annotations

import numpy as np
import polars as pl


def per_step_matrix(df: pl.DataFrame, own: tuple[str, ...], data: tuple[str, ...]) -> pl.DataFrame | None:
    """``df``: one window's rows sorted by (step, rank) with ``_own, _data, _ckpt, _eval, _wait``
    (perstep.py). None when the window is not a full steps x ranks matrix without nulls."""
    n = df.height
    if n == 0:
        return None
    steps = df["step"].to_numpy()
    starts = np.flatnonzero(np.r_[True, steps[1:] != steps[:-1]])
    R = n // len(starts)
    if R * len(starts) != n or not (np.diff(np.r_[starts, n]) == R).all():
        return None  # a rank missing at some step
    need = ["step_time_s", "_own", "_wait", *own] + (["_data"] if len(data) > 1 else [])
    if any(df[c].null_count() for c in need):
        return None
    S = len(starts)
    k = (R - 1) // 2  # the lower median: an actual rank's value

    def mat(c):
        return df[c].to_numpy().reshape(S, R)

    def lower_median(c):
        return np.partition(mat(c), k, axis=1)[:, k]

    def nullable(c):
        return df[c].fill_null(np.nan).to_numpy().reshape(S, R)

    st, wait = mat("step_time_s"), mat("_wait")
    # least wait; ties (no wait phases: all zero) to the longest step
    crit = _critical(st, wait)
    rows = np.arange(S)
    ckpt, ev = nullable("_ckpt"), nullable("_eval")
    side = np.nan_to_num(ckpt[rows, crit]) + np.nan_to_num(ev[rows, crit])
    with np.errstate(all="ignore"):
        ckpt_max = np.where(np.isnan(ckpt).all(axis=1), np.nan, np.nanmax(np.where(np.isnan(ckpt), -np.inf, ckpt), axis=1))
        eval_max = np.where(np.isnan(ev).all(axis=1), np.nan, np.nanmax(np.where(np.isnan(ev), -np.inf, ev), axis=1))
    out = {
        "step": steps[starts], "own_med": lower_median("_own"),
        "data_med": lower_median(data[0]) if len(data) == 1 else lower_median("_data") if data else np.full(S, np.nan),
        "ckpt_max": ckpt_max, "eval_max": eval_max, "crit_st": st[rows, crit], "crit_own": mat("_own")[rows, crit],
        "crit_side": side, **{f"{c}\0med": lower_median(c) for c in own},
    }
    return pl.DataFrame(out).with_columns(pl.col(pl.Float64).fill_nan(None))


def _critical(st: np.ndarray, wait: np.ndarray) -> np.ndarray:
    """Per row, the column of least wait, ties to the longest step (then the lowest rank)."""
    least = wait == wait.min(axis=1, keepdims=True)
    return np.where(least, st, -np.inf).argmax(axis=1)
