"""The thresholds of ingest's findings (kforge-ingest options), chosen so a clean run has none.

Each field has one spec in FINDINGS_SPECS (its check and its help): FindingsOptions validates with
it and kforge-ingest makes one option of each (``--spike-k``, ``--wait-phases``...)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from kforge_dash.ingest import option_spec as spec

FINDINGS_SPECS: dict[str, spec.OptionSpec] = {
    "spike_window": spec.integer(2, "Loss/grad-norm spike: steps of the trailing baseline."),
    "spike_k": spec.positive("Loss/grad-norm spike: this many robust sigmas (IQR / 1.349) above the trailing median."),
    "spike_min_rel": spec.positive("Loss/grad-norm spike: also at least this fraction of the trailing median above it."),
    "grad_spike_min_rel": spec.positive("Grad-norm spike: also at least (1 + this) x its trailing median "
                                        "(gradient norms are heavy-tailed)."),
    "straggler_min_frac": spec.positive("Straggler: own work above the median rank's by this fraction of a step."),
    "straggler_min_steps": spec.integer(2, "Straggler: for at least this many steps."),
    "wait_phases": spec.globs("Phases that hold a collective (time there includes waiting for other ranks), "
                              "comma-separated globs; never a rank's own work."),
    "data_phases": spec.globs("Phases that load data (watched by the data_stall finding), comma-separated globs."),
    "episode_min_rel": spec.positive("Slow episode: the job's step time at least (1 + this) x the level before it."),
    "episode_k": spec.positive("Slow episode: its log shift over this many times the spread of the job's level "
                               "elsewhere (1.4826 x MAD)."),
    "episode_min_steps": spec.integer(2, "Slow episode: for at least this many steps."),
    "stall_window": spec.integer(2, "Data stall: steps of the centred rolling median of the data phase."),
    "stall_min_steps": spec.integer(2, "Data stall: for at least this many steps."),
    "memory_growth_frac": spec.positive("Memory growth: allocated memory of a launch's last 10 % over its 10-25 % "
                                        "stretch by more than this fraction."),
    "data_stall_frac": spec.positive("Data stall: the median rank's data phase over this share of the step, sustained."),
}


@dataclass(frozen=True, kw_only=True)
class FindingsOptions:
    """The thresholds of the findings (docs/findings-and-goodput.md); each field's meaning is its
    ``kforge-ingest`` option's help (FINDINGS_SPECS). A bad value raises ValueError naming it."""

    spike_window: int = 50
    spike_k: float = 6.0
    spike_min_rel: float = 0.1
    grad_spike_min_rel: float = 1.0
    straggler_min_frac: float = 0.1
    straggler_min_steps: int = 20
    # DDP's gradient all-reduce runs inside backward: the time a rank spends there includes waiting.
    wait_phases: tuple[str, ...] = ("*bwd*", "*backward*", "*all_reduce*", "*allreduce*", "*sync*", "*comm*")
    data_phases: tuple[str, ...] = ("data*", "*loader*")
    episode_min_rel: float = 0.25
    episode_k: float = 4.0
    episode_min_steps: int = 20
    stall_window: int = 20
    stall_min_steps: int = 20
    memory_growth_frac: float = 0.1
    data_stall_frac: float = 0.25

    def __post_init__(self):
        spec.validate_all(self, FINDINGS_SPECS)

    def to_dict(self) -> dict:
        """JSON-able (summary.json ``findings_options``, the fingerprint: other thresholds re-ingest the run)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict) -> "FindingsOptions":
        """The inverse of to_dict (lists back to tuples); a bad or unknown key raises ValueError naming it."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"findings: no threshold named {', '.join(unknown)}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})
