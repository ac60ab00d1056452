"""The thresholds of ingest's findings (kforge-ingest options), chosen so a clean run has none."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass


@dataclass(frozen=True, kw_only=True)
class FindingsOptions:
    # loss / grad-norm spikes: value > trailing median + max(k * sigma, rel * |median|), sigma from
    # the trailing window's interquartile range (IQR / 1.349, a robust standard deviation).
    spike_window: int = 50  # trailing steps of the baseline
    spike_k: float = 6.0
    spike_min_rel: float = 0.1
    # Gradient norms are heavy-tailed (x1.8 swings on clean runs): a grad-norm spike must also be
    # at least (1 + this) x its trailing median.
    grad_spike_min_rel: float = 1.0
    # straggler: a rank's own work in a phase above the median rank's, by at least this fraction
    # of the median step time, in blocks of steps covering at least straggler_min_steps steps.
    straggler_min_frac: float = 0.1
    straggler_min_steps: int = 20
    # Phases that hold a collective (DDP's gradient all-reduce runs inside backward): the time a
    # rank spends there includes waiting for the others, so it is never counted as its own work.
    wait_phases: tuple[str, ...] = ("*bwd*", "*backward*", "*all_reduce*", "*allreduce*", "*sync*", "*comm*")
    data_phases: tuple[str, ...] = ("data*", "*loader*")
    # slow_episode (episodes.py): the whole job's step time over (1 + episode_min_rel) x the level
    # before it for at least episode_min_steps steps, found by change-point detection, and its
    # log shift over episode_k x the spread of the job's level elsewhere (its 1.4826 x MAD).
    episode_min_rel: float = 0.25
    episode_k: float = 4.0
    episode_min_steps: int = 20
    # data_stall: a centred rolling median of stall_window steps, for >= stall_min_steps.
    stall_window: int = 20
    stall_min_steps: int = 20
    # memory_growth: allocated memory of the last 10% of a launch over that of its 10-25% stretch.
    memory_growth_frac: float = 0.1
    # data_stall: the median rank's data phase over this share of the step time, sustained.
    data_stall_frac: float = 0.25

    def __post_init__(self):
        for name in ("spike_window", "straggler_min_steps", "episode_min_steps", "stall_window",
                     "stall_min_steps"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 2:
                raise ValueError(f"{name}: must be an integer >= 2, got {v!r}")
        for name in ("spike_k", "spike_min_rel", "grad_spike_min_rel", "straggler_min_frac", "episode_min_rel", "episode_k",
                     "memory_growth_frac", "data_stall_frac"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"{name}: must be a positive finite number, got {v!r}")
        for name in ("wait_phases", "data_phases"):
            v = getattr(self, name)
            if not isinstance(v, tuple) or not all(isinstance(p, str) and p for p in v):
                raise TypeError(f"{name}: must be a tuple of non-empty glob patterns, got {v!r}")

    def to_dict(self) -> dict:
        """JSON-able, for the fingerprint: other thresholds re-ingest the run."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}
