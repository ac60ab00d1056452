"""PyTorch flight-recorder (FR) dumps read from disk and put in one shape, NCCL and gloo alike.

A dump is what ``torch._C._distributed_c10d._dump_fr_trace()`` (or its NCCL and JSON variants, or
PyTorch's watchdog into ``TORCH_FR_DUMP_TEMP_FILE``) writes: a pickled (or JSON) dict with
``version`` "2.x", ``pg_config`` (process group name -> desc and member ranks), ``pg_status``
(per process group *id*: last enqueued/started/completed sequence number) and ``entries`` (the ring
buffer of collectives: ``collective_seq_id``, ``p2p_seq_id``, ``profiling_name``, ``state``, sizes,
dtypes, ``record_id``, ``time_created_ns``).

What differs between backends, and is handled here:

- gloo dumps (torch 2.10 format) carry no usable ``pg_config`` (one entry named '' with no ranks):
  a group's members are then inferred (the default group: every rank; another: the ranks whose
  dumps mention it). PyTorch's own analyzer raises KeyError on them.
- ``pg_status`` is keyed by the process group's *id*, ``pg_config`` by its *name*: an entry names
  both (``pg_id``, ``process_group``); a rank with no entry left for a group is mapped by creation
  order when every name is a number (names and ids then both grow with creation).
- Completion: NCCL marks ``state`` 'completed'; gloo leaves 'scheduled' and sets ``retired``.

Dumps are data from disk: pickles are read with an Unpickler that resolves no class or function
(only the builtin containers and scalars pickle encodes natively, plus set/frozenset), and a file
that is not a regular file, too large, or not a dump is skipped with a warning naming it.
"""

from __future__ import annotations

import functools
import io
import json
import os
import pickle
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from kforge_record.regular_file import read_regular_bytes

MAX_DUMP_BYTES = 512 * 1024 * 1024  # a 20,000-entry buffer with stacks is tens of MB; more is not a dump
# A dump's file name ends with its rank: _dump_12, nccl_trace_rank_12, fr_12.json, 12.pkl.
_RANK_NAME = re.compile(r"(\d+)(?:\.(?:json|pkl|pickle))?$")
_SAFE_GLOBALS = {("builtins", "set"), ("builtins", "frozenset")}


class _DataOnly(pickle.Unpickler):
    """Unpickles containers and scalars only: any class or function a pickle names is refused."""

    def find_class(self, module: str, name: str):  # noqa: D401 (pickle's hook)
        if (module, name) in _SAFE_GLOBALS:
            return set if name == "set" else frozenset
        raise pickle.UnpicklingError(f"refused {module}.{name}: a flight-recorder dump holds data only")


def rank_of_name(path: Path) -> int | None:
    """The rank a dump's file name ends with, or None."""
    m = _RANK_NAME.search(path.name)
    return int(m.group(1)) if m else None


def is_dump_name(path: Path) -> bool:
    return rank_of_name(path) is not None


def fr_dump_files(folder: Path) -> list[Path]:
    """The files directly in ``folder`` named like a rank's dump (``_dump_12``, ``rank_3.json``): no glob, no walk
    into sub-folders. Raises OSError when the folder cannot be listed."""
    with os.scandir(folder) as it:
        return sorted(Path(e.path) for e in it if is_dump_name(Path(e.name)) and not e.is_dir(follow_symlinks=False))


def _load(path: Path) -> object:
    # O_NONBLOCK: a FIFO put in the folder is not waited on; O_NOFOLLOW: a symlink swapped in is not followed
    data = read_regular_bytes(path, MAX_DUMP_BYTES + 1, follow_symlinks=False)
    if len(data) > MAX_DUMP_BYTES:
        raise ValueError(f"larger than {MAX_DUMP_BYTES // 2**20} MiB")
    if data[:1] in (b"{", b"[") or data[:1].isspace():
        return json.loads(data.decode("utf-8"))
    return _DataOnly(io.BytesIO(data)).load()


def check_dump(dump: object) -> str | None:
    """Why ``dump`` is not a flight-recorder dump of format 2.x, or None when it is."""
    if not isinstance(dump, dict):
        return f"not a flight-recorder dump (a {type(dump).__name__}, not a dict)"
    version = dump.get("version")
    if not isinstance(version, str):
        return "not a flight-recorder dump (no 'version')"
    if not version.startswith("2."):
        return f"flight-recorder format version {version!r} is not supported (2.x is)"
    if not isinstance(dump.get("entries", []), list):
        return "its 'entries' is not a list"
    return None


def read_fr_dumps(paths: Iterable[Path]) -> tuple[dict[int, dict], list[str]]:
    """rank -> dump for each readable dump among ``paths``; warnings naming each file skipped.

    The rank is the number the file name ends with. Symlinks and other non-regular files are not
    opened; a file that cannot be read or parsed, or that holds no 2.x dump, is skipped."""
    dumps: dict[int, dict] = {}
    where: dict[int, Path] = {}
    warnings: list[str] = []
    for path in sorted((Path(p) for p in paths), key=lambda p: (rank_of_name(p) is None, rank_of_name(p) or 0, p.name)):
        rank = rank_of_name(path)
        if rank is None:
            warnings.append(f"{path}: skipped: its name does not end with a rank number")
            continue
        if path.is_symlink() or not path.is_file():
            warnings.append(f"{path}: skipped: not a regular file")
            continue
        try:
            dump = _load(path)
        except (OSError, ValueError, EOFError, pickle.UnpicklingError, UnicodeDecodeError, RecursionError,
                MemoryError, IndexError, TypeError, AttributeError) as e:
            warnings.append(f"{path}: skipped: cannot read it as a flight-recorder dump ({type(e).__name__}: {e})")
            continue
        problem = check_dump(dump)
        if problem:
            warnings.append(f"{path}: skipped: {problem}")
            continue
        if rank in dumps:
            warnings.append(f"{path}: skipped: rank {rank} already read from {where[rank]}")
            continue
        dumps[rank], where[rank] = dump, path
    return dumps, warnings


# --- one shape for every dump ---------------------------------------------------------------------


class Op(NamedTuple):  # not a frozen dataclass: one per entry; analyze_fr 1.65 -> 1.41 s at 512 ranks (bench_hang_fr.py)
    """One entry of a rank's buffer."""

    group: str  # the process group's name
    seq: int  # collective_seq_id
    p2p_seq: int
    is_p2p: bool
    name: str  # profiling_name without the backend: all_reduce, send 0->3
    backend: str  # nccl, gloo, ...
    sizes: list  # input sizes
    out_sizes: list
    dtypes: list  # input dtypes
    out_dtypes: list
    pending: bool  # not completed (nor retired)
    record_id: int
    created_ns: int | None


@dataclass(frozen=True)
class GroupView:
    """What one rank's dump says of one process group."""

    desc: str
    members: tuple[int, ...] | None  # global ranks in group order; None: the dump does not say
    enqueued: int | None  # highest collective sequence number issued (None: unknown)
    completed: int | None  # highest completed


@dataclass(frozen=True)
class RankDump:
    rank: int
    version: str
    ops: tuple[Op, ...]  # in record order
    groups: dict  # group name -> GroupView
    issued: frozenset = frozenset()  # (group, seq) of every collective (not send/recv) in the buffer

    @property
    def head(self) -> Op | None:
        """The oldest entry not completed: what this rank waits in (None: it waits in no collective)."""
        return next((op for op in self.ops if op.pending), None)


def _members(raw: object) -> tuple[int, ...] | None:
    if isinstance(raw, str):
        return _members_of_text(raw)
    if isinstance(raw, (list, tuple)) and raw and all(isinstance(r, int) and not isinstance(r, bool) for r in raw):
        return tuple(raw)
    return None


@functools.lru_cache(maxsize=1024)  # every rank's dump holds the same world group's 4,096 ranks as text: parsed once
def _members_of_text(raw: str) -> tuple[int, ...] | None:
    try:
        return _members(json.loads(raw))
    except (ValueError, RecursionError):
        return None


@functools.lru_cache(maxsize=4096)  # a job's few names, once per entry: normalize 2.4 -> 1.1 s at 256 ranks (bench_hang_fr.py)
def _printable(value: str) -> str:
    return value[:200] if value.isprintable() else "".join(c if c.isprintable() else "?" for c in value)[:200]


def printable(value: object) -> str:
    """A name from disk as plain text: control characters (a terminal's escapes) become '?'."""
    return _printable(value if isinstance(value, str) else str(value))


def _op(e: Mapping, group_of_id: dict[str, str]) -> Op:
    pg = e.get("process_group") or ("", "")
    group = printable(pg[0]) if pg[0] != "" else group_of_id.get(str(e.get("pg_id")), "")
    backend, _, name = printable(e.get("profiling_name", "")).partition(":")
    if not name:
        backend, name = "", backend
    state = e.get("state")
    return Op(group=group, seq=int(e["collective_seq_id"]), p2p_seq=int(e.get("p2p_seq_id") or 0),
              is_p2p=bool(e.get("is_p2p")), name=name, backend=backend,
              sizes=list(e.get("input_sizes") or []), out_sizes=list(e.get("output_sizes") or []),
              dtypes=list(e.get("input_dtypes") or []), out_dtypes=list(e.get("output_dtypes") or []),
              pending=state != "completed" and not e.get("retired"), record_id=int(e.get("record_id") or 0),
              created_ns=e.get("time_created_ns") if isinstance(e.get("time_created_ns"), int) else None)


def _group_names_by_id(dump: Mapping, entries: list) -> dict[str, str]:
    """pg_status's ids -> pg_config's names: from the entries, then by creation order when the names are numbers."""
    by_id: dict[str, str] = {}
    for e in entries:
        pg = e.get("process_group") if isinstance(e, Mapping) else None
        if isinstance(pg, (list, tuple)) and pg and pg[0] != "" and "pg_id" in e:
            by_id[str(e["pg_id"])] = printable(pg[0])
    status, config = dump.get("pg_status"), dump.get("pg_config")
    if isinstance(status, Mapping) and isinstance(config, Mapping) and len(status) == len(config):
        names, ids = list(config), list(status)
        if all(str(n).isdigit() for n in names) and all(str(i).isdigit() for i in ids):
            ordered = dict(zip(map(str, sorted(ids, key=int)), map(str, sorted(names, key=int))))
            if all(ordered.get(i, n) == n for i, n in by_id.items()):  # agrees with every entry
                return {**ordered, **by_id}
    return by_id


def normalize(rank: int, dump: Mapping) -> tuple[RankDump, list[str]]:
    """One rank's dump in one shape, and a warning for each part of it that could not be used."""
    warnings = []
    entries = [e for e in dump.get("entries") or [] if isinstance(e, Mapping)]
    group_of_id = _group_names_by_id(dump, entries)
    ops, bad = [], 0
    for e in entries:
        try:
            ops.append(_op(e, group_of_id))
        except (KeyError, TypeError, ValueError, IndexError):
            bad += 1
    if bad:
        warnings.append(f"rank {rank}: {bad} of {len(entries)} entries could not be read and were left out")
    ops.sort(key=lambda o: o.record_id)
    p2p_groups = {o.group for o in ops if o.is_p2p}
    config = dump.get("pg_config") if isinstance(dump.get("pg_config"), Mapping) else {}
    status = dump.get("pg_status") if isinstance(dump.get("pg_status"), Mapping) else {}
    names = {printable(n) for n in config if str(n)} | {o.group for o in ops} | {group_of_id[i] for i in map(str, status)
                                                                            if i in group_of_id}
    status_of: dict[str, Mapping] = {}  # group name -> its pg_status (a group that also sends p2p counts those there)
    for i, name in group_of_id.items():
        if isinstance(status.get(i), Mapping) and name not in p2p_groups:
            status_of[name] = status[i]
    # pg_status is the watchdog's last word: an entry it counts as completed is, whatever its state says
    counted = {g: _max(None, st.get("last_completed_collective")) for g, st in status_of.items()}
    ops = [o._replace(pending=False) if o.pending and not o.is_p2p and (counted.get(o.group) or -1) >= o.seq else o
           for o in ops]
    groups = {}
    for name in sorted(names):
        cfg = config.get(name) if isinstance(config.get(name), Mapping) else {}
        desc = printable(cfg.get("desc") or next((_desc(e) for e in entries if _group(e) == name), "") or "")
        mine = [o for o in ops if o.group == name and not o.is_p2p]
        enq = max((o.seq for o in mine), default=None)
        done = max((o.seq for o in mine if not o.pending), default=None)
        st = status_of.get(name)
        if st is not None:
            enq = _max(enq, st.get("last_enqueued_collective"))
            done = _max(done, st.get("last_completed_collective"))
        first_pending = min((o.seq for o in mine if o.pending), default=None)
        if first_pending is not None:  # entries complete in order: everything before the first pending did
            done = _max(done, first_pending - 1)
        groups[name] = GroupView(desc=desc, members=_members(cfg.get("ranks")), enqueued=enq, completed=done)
    issued = frozenset((o.group, o.seq) for o in ops if not o.is_p2p)
    return RankDump(rank=rank, version=printable(dump.get("version")), ops=tuple(ops), groups=groups,
                    issued=issued), warnings


def _group(e: Mapping) -> str:
    pg = e.get("process_group")
    return printable(pg[0]) if isinstance(pg, (list, tuple)) and pg else ""


def _desc(e: Mapping) -> str:
    pg = e.get("process_group")
    return str(pg[1]) if isinstance(pg, (list, tuple)) and len(pg) > 1 else ""


def _max(a: int | None, b: object) -> int | None:
    """The larger of a and b, where b is a sequence number as a dump holds it (an int; JSON dumps: a str)."""
    if isinstance(b, str) and b.lstrip("-").isdigit():
        b = int(b)
    if not isinstance(b, int) or isinstance(b, bool) or b < 0:
        return a
    return b if a is None else max(a, b)
