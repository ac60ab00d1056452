"""Expected values for tests, written as plain loops independent of the code under test."""

import functools
import math
import operator


def ema_loop(values, alpha):
    """The contract's EMA: the first finite value starts it, then a·x + (1−a)·ema; NaN/inf/None hold it."""
    out, ema = [], None
    for v in values:
        if v is not None and math.isfinite(v):
            ema = v if ema is None else alpha * v + (1 - alpha) * ema
        out.append(ema)
    return out


def _finite(x):
    return x is not None and math.isfinite(x)


def _bits(x):
    """A valid throttle bitmask as an int (finite, 0 <= x < 2**63, fraction dropped), else None."""
    return int(x) if _finite(x) and 0 <= x < 2.0**63 else None


def _median(times):
    """The middle value, or the mean of the two middle ones; NaN sorts last."""
    xs = sorted(times, key=lambda x: (math.isnan(x), 0.0 if math.isnan(x) else x))
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def _same(x, y):
    return x == y or (math.isnan(x) and math.isnan(y))


def reference_steps(rows, means, ors, counts_col):
    """docs/CONTRACT.md's per-step rules ("Ingested outputs", steps.parquet), written plainly: ``rows``
    (dicts, one per (rank, step), in row order) -> {step: {column: value}} (None: null)."""
    by_step = {}
    for r in rows:
        by_step.setdefault(r["step"], []).append(r)
    out = {}
    for step, rs in sorted(by_step.items()):
        times = [r["step_time_s"] for r in rs if r["step_time_s"] is not None]
        real = [t for t in times if not math.isnan(t)]
        top = (max(real) if real else math.nan) if times else None
        ends = [r["time"] for r in rs if _finite(r["time"])]
        counted = [r["tokens"] for r in rs if r["tokens"] is not None and (r["_counts"] or not counts_col)]
        o = {"time": max(ends) if ends else None, "step_work_s": top,
             "step_work_min_s": (min(real) if real else math.nan) if times else None,
             "step_work_median_s": _median(times) if times else None,
             "slowest_rank": min((r["rank"] for r in rs if r["step_time_s"] is not None and _same(r["step_time_s"], top)),
                                 default=None),
             "n_ranks": len(rs), "attempt": max(r["attempt"] for r in rs),
             "tokens": sum(counted) if counted else None}
        for c in ("grad_norm", "lr"):
            got = sorted((r["rank"], r[c]) for r in rs if r[c] is not None)
            o[c] = got[0][1] if got else None
        for c in ("mem_allocated_bytes", "mem_peak_bytes", "mem_reserved_bytes"):
            got = [r[c] for r in rs if r[c] is not None]
            o[c] = max(got) if got else None
        for c in ors:
            got = [b for b in (_bits(r[c]) for r in rs) if b is not None]
            o[c] = functools.reduce(operator.or_, got) if got else None
        for c in means:
            got = [r[c] for r in rs if r[c] is not None]
            total = None
            for v in got:  # one after the other, in row order (rank after rank)
                total = v if total is None else total + v
            o[c] = total / len(got) if got else None
        out[step] = o
    return out


def _lower_median(xs):
    """An actual rank's value: the lower of the two middle ones; NaN sorts last; null is left out."""
    xs = sorted((x for x in xs if x is not None), key=lambda x: (math.isnan(x), 0.0 if math.isnan(x) else x))
    return xs[(len(xs) - 1) // 2] if xs else None


def _plain_median(xs):
    """The middle value or the mean of the two; NaN when one is NaN (numpy's rule); null left out."""
    xs = [x for x in xs if x is not None]
    if not xs or any(math.isnan(x) for x in xs):
        return math.nan if xs else None
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def _work(r, cols):
    """A rank's work over the phases ``cols``: their sum, null phases adding nothing; null if all are."""
    got = [r[c] for c in cols if r.get(c) is not None]
    return sum(got) if got else None


def perstep_rows(raw, ph):
    """ranks.parquet rows (dicts) -> reference_perstep's rows: those with a step time, with the
    derived _own, _data, _ckpt, _eval and _wait (no wait phase timed: 0.0)."""
    return [{**r, "_own": _work(r, ph.own), "_data": _work(r, ph.data), "_ckpt": _work(r, ph.checkpoint),
             "_eval": _work(r, ph.eval), "_wait": _work(r, ph.wait) or 0.0} for r in raw if r["step_time_s"] is not None]


def reference_perstep(rows, own, data_col, W, st_of):
    """docs/findings-and-goodput.md's per-step facts over ranks, written plainly: ``rows`` (dicts
    with step, rank, attempt, step_time_s, the own-work phases ``own`` and _own, _data, _ckpt,
    _eval, _wait: ``perstep_rows``) -> ({step: facts}, {(rank, attempt, block): facts}).
    ``data_col``: the column whose lower median is data_med; ``st_of``: step -> its median step time."""
    by_step, steps = {}, {}
    for r in rows:
        by_step.setdefault(r["step"], []).append(r)
    for step, rs in sorted(by_step.items()):
        rs = sorted(rs, key=lambda r: r["rank"])
        least = min(r["_wait"] for r in rs)
        crit = max((r for r in rs if r["_wait"] == least), key=lambda r: r["step_time_s"])  # first on ties
        side = [r[c] for r in rs for c in ("_ckpt",) if r[c] is not None and not math.isnan(r[c])]
        evs = [r["_eval"] for r in rs if r["_eval"] is not None and not math.isnan(r["_eval"])]
        steps[step] = {"own_med": _lower_median([r["_own"] for r in rs]),
                       "data_med": _lower_median([r[data_col] for r in rs]),
                       "ckpt_max": max(side) if side else None, "eval_max": max(evs) if evs else None,
                       "crit_st": crit["step_time_s"], "crit_own": crit["_own"],
                       "crit_side": (crit["_ckpt"] or 0.0) + (crit["_eval"] or 0.0),
                       **{f"{c}\0med": _lower_median([r[c] for r in rs]) for c in own}}
    blocks = {}
    for r in rows:
        blocks.setdefault((r["rank"], r["attempt"], r["step"] // W), []).append(r)
    out = {}
    for key, rs in blocks.items():
        ss = [r["step"] for r in rs]
        o = {"first": min(ss), "last": max(ss), "n": len(rs), "st": _plain_median([st_of[s] for s in ss])}
        for c in own:
            ex = [r[c] - steps[r["step"]][f"{c}\0med"] for r in rs if r[c] is not None]
            o[f"{c}\0ex"] = _plain_median(ex)
            o[f"{c}\0cost"] = sum(x if math.isnan(x) else max(x, 0.0) for x in ex) if ex else None
        out[key] = o
    return steps, out
