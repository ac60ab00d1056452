"""The types of ingest's interface: its options, its result, its errors."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from kforge_dash.contract import INGESTED_DIR
from kforge_dash.ingest.findings_options import FindingsOptions


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


@dataclass(frozen=True, kw_only=True)
class IngestOptions:
    alpha: float = 0.1
    peak_tflops: float | None = None
    flops_per_token: float | None = None
    # Rows a window (memory ~200 bytes each with polars' work space). 1M, not 4M: half the peak and no
    # slower (the last window's write, which nothing overlaps, is smaller; benchmarks/bench_ingest.py).
    chunk_rows: int = 1_000_000
    lock_timeout_s: float = 600.0
    force: bool = False
    findings: FindingsOptions = FindingsOptions()  # thresholds of summary.json findings

    def __post_init__(self):
        if not (isinstance(self.alpha, (int, float)) and 0 < self.alpha <= 1):
            raise ValueError(f"alpha: must be in (0, 1], got {self.alpha!r}")
        for name in ("peak_tflops", "flops_per_token"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"{name}: must be a positive finite number, got {v!r}")
        if not (isinstance(self.chunk_rows, int) and self.chunk_rows >= 1):
            raise ValueError(f"chunk_rows: must be a positive integer, got {self.chunk_rows!r}")
        if not (isinstance(self.lock_timeout_s, (int, float)) and self.lock_timeout_s >= 0):
            raise ValueError(f"lock_timeout_s: must be >= 0 seconds, got {self.lock_timeout_s!r}")
        if not isinstance(self.findings, FindingsOptions):
            raise TypeError(f"findings: must be a FindingsOptions, got {type(self.findings).__name__}")


@dataclass(frozen=True)
class IngestResult:
    run_dir: str
    summary: dict
    skipped: bool  # True: shards and options unchanged since the last ingest, outputs reused
    appended: bool = False  # True: only new part files were read, on top of the last outputs (docs/CONTRACT.md, "Re-ingest")

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
