"""A finding (one thing that went wrong, where, and what it cost) and the run facts detectors share."""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass, field

from kforge_dash import text
from kforge_record.schema import PHASE_PREFIX

SEVERITIES = ("error", "warning", "info")  # most severe first


@dataclass(frozen=True, kw_only=True)
class Finding:
    kind: str
    severity: str
    message: str  # one plain sentence a person can act on
    first_step: int | None
    last_step: int | None
    metric: str | None = None
    phase: str | None = None
    ranks: tuple[int, ...] = ()
    hosts: tuple[str, ...] = ()
    score: float | None = None
    cause: str | None = None  # straggler only (added key): the hardware episode behind it (hardware.py)
    reasons: tuple[str, ...] | None = None  # hw_throttle only (added key): NVML throttle reasons by name
    # straggler, data_stall, slow_episode (added key): the seconds the fault cost the job, the one figure
    # the message, the materiality rule (straggler_costs.material) and the what-if use
    cost_s: float | None = None

    def __post_init__(self):
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity: one of {SEVERITIES}, got {self.severity!r}")

    def to_dict(self) -> dict:
        score = None if self.score is None or not math.isfinite(self.score) else round(float(self.score), 4)
        return {"kind": self.kind, "metric": self.metric, "phase": self.phase, "ranks": sorted(self.ranks),
                "hosts": sorted(self.hosts), "first_step": self.first_step, "last_step": self.last_step,
                "severity": self.severity, "score": score, "message": self.message,
                **({"cause": self.cause} if self.kind == "straggler" else {}),
                **({"reasons": list(self.reasons)} if self.reasons is not None else {}),
                **({"cost_s": round(float(self.cost_s), 4)} if self.cost_s is not None and math.isfinite(self.cost_s)
                   else {})}


def sort_key(f: Finding):
    return (SEVERITIES.index(f.severity), f.first_step if f.first_step is not None else -1, f.kind)


@dataclass(frozen=True, kw_only=True)
class Phases:
    """The run's phase columns (``time/NAME_s``) by role."""

    own: tuple[str, ...]  # a rank's own work: compared across ranks for stragglers
    wait: tuple[str, ...]  # hold a collective: waiting for other ranks lands here
    data: tuple[str, ...]
    checkpoint: tuple[str, ...]
    eval: tuple[str, ...]

    def to_dict(self) -> dict[str, list[str]]:
        """summary.json ``phases``: ``{own, wait, data, checkpoint, eval}``, each a list of phase columns."""
        return {k: list(getattr(self, k)) for k in PHASE_CLASSES}

    @classmethod
    def from_summary(cls, summary: dict) -> "Phases | None":
        """The phase classes ingest used, from summary.json's ``phases``; None when it has none (a
        summary written before they were recorded: re-ingest the run)."""
        d = summary.get("phases")
        if not isinstance(d, dict) or not all(isinstance(d.get(k), list) for k in PHASE_CLASSES):
            return None
        return cls(**{k: tuple(str(c) for c in d[k]) for k in PHASE_CLASSES})


PHASE_CLASSES = ("own", "wait", "data", "checkpoint", "eval")


def phase_name(column: str) -> str:
    return column[len(PHASE_PREFIX):-2] if column.startswith(PHASE_PREFIX) and column.endswith("_s") else column


def classify_phases(columns, opts) -> Phases:
    """Checkpoint (``checkpoint*``/``ckpt*``) and eval (``eval*``) phases are goodput buckets of their
    own, never straggling; wait phases (opts.wait_phases) hold collectives; the rest is own work."""
    def match(name, pats):
        return any(fnmatch.fnmatchcase(name.lower(), p.lower()) for p in pats)

    cols = [c for c in columns if c.startswith(PHASE_PREFIX) and c.endswith("_s")]
    ckpt = tuple(c for c in cols if match(phase_name(c), ("checkpoint*", "ckpt*")))
    ev = tuple(c for c in cols if match(phase_name(c), ("eval*",)) and c not in ckpt)
    wait = tuple(c for c in cols if c not in ckpt + ev and match(phase_name(c), opts.wait_phases))
    own = tuple(c for c in cols if c not in ckpt + ev + wait)
    data = tuple(c for c in own if match(phase_name(c), opts.data_phases))
    return Phases(own=own, wait=wait, data=data, checkpoint=ckpt, eval=ev)


@dataclass
class RunFacts:
    """What every detector may read: the steps, where ranks.parquet is, launches and their hosts."""

    steps: object  # polars DataFrame of steps.parquet
    ranks_path: str
    launches: list
    summary: dict
    opts: object  # FindingsOptions
    phases: Phases
    hosts: dict = field(default_factory=dict)  # (attempt, rank) -> host

    def hosts_of(self, ranks, attempts=None) -> tuple[str, ...]:
        out = {h for (a, r), h in self.hosts.items() if r in set(ranks) and (attempts is None or a in attempts) and h}
        return tuple(sorted(out))

    def ranks_of(self, attempt: int | None = None) -> tuple[int, ...]:
        if attempt is None:
            return tuple(sorted(self.summary.get("ranks") or []))
        return tuple(sorted(r for (a, r) in self.hosts if a == attempt))


def steps_range(first: int, last: int) -> str:
    """"step 5", "steps 151–400": text.step_range, the one way every front end writes a range of steps."""
    return text.step_range(int(first), int(last))
