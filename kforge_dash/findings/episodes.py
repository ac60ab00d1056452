"""Slow episodes: stretches where the whole job's step time shifts up and (usually) back down.

The step time of steps.parquet (the slowest rank's, so every rank waited that long) of one launch
is cut into segments of constant level by change-point detection, then a segment that sits above
the one before it by ``episode_min_rel`` (with any slow segments after it) is an episode:

1. x = log(step time): a 1.5x slowdown is the same shift at any step time, and the noise of a
   step time is roughly proportional to it.
2. Long launches are cut into at most ``MAX_BLOCKS`` blocks of ``b`` steps and each block is
   replaced by its median (short ones are smoothed by a centred 5-step rolling median instead): a
   checkpoint or eval step (one slow step) is not a change of level.
3. PELT (Killick, Fearnhead & Eckley 2012, "Optimal detection of changepoints with a linear
   computational cost", JASA 107:1590) with the L2 cost (sum of squared deviations from the
   segment mean, from cumulative sums) and a BIC-like penalty ``PENALTY_BETA * sigma^2 * log(n)``,
   sigma the robust noise of the series (1.4826 x MAD of its first differences / sqrt 2, of the raw
   log step times when they were only smoothed, at least
   ``MIN_SIGMA``); segments of at least ``episode_min_steps`` steps. With blocks, each change point
   is then moved to the best single split at full resolution within a block either side.
4. A segment whose median step time is over (1 + ``episode_min_rel``) x that of the segment before
   it starts a candidate; it goes on while the segments stay over that threshold. ``factor`` (the
   finding's score) = the candidate's median step time / the median of the segments either side of
   it (only the one before when the launch ends in it: the episode "had not ended").
5. A candidate is an episode when factor > 1 + ``episode_min_rel`` and log(factor) > ``episode_k``
   x the spread (1.4826 x MAD) of the ``episode_min_steps``-step rolling median of log step time
   outside it: a job whose step time wanders by 1.5x all along (a shared machine) has no episode
   in a 1.5x bump; one that ran steadily has.

A slow episode is severity info: it names no fault of the job (a shared machine's other jobs make them
on clean runs), only when and how much the whole job slowed. One that a data stall or a straggler
explains is theirs (below).

The first segment of a launch is never an episode (nothing before it: warm-up, compilation). An
episode over half covered by straggler or data-stall findings of the launch that began with it is
theirs (the job waited for one rank, or for its input: that finding names it), not reported again.
Limits: a slow drift (a staircase of steps each under the threshold) is not an episode; an
episode shorter than ``episode_min_steps`` steps is not seen; one rank slowing is a straggler
(stragglers.py), found by comparing ranks, not here.

Why not the ``ruptures`` library (benchmarks/bench_change_points.py, side by side): on the raw
series its C kernel PELT takes 39 s and its binary segmentation 13 s on 100,000 steps (this: 0.2 s),
its Python PELT 1.4 s on 2,000; fed the same <= 2,000 block medians its C PELT would be faster than
this (19 vs 84 ms), but ruptures needs scipy (113 MB installed, 1.2 s to import in every ingest)
for what is 40 lines of numpy here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import polars as pl

from kforge_dash import text
from kforge_dash.findings.finding import Finding, RunFacts, steps_range

MAX_BLOCKS = 2000  # PELT's worst case is quadratic in the points: at most 2,000 (a few ms)
PENALTY_BETA = 3.0  # x sigma^2 log(n) per change point (BIC has 2; a little more against noise)
MIN_SIGMA = 0.01  # a 1% floor on the noise of log step time (a fake clock's steps have none)


def pelt_l2(y: np.ndarray, penalty: float, min_size: int) -> list[int]:
    """The change points of ``y`` (indices where a new segment starts, ascending) minimising the
    summed squared deviations from each segment's mean plus ``penalty`` per change point, every
    segment at least ``min_size`` points (PELT: exact, with pruning)."""
    n = len(y)
    if n < 2 * min_size:
        return []
    s1 = np.concatenate([[0.0], np.cumsum(y)])
    s2 = np.concatenate([[0.0], np.cumsum(y * y)])

    def cost(starts: np.ndarray, t: int) -> np.ndarray:
        length = t - starts
        return (s2[t] - s2[starts]) - (s1[t] - s1[starts]) ** 2 / length

    best = np.full(n + 1, np.inf)
    best[0] = -penalty
    last = np.zeros(n + 1, dtype=np.int64)
    cands = np.zeros(0, dtype=np.int64)
    for t in range(min_size, n + 1):
        s = t - min_size  # a segment [s, t) may start here once [0, s) can be cut into segments
        if s == 0 or np.isfinite(best[s]):
            cands = np.append(cands, s)
        if cands.size == 0:
            continue
        vals = best[cands] + cost(cands, t)
        i = int(np.argmin(vals))
        best[t], last[t] = vals[i] + penalty, cands[i]
        cands = cands[vals <= best[t]]  # pruning: these can never start the best last segment again
    out, t = [], n
    while t > 0:
        t = int(last[t])
        if t > 0:
            out.append(t)
    return sorted(out)


def _refine(x: np.ndarray, cps: list[int], b: int) -> list[int]:
    """Each change point (in steps) moved to the best single split within ``b`` steps of it, of the
    stretch between its neighbours."""
    s1 = np.concatenate([[0.0], np.cumsum(x)])
    s2 = np.concatenate([[0.0], np.cumsum(x * x)])

    def cost(a, c):
        return (s2[c] - s2[a]) - (s1[c] - s1[a]) ** 2 / (c - a)

    out = []
    bounds = [0, *cps, len(x)]
    for i, c in enumerate(cps, start=1):
        a, z = out[-1] if out else bounds[i - 1], bounds[i + 1]
        ks = np.arange(max(a + 1, c - b), min(z - 1, c + b) + 1)
        if ks.size == 0:
            out.append(c)
            continue
        total = cost(a, ks) + cost(ks, z)
        out.append(int(ks[int(np.argmin(total))]))
    return out


def change_points(step_time: np.ndarray, min_steps: int) -> list[int]:
    """Indices into ``step_time`` (> 0, in step order) where its level changes."""
    x = np.log(step_time)
    n = len(x)
    b = max(1, math.ceil(n / MAX_BLOCKS))
    if b == 1:
        y = pl.Series(x).rolling_median(window_size=5, min_samples=1, center=True).to_numpy()
    else:
        pad = (-n) % b
        y = np.nanmedian(np.concatenate([x, np.full(pad, np.nan)]).reshape(-1, b), axis=1)
    diffs = np.diff(y if b > 1 else x)  # the noise of the points PELT cuts (the rolling median's is correlated: the raw)
    sigma = 1.4826 * float(np.median(np.abs(diffs - np.median(diffs)))) / math.sqrt(2) if diffs.size else 0.0
    sigma = max(sigma, MIN_SIGMA)
    cps = pelt_l2(y, PENALTY_BETA * sigma**2 * math.log(max(len(y), 2)), max(2, math.ceil(min_steps / b)))
    cps = [min(c * b, n) for c in cps]
    return _refine(x, cps, b) if b > 1 else cps


def _spread(level: np.ndarray, a: int, z: int) -> float:
    """1.4826 x MAD of ``level`` outside [a, z]: how far the job's level wanders elsewhere."""
    o = np.concatenate([level[:a], level[z + 1:]])
    o = o[np.isfinite(o)]
    return 1.4826 * float(np.median(np.abs(o - np.median(o)))) if o.size else 0.0


@dataclass(frozen=True)
class Episode:
    first: int  # index into the launch's step times, inclusive
    last: int
    factor: float  # the episode's median step time / the median of the segments either side


def episodes(t: np.ndarray, cps: list[int], *, min_rel: float, k: float, min_steps: int) -> list[Episode]:
    """The episodes of ``t`` (step times) cut at ``cps``."""
    bounds = [0, *cps, len(t)]
    segs = [(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]
    meds = [float(np.median(t[a:z])) for a, z in segs]
    level = pl.Series(np.log(t)).rolling_median(window_size=min_steps, min_samples=min_steps // 2, center=True).to_numpy()
    out, i = [], 1
    while i < len(segs):
        ref = meds[i - 1]
        if meds[i] <= (1 + min_rel) * ref:
            i += 1
            continue
        j = i
        while j + 1 < len(segs) and meds[j + 1] > (1 + min_rel) * ref:
            j += 1
        a, z = segs[i][0], segs[j][1] - 1
        around = t[segs[i - 1][0]:segs[i - 1][1]]
        if j + 1 < len(segs):
            around = np.concatenate([around, t[segs[j + 1][0]:segs[j + 1][1]]])
        factor = float(np.median(t[a:z + 1])) / float(np.median(around))
        if factor > 1 + min_rel and math.log(factor) > k * _spread(level, a, z):
            out.append(Episode(a, z, factor))
        i = j + 1
    return out


def _straggled(first: int, last: int, att: int, facts: RunFacts, stragglers: list[Finding]) -> bool:
    """Whether stragglers of this launch that began with the stretch (not over ``episode_min_steps``
    steps before it: one that was there all along is in the level before too) cover over half of
    steps first..last: then the job waited for one rank (the straggler finding says which)."""
    launch = set(facts.ranks_of(att))
    spans = sorted((max(first, f.first_step), min(last, f.last_step)) for f in stragglers
                   if f.first_step is not None and set(f.ranks) & launch
                   and f.first_step >= first - facts.opts.episode_min_steps)
    covered, end = 0, None  # step numbers in the union of the spans, counted without listing them (they may be far apart)
    for lo, hi in spans:
        if end is not None and lo <= end:
            lo = end + 1
        if hi >= lo:
            covered += hi - lo + 1
        end = hi if end is None else max(end, hi)
    return covered > (last - first + 1) / 2


def slow_episode_findings(facts: RunFacts, stragglers: list[Finding] = ()) -> list[Finding]:
    """``stragglers``: the run's straggler and data-stall findings (a stretch they explain is theirs)."""
    opts, out = facts.opts, []
    m = opts.episode_min_steps
    for att in facts.steps["attempt"].unique().sort().to_list():
        # The ranks' longest own step time (step_work_s), not the period (step_time_s): an eval or a
        # checkpoint between steps lengthens one period, and a few of them can pass for a level shift.
        s = (facts.steps.filter((pl.col("attempt") == att) & pl.col("step_work_s").is_finite() & (pl.col("step_work_s") > 0))
             .select("step", "step_work_s").sort("step"))
        if s.height < 3 * m:
            continue
        t, steps = s["step_work_s"].to_numpy(), s["step"].to_numpy()
        for ep in episodes(t, change_points(t, m), min_rel=opts.episode_min_rel, k=opts.episode_k, min_steps=m):
            a, z, factor = ep.first, ep.last, ep.factor
            first, last = int(steps[a]), int(steps[z])
            if _straggled(first, last, att, facts, stragglers):
                continue
            slow = float(np.median(t[a:z + 1]))
            ended = z < len(t) - 1
            ranks = facts.ranks_of(att)
            lost = max(0.0, float(np.sum(t[a:z + 1])) - (z - a + 1) * slow / factor)
            out.append(Finding(
                kind="slow_episode", metric="step_time_s", severity="info", first_step=first, last_step=last,
                ranks=ranks, hosts=facts.hosts_of(ranks, {att}), score=factor, cost_s=lost,
                message=(f"The whole job's step time rose to {text.duration(slow)} (median) at {steps_range(first, last)}, "
                         f"{factor:.2f}x the {text.duration(slow / factor)} around it"
                         + (", then came back" if ended else ", and had not come back by this launch's last step")
                         + f" ({text.duration(lost)} lost)"
                         + ": every rank slowed at once (shared storage, network, other jobs, a config change), "
                           "not one straggler."),
            ))
    return out
