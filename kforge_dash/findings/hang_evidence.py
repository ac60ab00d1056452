"""What a stalled rank left (kforge_record/hang.py), read back: its state and its innermost user frame.

Per attempt: the newest ``hang-N.json`` (last ended step, phase, every thread's Python stack), else
the last dump in ``hang-stacks.txt`` (faulthandler's, written without the GIL: stacks only), and
the flight-recorder dumps (``fr-hang-N-rank-R.pkl``, and PyTorch's own at meta.json's
``fr.dump_file`` + rank). Regular files only, read with a size cap; a file that cannot be used
is skipped with a warning naming it. Evidence older than the rank's last ended step (a stall
that ended: a long checkpoint) is no stall.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass

from kforge_record.regular_file import read_regular_bytes
from kforge_record.schema import META_FILE, STACKS_FILE

MAX_BYTES = 64 * 1024 * 1024
_LIBRARY = re.compile(r"(/site-packages/|/dist-packages/|/lib(64)?/python\d+(\.\d+)?/|/kforge_record/|^<)")
_FH_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+)")
_FH_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')
_FH_LOOP = re.compile(r"loop thread (0x[0-9a-fA-F]+)")
_EVIDENCE_N = re.compile(r"^hang-(\d+)\.json$")
_FR_N = re.compile(r"^fr-hang-(\d+)-rank-(\d+)\.pkl$")


@dataclass(frozen=True)
class RankStall:
    """One rank's stall as its evidence says."""

    rank: int
    host: str | None
    last_step: int | None  # the last step it ended (None: none)
    last_time: float | None  # when (Unix s)
    phase: str | None  # the innermost phase it was in (None: none open, or only faulthandler's stacks)
    frame: str | None  # its loop thread's innermost frame in user code: "path/file.py:LINE in func"
    written_at: float | None
    source: str  # "recorder" (hang-N.json) or "faulthandler" (hang-stacks.txt: the GIL was held)


def read_regular(path: str) -> bytes:
    """The bytes of a regular file (no FIFO waited on, no symlink followed); OSError/ValueError otherwise."""
    data = read_regular_bytes(path, MAX_BYTES + 1, follow_symlinks=False)
    if len(data) > MAX_BYTES:
        raise ValueError(f"larger than {MAX_BYTES // 2**20} MiB")
    return data


def user_frame(frames: list) -> str | None:
    """The innermost frame (frames: outermost first, each (file, line, func)) outside the standard library,
    installed packages and kforge_record; the innermost frame when every one is library code."""
    frames = [f for f in frames if isinstance(f, (list, tuple)) and len(f) == 3]
    if not frames:
        return None
    pick = next((f for f in reversed(frames) if not _LIBRARY.search(str(f[0]))), frames[-1])
    return f"{pick[0]}:{pick[1]} in {pick[2]}"


def attempt_stall(attempt, warnings: list[str]) -> RankStall | None:
    """The attempt's stall that never ended (its heartbeat did not move past it), or None."""
    hb = attempt.heartbeat
    host = attempt.meta.get("host") if isinstance(attempt.meta.get("host"), str) else None
    jsons = sorted((int(m.group(1)), p) for p in attempt.evidence if (m := _EVIDENCE_N.match(os.path.basename(p))))
    for _, path in reversed(jsons):
        doc = _json(path, warnings)
        if doc is None:
            continue
        last_t = _num(doc.get("last_step_time"))
        if hb is not None and (last_t is None or hb.time > last_t):
            return None  # a step ended after it: the stall ended
        return RankStall(rank=attempt.rank, host=host, last_step=_int(doc.get("last_step")), last_time=last_t,
                         phase=doc.get("phase") if isinstance(doc.get("phase"), str) else None,
                         frame=_loop_frame(doc), written_at=_num(doc.get("written_at")), source="recorder")
    stacks = next((p for p in attempt.evidence if os.path.basename(p) == STACKS_FILE), None)
    return _faulthandler_stall(attempt, stacks, host, warnings) if stacks else None


def _faulthandler_stall(attempt, path: str, host, warnings: list[str]) -> RankStall | None:
    try:
        data = read_regular(path)
        mtime = os.stat(path).st_mtime
    except (OSError, ValueError) as e:
        warnings.append(f"{path}: skipped: cannot read it ({e})")
        return None
    text = data.decode("utf-8", "replace")
    at = text.rfind("Timeout (")
    hb = attempt.heartbeat
    if at < 0 or (hb is not None and hb.time > mtime):
        return None  # never fired, or fired before a step that ended later
    loop = _FH_LOOP.search(text[:at])
    threads = _fh_threads(text[at:])
    frames = threads.get(int(loop.group(1), 16)) if loop else None
    if frames is None and threads:
        frames = next(iter(threads.values()))
    return RankStall(rank=attempt.rank, host=host, last_step=hb.step if hb else None, last_time=hb.time if hb else None,
                     phase=None, frame=user_frame(frames or []), written_at=mtime, source="faulthandler")


def _fh_threads(block: str) -> dict[int, list]:
    """faulthandler's text (threads, each innermost frame first) as thread id -> frames outermost first."""
    out: dict[int, list] = {}
    cur = None
    for line in block.splitlines():
        m = _FH_THREAD.match(line)
        if m:
            cur = out.setdefault(int(m.group(1), 16), [])
            continue
        f = _FH_FRAME.match(line)
        if f and cur is not None:
            cur.insert(0, (f.group(1), int(f.group(2)), f.group(3).strip()))
    return out


def _loop_frame(doc: dict) -> str | None:
    threads = [t for t in doc.get("threads") or [] if isinstance(t, dict)]
    loop = next((t for t in threads if t.get("id") == doc.get("loop_thread")), None)
    loop = loop or next((t for t in threads if t.get("name") == "MainThread"), None)
    return user_frame(loop.get("frames") or []) if loop else None


def fr_dump_paths(attempt) -> list[str]:
    """The newest flight-recorder dump the rank's hang watch wrote, and PyTorch's watchdog dump
    (meta.json ``fr.dump_file`` + rank) when it is a regular file written after the attempt started."""
    ours = sorted((int(m.group(1)), p) for p in attempt.evidence if (m := _FR_N.match(os.path.basename(p))))
    out = [ours[-1][1]] if ours else []
    path = watchdog_dump_path(attempt.meta, attempt.rank)
    st = _lstat(path) if path else None
    if st is not None and stat.S_ISREG(st.st_mode) and st.st_mtime >= (attempt.start_time or 0.0):
        out.insert(0, path)  # PyTorch's own, at its timeout: the later picture
    return out


def watchdog_dump_path(meta: dict, rank: int) -> str | None:
    """Where PyTorch's watchdog writes this rank's dump (meta.json ``fr.dump_file`` + rank), or None."""
    fr = meta.get("fr") if isinstance(meta, dict) and isinstance(meta.get("fr"), dict) else {}
    prefix = fr.get("dump_file")
    return f"{prefix}{rank}" if isinstance(prefix, str) and prefix and "\0" not in prefix else None


def watchdog_dump_stats(listing) -> dict[str, tuple[int, int] | None]:
    """(size, mtime_ns) of PyTorch's watchdog dumps (``watchdog_dump_path``), which may lie outside the
    run folder: for the fingerprint, so that a dump written after an ingest is read by the next one.
    Only when some attempt left stall evidence (without it there is no hang to explain); each
    attempt's meta.json is read through the regular-file gate, a missing or unreadable one skipped
    (read_meta warns of it)."""
    if not any(af.evidence for af in listing):
        return {}
    out: dict[str, tuple[int, int] | None] = {}
    for af in listing:
        try:
            meta = json.loads(read_regular(os.path.join(af.dir, META_FILE)))
        except (OSError, ValueError):
            continue
        path = watchdog_dump_path(meta, af.rank)
        if path and path not in out:
            st = _lstat(path)
            out[path] = None if st is None or not stat.S_ISREG(st.st_mode) else (st.st_size, st.st_mtime_ns)
    return out


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.stat(path, follow_symlinks=False)
    except (OSError, ValueError):
        return None


def _json(path: str, warnings: list[str]) -> dict | None:
    try:
        doc = json.loads(read_regular(path))
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        return doc
    except (OSError, ValueError) as e:
        warnings.append(f"{path}: skipped: not a readable hang record ({e})")
        return None


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _int(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None
