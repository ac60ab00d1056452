"""Removing what a killed merge left in an attempt folder: replaced parts and temp files.

A SIGKILL in the middle of a merge (compact.py) leaves whole files only, but it may leave the
parts a published merged part replaces (readers skip them: schema.live_parts) and the temp file
of a part or merged part being written. Readers are right either way; the folder just no longer
holds a bounded number of files, and a temp file is dead weight for ever. The dead process
cannot clean up, and ingest never deletes what a recorder wrote, so the recorder does it:

* a new Recorder, on its writer thread before its first write, cleans every other attempt
  folder of its rank (a resumed job writes a new attempt folder beside the killed one);
* a closing writer cleans its own folder (a replaced part whose removal failed).

What goes, and when (docs/CONTRACT.md, "Shards"):

* A replaced part, in any folder, whether its writer lives or not: only when the merged part
  whose flushes hold it has a readable footer whose ``replaces`` names it (or names the merged
  part it was merged into first), whose ``flush_rows`` add up to its rows, and when the replaced
  part's own rows are the ones ``flush_rows`` gives its flushes. The merged part and the folder
  are fsynced first. A live writer deletes the same files right after publishing (it ignores one
  already gone) and never reads a replaced part again, so this can never take a row from it.
* An empty merged part (0 bytes: a publish without hard links claims the name before its rename
  fills it, atomic.publish_new) whose flushes all sit in the parts beside it, only when its
  writer is gone (below): readers would keep the empty file over those parts.
* A temp file (``.*.tmp``), only when no live writer can own it: the folder's ``end.json``
  exists (its writer stopped), or its ``meta.json`` names this host and a pid that is gone, a
  zombie, or another process (a start time that differs: the pid was reused). For a folder
  written on another host (a job resumed on another node) that cannot be known; there a temp
  file goes once it is STALE_TMP_S old (a write takes milliseconds). Even a live writer's temp
  file removed would lose no row: its write fails, is warned, and the rows are written again at
  the next flush (writer.py), or the merge's inputs stay.

Nothing here raises: a failure is one warning, and the files stay as readers can read them.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

import pyarrow.parquet as pq

from .atomic import fsync_dir, fsync_file
from .env import hostname, process_identity
from .regular_file import check_regular_file, open_regular
from .schema import END_FILE, META_FILE, PARQUET_META_KEY, is_part_file, live_parts, part_span

STALE_TMP_S = 3600.0  # a temp file this old in a folder whose writer may live elsewhere is dead
START_SLACK_S = 2.0  # /proc start times are clock ticks against uptime: the same process within this


@dataclass(frozen=True)
class Cleaned:
    """What one clean-up removed: replaced part files and temp files."""

    parts: int = 0
    temps: int = 0

    def __add__(self, other: "Cleaned") -> "Cleaned":
        return Cleaned(self.parts + other.parts, self.temps + other.temps)


def clean_rank_dir(rank_dir: str, *, own: str, warn) -> Cleaned:
    """Clean every attempt folder of ``rank_dir`` except ``own`` (the caller's, being written)."""
    total = Cleaned()
    try:
        entries = sorted(os.listdir(rank_dir))
    except OSError as e:
        warn("leftovers:list", f"could not list {rank_dir} to remove what killed merges left ({e!r})")
        return total
    for name in entries:
        d = os.path.join(rank_dir, name)
        if name == own or name.startswith(".") or os.path.islink(d) or not os.path.isdir(d):
            continue
        total += clean_attempt_dir(d, warn=warn)
    return total


def clean_attempt_dir(d: str, *, warn, writer_gone: bool | None = None) -> Cleaned:
    """Remove the replaced parts and dead temp files of attempt folder ``d``; never raises.
    ``writer_gone``: known by the caller (a closing writer, of its own folder), else found out."""
    known = [] if writer_gone is None else [writer_gone]

    def gone() -> bool | None:  # asked only when there is something it decides
        if not known:
            known.append(folder_writer_gone(d))
        return known[0]

    try:
        names = os.listdir(d)
        parts = [n for n in names if is_part_file(n)]
        # Nothing shadowed (the common case): no file is opened or even stat'ed, one listing only.
        empty = _empty_merged_parts(d, parts) if len(live_parts(parts)) < len(parts) else {}
        gone_empty = 0
        if empty and gone() is True:
            for name, seen in empty.items():
                if _still_empty(os.path.join(d, name), seen):  # (filled by a publish since: it stays)
                    _remove(os.path.join(d, name))
                    parts.remove(name)
                    gone_empty += 1
        removed = _remove_replaced(d, parts, warn) + gone_empty
        temps = [n for n in names if n.startswith(".") and n.endswith(".tmp")]
        return Cleaned(removed, _remove_temps(d, temps, gone()) if temps else 0)
    except Exception as e:  # never into the training loop, never kill the writer thread
        warn(f"leftovers:{type(e).__name__}", f"could not remove what a killed merge left in {d} ({e!r}); "
             "the files stay, and readers read each row once")
        return Cleaned()


def _empty_merged_parts(d: str, parts: list[str]) -> dict[str, os.stat_result]:
    """Merged parts of 0 bytes whose every flush is in smaller parts beside them: the name that a
    publish without hard links claims before its rename fills it (atomic.publish_new), left so by
    a kill in between. Readers would keep it over the parts it was to replace, and read nothing."""
    stats = {}
    for n in parts:
        try:
            stats[n] = os.stat(os.path.join(d, n))
        except FileNotFoundError:  # removed meanwhile (a live writer's merge, another clean-up)
            continue
    parts = [n for n in parts if n in stats]
    sizes = {n: st.st_size for n, st in stats.items()}
    out = {}
    for name in parts:
        span = part_span(name)
        if span is None or span.first == span.last or sizes[name]:
            continue
        inner = [n for n in parts if sizes[n] and _within(n, span)]
        reach = span.first - 1
        for s in sorted((part_span(n).first, part_span(n).last) for n in live_parts(inner)):
            if s[0] != reach + 1:
                break
            reach = s[1]
        if reach == span.last:
            out[name] = stats[name]
    return out


def _still_empty(path: str, seen: os.stat_result) -> bool:
    """The same empty file as when it was judged (size 0, same inode): not filled by a publish since."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    return st.st_size == 0 and (st.st_ino, st.st_dev) == (seen.st_ino, seen.st_dev)


def _within(name: str, span) -> bool:
    s = part_span(name)
    return s is not None and span.first <= s.first and s.last <= span.last


def _remove_replaced(d: str, parts: list[str], warn) -> int:
    live = live_parts(parts)
    replaced = sorted(set(parts) - set(live))
    if not replaced:
        return 0
    merged = {n: part_span(n) for n in live if part_span(n) is not None}
    doomed = []
    for name in replaced:
        span = part_span(name)
        holder = next(m for m, s in merged.items() if s.first <= span.first and span.last <= s.last)
        problem = _why_not_replaced(d, name, holder)
        if problem:
            warn(f"leftovers:kept:{d}", f"{os.path.join(d, name)} is kept beside {holder}: {problem}")
        else:
            doomed.append((name, holder))
    for holder in {h for _, h in doomed}:
        fsync_file(os.path.join(d, holder))
    fsync_dir(d)
    for name, _ in doomed:
        _remove(os.path.join(d, name))
    if doomed:
        fsync_dir(d)
    return len(doomed)


def _why_not_replaced(d: str, name: str, holder: str) -> str | None:
    """None when merged part ``holder`` provably holds every row of part ``name``; else why not."""
    try:
        check_regular_file(os.path.join(d, holder))
        meta = pq.read_metadata(os.path.join(d, holder))
        kv = json.loads((meta.metadata or {}).get(PARQUET_META_KEY, b"{}"))
    except Exception as e:  # half written on a filesystem without hard links, or damaged
        return f"its footer cannot be read ({type(e).__name__})"
    span, hspan = part_span(name), part_span(holder)
    replaces, flush_rows = kv.get("replaces"), kv.get("flush_rows")
    if not isinstance(replaces, list) or not isinstance(flush_rows, list) or len(flush_rows) != hspan.last - hspan.first + 1:
        return "its metadata lacks a whole replaces/flush_rows list"
    if sum(flush_rows) != meta.num_rows:
        return f"its flush_rows add up to {sum(flush_rows)} rows, not its {meta.num_rows}"
    if not any(r == name or _merged_into(r, span) for r in replaces if isinstance(r, str)):
        return "its replaces list does not name it"
    try:
        check_regular_file(os.path.join(d, name))
        own = pq.read_metadata(os.path.join(d, name)).num_rows
    except Exception as e:
        return f"its own footer cannot be read ({type(e).__name__})"
    want = sum(flush_rows[span.first - hspan.first:span.last - hspan.first + 1])
    return None if own == want else f"it holds {own} rows where the merged part holds {want} of its flushes"


def _merged_into(replaced: str, span) -> bool:
    """``replaced`` (a name a merged part lists) was a merged part itself whose flushes hold ``span``."""
    s = part_span(replaced)
    return s is not None and s.first < s.last and s.first <= span.first and span.last <= s.last


def _remove_temps(d: str, temps: list[str], gone: bool | None) -> int:
    if gone is False:
        return 0
    old = time.time() - STALE_TMP_S
    n = 0
    for name in temps:
        path = os.path.join(d, name)
        try:
            if gone or os.stat(path).st_mtime < old:
                _remove(path)
                n += 1
        except FileNotFoundError:
            pass
    return n


def folder_writer_gone(d: str) -> bool | None:
    """True when the process that wrote attempt folder ``d`` can no longer write to it, False when
    it provably still runs, None when that cannot be told from here (another host, no meta.json)."""
    if os.path.exists(os.path.join(d, END_FILE)):
        return True  # the writer thread stops once end.json is written
    try:
        with open_regular(os.path.join(d, META_FILE), "r") as f:
            meta = json.load(f)
        host, pid, started = meta.get("host"), meta.get("pid"), meta.get("process_start_time")
        ident = meta.get("process")
    except (OSError, ValueError, AttributeError):
        return None
    if host != hostname() or pid.__class__ is not int or pid <= 0:
        return None
    if isinstance(ident, dict):  # written by a recorder that keeps its exact identity
        mine = process_identity()
        for key in ("boot_id", "pid_ns"):
            if ident.get(key) is None or mine[key] is None or ident[key] != mine[key]:
                # Another boot (or a host of the same name), another pid namespace (a container
                # that cannot see its pids), or unknown: not ours to judge.
                return None
        ticks = ident.get("start_ticks")
        if ticks.__class__ is int:
            return pid_gone_exact(pid, ticks)
    return pid_gone(pid, started)


def pid_gone_exact(pid: int, start_ticks: int) -> bool:
    """True when no live process ``pid`` that started at ``start_ticks`` (since this boot) runs here."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        state, ticks = fields[0], int(fields[19])
    except FileNotFoundError:
        return True
    except (OSError, ValueError, IndexError):
        return _kill_0_gone(pid)
    return state in ("Z", "X") or ticks != start_ticks


def pid_gone(pid: int, started: float | None) -> bool:
    """True when no live process ``pid`` started at ``started`` (Unix s; None: any start) runs here."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except FileNotFoundError:
        return True
    except (OSError, ValueError, IndexError):
        return _kill_0_gone(pid)  # no /proc (macOS): whether the pid exists at all
    if fields[0] in ("Z", "X"):  # a zombie or dead task writes nothing
        return True
    if isinstance(started, (int, float)):
        began = time.time() - (uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))
        return abs(began - started) > START_SLACK_S
    return False


def _kill_0_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # EPERM: it exists, another user's
        return False
    return False


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:  # a live writer, or another clean-up, removed it first
        pass
