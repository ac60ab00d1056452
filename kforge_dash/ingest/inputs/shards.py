"""Find and read what kforge_record left on disk: runs, ranks, attempts, part-file footers.

Only metadata is read here (meta.json, end.json, Parquet footers); the rows are read by ingest.
Every problem found becomes a warning string that names the file, and the file is skipped:
ingest goes on with what is readable and reports what it left out.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
from dataclasses import dataclass, field

import pyarrow.compute as pc

from kforge_dash.contract import INGESTED_DIR
from kforge_dash.ingest.inputs import heartbeat_check
from kforge_dash.ingest.inputs.meta_fields import typed_fields
from kforge_dash.ingest.inputs.parquet_io import (
    corrupt_part,  # noqa: F401 (read.py's and append.py's name for it)
    kforge_metadata,
    open_footer,
    read_columns,
    step_facts,
)
from kforge_dash.ingest.inputs.second_writers import warn_second_writers
from kforge_record.heartbeat import HEARTBEAT_FILE, Heartbeat, read_heartbeat
from kforge_record.regular_file import read_regular_bytes
from kforge_record.schema import (
    END_FILE,
    META_FILE,
    SchemaError,
    check_schema_version,
    is_evidence_name,
    is_part_file,
    live_parts,
    part_span,
)

_RANK_DIR = re.compile(r"^rank-(\d+)$")
_ATTEMPT_TIME = re.compile(r"^(\d{8}T\d{6}\.\d{6})Z")  # env.make_attempt_id's leading UTC timestamp


@dataclass(frozen=True)
class AttemptFiles:
    """One rank's launch directory as listed (no file opened yet)."""

    rank: int
    attempt_id: str
    dir: str
    parts: tuple[str, ...]  # full paths, sorted by name (= write order)
    # Part files a merged part among ``parts`` replaces (full paths): left by a merge in progress or
    # killed; read only if that merged part turns out unreadable (read_attempt).
    shadowed: tuple[str, ...] = ()
    # A stalled rank's evidence (kforge_record/hang.py: hang-N.json, hang-stacks.txt, FR dumps), full
    # paths: in the fingerprint (a new stall is ingested again) and read by findings/hang.py.
    evidence: tuple[str, ...] = ()


@dataclass(frozen=True)
class PartInfo:
    """What a part file's footer says, enough to plan reads without touching the rows."""

    path: str
    num_rows: int
    columns: dict  # name -> arrow type name, in file order
    min_step: int | None
    max_step: int | None
    has_log_rows: bool  # rows from Recorder.log (step_time_s null) that need coalescing
    dropped_rows_total: int | None
    has_end_rows: bool = True  # rows from end_step (step_time_s set); see ended_steps()
    # The lowest step of each row group, when the part has several (a merged part): where a step
    # window can end inside it and read only its own row groups (read.plan_windows). None: one group,
    # or no statistics.
    group_steps: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Attempt:
    """One rank's launch: its meta.json (or a stand-in), end.json if clean, and readable parts."""

    rank: int
    attempt_id: str
    dir: str
    meta: dict
    meta_ok: bool  # False: meta.json missing/unreadable, the fields below were inferred
    start_time: float | None  # None: unknown (no meta.json, no time in the attempt id, no file times)
    end: dict | None
    parts: tuple[PartInfo, ...] = field(default=())
    heartbeat: Heartbeat | None = None  # the last step it ended, kept by a SIGKILL (kforge_record/heartbeat.py)
    evidence: tuple[str, ...] = ()  # AttemptFiles.evidence

    @property
    def world_size(self) -> int | None:
        return self.meta.get("world_size")


def is_run_dir(path: str) -> bool:
    """A run is a directory with at least one rank-NNNNN folder in it."""
    try:
        with os.scandir(path) as entries:  # (closed when any() stops early)
            return any(_RANK_DIR.match(e.name) and e.is_dir() for e in entries)
    except OSError:
        return False


def discover_runs(path: str) -> list[str]:
    """The run directories at or below ``path`` (a run itself, or a root of runs at any depth)."""
    path = os.path.abspath(path)
    if is_run_dir(path):
        return [path]
    runs = []
    for dirpath, dirnames, _ in os.walk(path):
        dirnames.sort()
        # Never descend into a run (its rank folders) or into ingest's own outputs.
        keep = []
        for d in dirnames:
            full = os.path.join(dirpath, d)
            if d.startswith(".") or d == INGESTED_DIR:
                continue
            if is_run_dir(full):
                runs.append(full)
            else:
                keep.append(d)
        dirnames[:] = keep
    return runs


def list_attempts(run_dir: str, warnings: list[str]) -> list[AttemptFiles]:
    """Every rank/attempt folder of a run, with its part files. Opens no file."""
    out = []
    for rank_entry in _entries(run_dir, warnings):
        m = _RANK_DIR.match(rank_entry.name)
        if not m or not _is_dir(rank_entry, warnings):
            continue
        rank = int(m.group(1))
        for att in _entries(rank_entry.path, warnings):
            if att.name.startswith(".") or not _is_dir(att, warnings):
                continue
            try:
                listed = os.listdir(att.path)
            except OSError as e:
                warnings.append(f"{att.path}: cannot list the attempt folder ({e.strerror or e}); skipped")
                continue
            names = live_parts(listed)  # the part files, less those a merged part replaces
            if not names and META_FILE not in listed:  # a stray folder (a copy, a backup): no attempt
                warnings.append(f"{att.path}: neither {META_FILE} nor part files; not an attempt folder, skipped")
                continue
            shadowed = sorted(n for n in set(listed).difference(names) if is_part_file(n))
            out.append(AttemptFiles(rank, att.name, att.path, tuple(os.path.join(att.path, n) for n in names),
                                    tuple(os.path.join(att.path, n) for n in shadowed),
                                    tuple(os.path.join(att.path, n) for n in sorted(listed) if is_evidence_name(n))))
    return warn_second_writers(out, warnings)


def _entries(path: str, warnings: list[str]) -> list[os.DirEntry]:
    """The entries of a folder by name; none (and a warning) when it cannot be listed, e.g. a
    symlink that points at itself (ELOOP)."""
    try:
        return sorted(os.scandir(path), key=lambda e: e.name)
    except OSError as e:
        warnings.append(f"{path}: cannot list the folder ({e.strerror or e}); skipped")
        return []


def _is_dir(entry: os.DirEntry, warnings: list[str]) -> bool:
    """A folder, following symlinks; False (and a warning) for a symlink loop or a broken link
    that cannot be told apart from one."""
    try:
        if entry.is_dir():
            return True
        if entry.is_symlink() and not os.path.exists(entry.path):
            os.stat(entry.path)  # tells why: ELOOP for a loop, ENOENT for a dangling link
        return False
    except FileNotFoundError:
        return False
    except OSError as e:
        warnings.append(f"{entry.path}: cannot be followed ({e.strerror or e}); skipped")
        return False


def rel_path(run_dir: str, path: str) -> str:
    """``path`` relative to ``run_dir``. The listing builds every path as run_dir + "/" + ..., so a
    slice does (os.path.relpath normalises both paths: ~10 us a call, seconds for 1M part files)."""
    if path.startswith(run_dir) and path[len(run_dir):len(run_dir) + 1] == os.sep:
        return path[len(run_dir) + 1:]
    return os.path.relpath(path, run_dir)


def stat_inputs(attempts: list[AttemptFiles]) -> dict[str, tuple[int, int] | None]:
    """(size, mtime_ns) of every input file (meta.json, end.json, parts); None when it cannot be
    stat'ed (absent). One stat per file, shared by input_digest and the footer cache."""
    out: dict[str, tuple[int, int] | None] = {}
    for a in attempts:
        for p in (os.path.join(a.dir, META_FILE), os.path.join(a.dir, END_FILE), *a.parts, *a.evidence):
            try:
                st = os.stat(p)
                out[p] = (st.st_size, st.st_mtime_ns)
            except OSError:
                out[p] = None
    return out


def input_digest(run_dir: str, stats: dict, extra: dict) -> str:
    """A sha256 of the names, sizes and mtimes of every input file (``stat_inputs``), plus the
    ingest options: equal means nothing to redo. summary.json keeps it as "fingerprint"."""
    h = hashlib.sha256(json.dumps(extra, sort_keys=True, default=str).encode())
    for p, st in stats.items():
        tail = "-" if st is None else f"{st[0]}\0{st[1]}"
        h.update(f"{rel_path(run_dir, p)}\0{tail}\n".encode())
    return h.hexdigest()


def _read_json(path: str) -> dict:
    obj = json.loads(read_regular_bytes(path))  # a FIFO or device: refused (an OSError), never blocks
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    return obj


def _time_from_attempt_id(attempt_id: str) -> float | None:
    m = _ATTEMPT_TIME.match(attempt_id)
    if not m:
        return None
    t = _dt.datetime.strptime(m.group(1), "%Y%m%dT%H%M%S.%f").replace(tzinfo=_dt.timezone.utc)
    return t.timestamp()


def read_meta(af: AttemptFiles, warnings: list[str]) -> tuple[dict, bool] | None:
    """(meta, ok). A missing or unreadable meta.json gets a stand-in (rows are kept, MFU may be null);
    a meta.json from a newer schema major gives None: that attempt is refused."""
    path = os.path.join(af.dir, META_FILE)
    try:
        meta = _read_json(path)
        check_schema_version(meta.get("schema_version"), source=path)
        if not isinstance(meta.get("start_time"), (int, float)) or isinstance(meta.get("start_time"), bool):
            raise ValueError("start_time is missing or not a number")
        return typed_fields(meta, path, warnings), True
    except SchemaError as e:
        warnings.append(f"{e}; its {len(af.parts)} part file(s) were skipped")
        return None
    except FileNotFoundError:
        problem = "missing"
    except (OSError, ValueError) as e:
        problem = f"unreadable ({e})"
    start = _time_from_attempt_id(af.attempt_id)
    if start is None:  # last resort: the oldest part file's mtime
        mtimes = []
        for p in af.parts:
            try:
                mtimes.append(os.stat(p).st_mtime)
            except OSError:
                pass
        start = min(mtimes) if mtimes else None
    when = ("start time taken from the attempt id or file times" if start is not None
            else "start time unknown: ordered after the attempts with a known start, by attempt id")
    warnings.append(
        f"{path}: {problem}; rows kept with world size, device and model unknown for this attempt "
        f"({when}; assumed counts_tokens=True)"
    )
    return {"rank": af.rank, "attempt_id": af.attempt_id, "start_time": start, "counts_tokens": True}, False


def read_end(af: AttemptFiles, warnings: list[str]) -> dict | None:
    path = os.path.join(af.dir, END_FILE)
    if not os.path.exists(path):
        return None  # the attempt did not close cleanly (killed, crashed, or still running)
    try:
        return _read_json(path)
    except (OSError, ValueError) as e:
        warnings.append(f"{path}: unreadable ({e}); ignored")
        return None


def read_part(path: str, rank: int, warnings: list[str]) -> PartInfo | None:
    """The footer of one part file, validated. None (and a warning naming the file) when unusable."""
    footer = open_footer(path, warnings)
    if footer is None:
        return None
    md, metadata, (columns, i_step, i_time, problem) = footer
    kv = kforge_metadata(path, metadata, warnings)
    if kv is None:
        return None
    if kv.get("rank") not in (None, rank):
        warnings.append(f"{path}: says rank {kv.get('rank')} but lies under rank {rank}; counted as rank {rank}")
    if problem is not None:
        warnings.append(f"{path}: {problem}; skipped")
        return None
    steps = step_facts(path, md, i_step, i_time, warnings)
    if steps is None:
        return None
    lo, hi, log_rows, groups = steps
    return PartInfo(path, md.num_rows, columns, lo, hi, log_rows > 0, kv.get("dropped_rows_total"), log_rows < md.num_rows,
                    groups)


def ended_steps(part: PartInfo) -> tuple[int | None, int | None]:
    """(min, max) step of the part's rows from end_step (step_time_s set); (None, None) if none.

    From the footer when the part has no log rows or only log rows; a part that mixes both is
    read (two small columns), so callers ask only for the parts they need. A part that cannot be
    read gives (None, None): read_window finds it again, reports it and leaves its rows out.
    """
    if not part.has_end_rows or part.min_step is None:
        return None, None
    if not part.has_log_rows:
        return part.min_step, part.max_step
    try:
        tbl = read_columns(part.path, ["step", "step_time_s"])
    except Exception:
        return None, None
    mm = pc.min_max(pc.filter(tbl.column("step"), pc.is_valid(tbl.column("step_time_s"))))
    return mm["min"].as_py(), mm["max"].as_py()


def read_attempt(af: AttemptFiles, warnings: list[str], part_reader=None) -> Attempt | None:
    """meta.json, end.json and every part footer of one attempt; None when the attempt is refused.
    ``part_reader`` (default read_part) lets ingest answer footers from its cache."""
    got = read_meta(af, warnings)
    if got is None:
        return None
    meta, ok = got
    if ok and meta.get("rank") not in (None, af.rank):
        warnings.append(f"{os.path.join(af.dir, META_FILE)}: says rank {meta.get('rank')} but lies under rank {af.rank}; "
                        f"counted as rank {af.rank}")
    reader = part_reader or read_part
    parts = _readable_parts(af, reader, warnings)
    start = None if meta["start_time"] is None else float(meta["start_time"])
    end = read_end(af, warnings)
    hb = heartbeat_check.checked(_heartbeat(af, warnings), os.path.join(af.dir, HEARTBEAT_FILE), warnings,
                                 start_time=start, meta=meta, rows=heartbeat_check.rows_seen(parts, end))
    return Attempt(af.rank, af.attempt_id, af.dir, meta, ok, start, end, parts, hb, af.evidence)


def _heartbeat(af: AttemptFiles, warnings: list[str]) -> Heartbeat | None:
    """The attempt's heartbeat.bin; None when absent (older shards), empty, or unreadable (warned)."""
    path = os.path.join(af.dir, HEARTBEAT_FILE)
    try:
        return read_heartbeat(path)
    except (OSError, ValueError) as e:
        warnings.append(f"{path}: unreadable ({e}); ignored: how far this rank got past its last row is unknown")
        return None


def _readable_parts(af: AttemptFiles, reader, warnings: list[str]) -> tuple[PartInfo, ...]:
    """The footers of the attempt's live parts. A merged part that cannot be read (an empty file a
    kill left between claiming the name and filling it, a damaged one) gives way to the parts it
    replaces where they are still there, so its rows are read from them rather than lost."""
    got = {path: reader(path, af.rank, warnings) for path in af.parts}
    warned: set[str] = set()
    while af.shadowed:
        failed = {p for p, info in got.items() if info is None}
        names = {os.path.basename(p) for p in (*af.parts, *af.shadowed) if p not in failed}
        exposed = [p for p in (os.path.join(af.dir, n) for n in live_parts(names)) if p not in got]
        if not exposed:
            break
        for path in sorted(failed - warned):
            span = part_span(os.path.basename(path))
            if span is not None and span.last > span.first:
                warnings.append(f"{path}: a merged part that cannot be read; its rows are read from the part "
                                "files it replaces, where they remain")
        warned |= failed
        for path in exposed:
            got[path] = reader(path, af.rank, warnings)
    return tuple(got[p] for p in sorted(got, key=os.path.basename) if got[p] is not None)  # name order: write order
