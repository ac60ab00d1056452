"""The types of ingest's interface: its options, its result, its errors."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from kforge_dash.contract import INGESTED_DIR
from kforge_dash.findings.thresholds import FindingsOptions
from kforge_dash.ingest import option_spec as spec
from kforge_dash.ingest.shipped import DriverBytes
from kforge_record.checks import check_flag, check_int, check_seconds


class IngestError(Exception):
    """Nothing could be ingested from a path; the message names the path and the problem."""


class IngestNotReady(IngestError):
    """The run has recorded nothing yet (no part file, and the job has not closed): a job before
    its first flush. Not a failure: ``kforge-ingest --watch`` reports the run as waiting."""


class PartVanished(Exception):
    """A listed part file is gone: the recorder merged it into a bigger part since the listing
    (kforge_record/compact.py). Ingest lists the run again; the message names the file."""


class IngestWarning(UserWarning):
    """Something was skipped or could not be derived; the run was still ingested (see summary)."""


INGEST_SPECS: dict[str, spec.OptionSpec] = {
    "alpha": spec.fraction("EMA smoothing factor of the *_ema columns.", optional=True),
    "peak_tflops": spec.positive("Peak dense TFLOPS per GPU for MFU; beats meta.json and the device table.", optional=True),
    "flops_per_token": spec.positive("Model FLOPs per token for MFU; beats the model the Recorder recorded.", optional=True),
}
# The options kept with the run (RUN/ingested/options.json, kept.py): given once, used by every later ingest.
KEPT_OPTIONS = ("alpha", "peak_tflops", "flops_per_token")
DEFAULT_ALPHA = 0.1


@dataclass(frozen=True, kw_only=True)
class IngestOptions:
    """What one ingest is asked to do. The options that decide the outputs (``alpha``, ``peak_tflops``,
    ``flops_per_token``, ``findings``) are *kept* with the run when given (RUN/ingested/options.json)
    and used by every later ingest of it until given again or dropped with ``reset_options``; None
    (not given) takes the kept value, else the default. A bad value raises ValueError naming it, with
    the message ``kforge-ingest`` gives for it.

    Attributes:
        alpha: EMA smoothing factor of the ``*_ema`` columns, in (0, 1] (default 0.1).
        peak_tflops: peak dense TFLOPS per GPU for MFU (default: meta.json's, else the device table's).
        flops_per_token: model FLOPs per token for MFU (default: from the recorded model description).
        findings: thresholds given now: a mapping of some (``{"spike_k": 8.0}``) or a FindingsOptions
            (all of them); the others are kept or default.
        reset_options: forget the run's kept options first (then the given ones are kept).
        force: re-ingest even when the inputs and options are unchanged.
        chunk_rows: rows per step window, which bounds memory (~200 bytes a row); for tests and benchmarks.
        lock_timeout_s: wait this long for another ingest of the run to finish, then fail the run.
    """

    alpha: float | None = None
    peak_tflops: float | None = None
    flops_per_token: float | None = None
    findings: Mapping[str, object] | FindingsOptions | None = None
    reset_options: bool = False
    force: bool = False
    # Rows a window or batch (memory ~200 bytes each with polars' work space). 500k, not 1M: peak 0.44 vs
    # 0.63 GB at 64 x 100k with the same user CPU and less system time (3.0-3.3 vs 3.4-5.8 s wall), and
    # 0.95 vs 1.14 GiB at 1,024 x 100k (issue 29's 1 GiB goal); /usr/bin/time on ingest_run, see docs/scale.md.
    chunk_rows: int = 500_000
    lock_timeout_s: float = 600.0

    def __post_init__(self):
        spec.validate_all(self, INGEST_SPECS)
        check_flag("reset_options", self.reset_options)
        check_flag("force", self.force)
        check_int("chunk_rows", self.chunk_rows, 1)
        check_seconds("lock_timeout_s", self.lock_timeout_s)
        f = self.findings
        # a plain dict (not a MappingProxyType): IngestOptions is pickled to Dask workers
        if isinstance(f, FindingsOptions):
            object.__setattr__(self, "findings", f.to_dict())
        elif f is not None:
            if not isinstance(f, Mapping):
                raise TypeError(f"findings: must be a FindingsOptions or a mapping of thresholds, got {type(f).__name__}")
            FindingsOptions.from_dict(dict(f))  # each value checked by its own spec, naming it
            object.__setattr__(self, "findings", dict(f))

    def given(self) -> dict:
        """The options that decide the outputs given here, JSON-able: ``{"alpha": 0.05, "findings": {...}}``."""
        out: dict = {k: float(getattr(self, k)) for k in KEPT_OPTIONS if getattr(self, k) is not None}
        if self.findings:
            full = FindingsOptions.from_dict(dict(self.findings)).to_dict()
            out["findings"] = {k: full[k] for k in self.findings}
        return out


GIVEN, KEPT, DEFAULT = "given now", "kept from an earlier ingest", "default"  # where a decided option came from


@dataclass(frozen=True, kw_only=True)
class DecidedOptions:
    """The options an ingest used (given now, else kept with the run, else default: kept.py) and where
    each came from: ``sources`` maps ``alpha``, ``peak_tflops``, ``flops_per_token`` and
    ``findings.NAME`` to GIVEN, KEPT or DEFAULT. ``kept``: what RUN/ingested/options.json holds after."""

    alpha: float
    peak_tflops: float | None
    flops_per_token: float | None
    findings: FindingsOptions
    sources: Mapping[str, str]
    kept: Mapping[str, object]

    def to_dict(self) -> dict:
        """JSON-able, for ``kforge-ingest --json``: ``{name: {"value": v, "source": s}}``, names as in ``sources``."""
        findings = self.findings.to_dict()
        return {name: {"value": findings[name[len("findings."):]] if name.startswith("findings.") else getattr(self, name),
                       "source": source} for name, source in self.sources.items()}


@dataclass(frozen=True)
class IngestResult:
    run_dir: str
    summary: dict
    skipped: bool  # True: shards and options unchanged since the last ingest, outputs reused
    appended: bool = False  # True: only new part files were read, on top of the last outputs (docs/CONTRACT.md, "Re-ingest")
    options: DecidedOptions | None = None  # the options used and where each came from (None: not known)
    driver: DriverBytes | None = None  # --dask, window by window: what the driver received (shipped.py)

    @property
    def ingested_dir(self) -> str:
        return os.path.join(self.run_dir, INGESTED_DIR)


@dataclass(frozen=True)
class IngestFailure:
    run_dir: str
    error: str


@dataclass(frozen=True)
class IngestWaiting:
    """A run with nothing to ingest yet (IngestNotReady): ``reason`` says what is missing."""

    run_dir: str
    reason: str
