"""The on-disk contract between the recorder and ingest (docs/CONTRACT.md, "Shards").

Kept free of heavy imports: the recorder and ingest both import this module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SCHEMA_VERSION = "1.0"  # major.minor; ingest refuses a newer major

META_FILE = "meta.json"
END_FILE = "end.json"  # written at close: dropped-row count and why the recorder stopped
PART_PREFIX = "part-"
PART_SUFFIX = ".parquet"
RANK_PREFIX = "rank-"

# A stalled rank's evidence (hang.py, docs/hangs.md): hang-N.json, fr-hang-N-rank-R.pkl, and the stacks
# faulthandler writes without the GIL.
STACKS_FILE = "hang-stacks.txt"
_HANG_EVIDENCE = re.compile(r"^(hang-\d+\.json|fr-hang-\d+-rank-\d+\.pkl|hang-stacks\.txt)$")


def is_evidence_name(name: str) -> bool:
    """A file the hang watch writes (hang-N.json, fr-hang-N-rank-R.pkl, hang-stacks.txt)."""
    return _HANG_EVIDENCE.match(name) is not None


# Key of the JSON blob in every part file's Parquet key-value metadata.
PARQUET_META_KEY = b"kforge"

# Fixed columns of every part file, in order, with their Arrow type names.
FIXED_COLUMNS = (
    ("step", "int64"),
    ("time", "float64"),
    ("step_time_s", "float64"),
    ("loss", "float64"),
    ("grad_norm", "float64"),
    ("lr", "float64"),
    ("tokens", "int64"),
    ("mem_allocated_bytes", "int64"),
    ("mem_peak_bytes", "int64"),
    ("mem_reserved_bytes", "int64"),
)
FIXED_NAMES = tuple(name for name, _ in FIXED_COLUMNS)
MEM_COLUMNS = ("mem_allocated_bytes", "mem_peak_bytes", "mem_reserved_bytes")
# GPU telemetry (kforge_record/hw.py, or a job's own end_step values), float64 like every scalar:
# hw/throttle_reasons holds NVML's integer bitmask exactly (an int64 column would be a format change).
HW_COLUMNS = ("hw/gpu_util_pct", "hw/gpu_temp_c", "hw/gpu_power_w", "hw/sm_clock_mhz", "hw/throttle_reasons")
PHASE_PREFIX = "time/"
PHASE_SUFFIX = "_s"


def phase_column(name: str) -> str:
    return f"{PHASE_PREFIX}{name}{PHASE_SUFFIX}"


def rank_dir_name(rank: int) -> str:
    return f"{RANK_PREFIX}{rank:05d}"


def taken_attempt_id(attempt_id: str, pid: int, stamp: str, n: int = 0) -> str:
    """The folder name a recorder claims when its launch's ``attempt_id`` folder is taken already
    (a second process given the same rank in one launch, or a second Recorder in one process):
    ``<attempt_id>-p<pid>-<HHMMSSffffff>[-<n>]``."""
    return f"{attempt_id}-p{pid}-{stamp}" + (f"-{n}" if n else "")


_TAKEN_SUFFIX = re.compile(r"-p\d+-\d{12}(?:-\d+)?$")


def launch_of_attempt(folder: str) -> str:
    """The attempt id a folder was claimed for: its name without a ``taken_attempt_id`` suffix."""
    return _TAKEN_SUFFIX.sub("", folder)


def part_file_name(index: int) -> str:
    return f"{PART_PREFIX}{index:06d}{PART_SUFFIX}"


def merged_part_name(first: int, last: int) -> str:
    """The part that replaces the flushes ``first``..``last`` (part-000000-000009.parquet): it sorts
    where its first flush did, so name order stays write order."""
    return f"{PART_PREFIX}{first:06d}-{last:06d}{PART_SUFFIX}"


_PART_NAME = re.compile(r"^part-(\d+)(?:-(\d+))?\.parquet$")


@dataclass(frozen=True)
class PartSpan:
    """The flushes a part file holds: part-N is flush N alone, part-A-B flushes A to B."""

    first: int
    last: int


def part_span(name: str) -> PartSpan | None:
    """The flushes named by a part file's name; None for a name kforge did not write."""
    m = _PART_NAME.match(name)
    if m is None:
        return None
    first = int(m.group(1))
    last = first if m.group(2) is None else int(m.group(2))
    return PartSpan(first, last) if last >= first else None


def live_parts(names) -> list[str]:
    """The part files among ``names`` (an attempt folder's listing), less those a merged part replaces.

    A merged part is published whole (atomic rename) before the parts it replaces are deleted,
    so while both exist the one whose span holds the other's wins. Spans written by kforge are
    nested or disjoint; a name without a span (not written by kforge) is always kept. Sorted.
    """
    spans = {n: part_span(n) for n in names if is_part_file(n)}
    out = [n for n, span in spans.items() if span is None]
    reach = -1
    # By first flush, the widest span first among equal starts: a span is replaced exactly when
    # it ends within the reach of the spans before it.
    for name in sorted((n for n, s in spans.items() if s is not None), key=lambda n: (spans[n].first, -spans[n].last)):
        if spans[name].last <= reach:
            continue
        reach = spans[name].last
        out.append(name)
    return sorted(out)


def is_part_file(name: str) -> bool:
    """True for a finished part file; temp files (dot-prefixed, .tmp) never match."""
    return name.startswith(PART_PREFIX) and name.endswith(PART_SUFFIX)


def major(version: str) -> int:
    return int(str(version).split(".", 1)[0])


class SchemaError(ValueError):
    """A file that does not follow the kforge on-disk contract."""


def check_schema_version(version: object, *, source: str) -> None:
    """Raise SchemaError naming `source` when `version` is missing or of a newer major."""
    try:
        found = major(str(version))
    except ValueError:
        raise SchemaError(f"{source}: schema_version {version!r} is not of the form MAJOR.MINOR") from None
    if found > major(SCHEMA_VERSION):
        raise SchemaError(
            f"{source}: written with kforge schema {version}, newer than this kforge reads "
            f"({SCHEMA_VERSION}); upgrade kforge to ingest it"
        )
