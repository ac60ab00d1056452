"""`kforge-ingest --on-finding CMD`: findings as events. CMD runs once per new finding of a pass.

CMD is run by the shell with the finding (summary.json's finding object) as JSON on stdin and
``KFORGE_FINDING_KIND``, ``KFORGE_FINDING_SEVERITY``, ``KFORGE_RUN_DIR`` and ``KFORGE_RUN_NAME`` in
its environment; its stdout and stderr go to a temp file (the end is shown when it fails). Files,
not pipes: a daemon the command leaves behind cannot hold the watcher. A command that fails (its
exit status or signal is reported) or runs past its timeout (then its whole process group is
killed, and the watcher waits for nothing more) is reported on stderr and the watch goes on.
Commands run one at a time, so they never pile up.

Once per finding, across passes and restarts of the watcher (at most once): each finding is kept
in RUN/ingested/on_finding.json just before its own command runs, so a watcher killed meanwhile
loses at most the one event in flight (whose command may well have finished: it is not killed with
the watcher) and never sends one twice; the findings after it are sent by the next watcher. The
file keeps the newest SEEN_MAX findings. A finding is the same one while its kind, metric, phase
and ranks are and its steps overlap the kept ones (a live run's finding grows: a straggler that
goes on, an episode that has not ended); the kept steps grow with it.

Also across watchers of one run (two terminals, a cron job and a user): reading the kept findings
and writing one back happen under the run's lock RUN/ingested/.on_finding.lock, so of two watchers
only the first to claim a finding runs its command. The command runs after the lock is released
(the record is written first, so holding it while it runs would only make the other watcher
wait). A watcher that cannot take the lock within ``lock_timeout_s`` (another one stuck holding
it), or cannot write the record, sends nothing more for that run this pass, says so once, and
tries again at the next pass.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

from kforge_dash.optional import require
from kforge_dash.text import step_range
from kforge_record.atomic import write_json_atomic
from kforge_record.checks import check_positive, check_seconds
from kforge_record.regular_file import open_regular

SEEN_FILE = "on_finding.json"
LOCK_FILE = ".on_finding.lock"  # beside SEEN_FILE; not a temp file (ingest's clean-up leaves it)
LOCK_TIMEOUT_S = 10.0  # held for a read and a small write: only a stuck watcher holds it this long
SEEN_VERSION = 1
STDERR_TAIL = 300  # characters of a failing command's stderr shown
SEEN_MAX = 10_000  # findings kept in SEEN_FILE (the newest): the file stays bounded


@dataclass(frozen=True)
class OnFinding:
    command: str
    timeout_s: float
    lock_timeout_s: float = LOCK_TIMEOUT_S  # the longest wait for the run's on-finding lock

    def __post_init__(self):
        if not isinstance(self.command, str) or not self.command.strip():
            raise ValueError("--on-finding: the command is empty")
        check_positive("timeout_s", self.timeout_s, "a positive number of seconds")  # the checks every option shares
        check_seconds("lock_timeout_s", self.lock_timeout_s)


def _identity(f: dict) -> list:
    if f.get("kind") == "hang":  # one per stall: ranks still writing their evidence change its ranks, not what it is
        return ["hang"]
    return [f.get("kind"), f.get("metric"), f.get("phase"), sorted(f.get("ranks") or [])]


def _overlaps(a: dict, f: dict) -> bool:
    lo, hi = f.get("first_step"), f.get("last_step")
    if lo is None or a.get("first_step") is None:
        return lo is None and a.get("first_step") is None
    hi = lo if hi is None else hi
    return lo <= a["last_step"] and a["first_step"] <= hi


def _load(path: str, warn: Callable[[str], None]) -> list[dict]:
    try:
        with open_regular(path, "r") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as e:
        warn(f"{path}: unreadable ({type(e).__name__}: {e}); every finding of this run counts as new")
        return []
    seen = data.get("seen") if isinstance(data, dict) else None
    return [s for s in seen or [] if isinstance(s, dict) and isinstance(s.get("id"), list)]


def _merge(seen: list[dict], f: dict) -> tuple[bool, bool]:
    """(is ``f`` new, did ``seen`` change): a new finding is added to ``seen``; a known one that grew
    has its kept steps widened."""
    same = [s for s in seen if s["id"] == _identity(f) and _overlaps(s, f)]
    if not same:
        lo = f.get("first_step")
        hi = f.get("last_step") if f.get("last_step") is not None else lo
        seen.append({"id": _identity(f), "first_step": lo, "last_step": hi})
        return True, True
    s = same[0]
    if f.get("first_step") is None:
        return False, False
    lo, hi = min(s["first_step"], f["first_step"]), max(s["last_step"], f.get("last_step") or f["first_step"])
    changed = (lo, hi) != (s["first_step"], s["last_step"])
    s["first_step"], s["last_step"] = lo, hi
    return False, changed


def _save(path: str, seen: list[dict]) -> None:
    # bounded: a watcher left for months keeps the newest SEEN_MAX (a finding older than those could be sent again)
    write_json_atomic(path, {"version": SEEN_VERSION, "seen": seen[-SEEN_MAX:]})


def new_findings(ingested_dir: str, findings: list[dict], warn: Callable[[str], None], *, mark: bool = True) -> list[dict]:
    """The findings not seen before in this run; with ``mark`` all of them are marked seen (on disk)
    on return, else only the kept steps of known findings that grew are updated."""
    path = os.path.join(ingested_dir, SEEN_FILE)
    seen = _load(path, warn)
    new, changed = [], False
    for f in findings:
        if not isinstance(f, dict):
            continue
        before = len(seen)
        is_new, grew = _merge(seen, f)
        if is_new:
            new.append(f)
            if not mark:
                del seen[before:]
                continue
        changed |= grew
    if changed:
        _save(path, seen)
    return new


def _locked(ingested_dir: str, lock_timeout_s: float, warn: Callable[[str], None], what: str, fn):
    """``fn()`` under the run's on-finding lock; None (and one warning) when the lock was not had
    within ``lock_timeout_s`` or the record could not be written."""
    filelock = require("filelock", extra="ingest", purpose="--on-finding")
    lock = filelock.FileLock(os.path.join(ingested_dir, LOCK_FILE))
    try:
        with lock.acquire(timeout=lock_timeout_s):
            return fn()
    except filelock.Timeout:  # (before OSError: a Timeout is one)
        warn(f"{lock.lock_file}: held by another watcher of this run for over {lock_timeout_s:g}s; "
             f"{what} (tried again at the next pass)")
    except OSError as e:
        warn(f"{os.path.join(ingested_dir, SEEN_FILE)}: could not be updated ({type(e).__name__}: {e}); "
             f"{what} (tried again at the next pass)")
    return None


def claim_new_findings(ingested_dir: str, findings: list[dict], lock_timeout_s: float,
                       warn: Callable[[str], None]) -> list[dict]:
    """new_findings under the run's on-finding lock: the findings this caller is to send, recorded as
    sent. None of them (with one warning) when the lock was not had within ``lock_timeout_s`` or the
    record could not be written: the next pass tries again."""
    got = _locked(ingested_dir, lock_timeout_s, warn, "its new findings are not sent this pass",
                  lambda: new_findings(ingested_dir, findings, warn))
    return got or []


def claim_finding(ingested_dir: str, finding: dict, lock_timeout_s: float, warn: Callable[[str], None]) -> bool | None:
    """Mark one finding sent, under the run's lock, just before its command runs: True when this
    caller is to send it, False when it was sent already (by another watcher meanwhile), None when the
    lock or the record failed (warned: the next pass tries again)."""
    return _locked(ingested_dir, lock_timeout_s, warn, "its new findings are not sent this pass",
                   lambda: bool(new_findings(ingested_dir, [finding], warn)))


def run_command(hook: OnFinding, finding: dict, run_dir: str) -> str | None:
    """Run the command for one finding; None when it exited 0, else what went wrong (one line).

    The command gets files, never pipes: stdin a file holding the finding, stdout and stderr one
    unnamed temp file (its tail is shown when it fails). So a daemon it leaves behind (in a session of
    its own, out of reach of the group kill) holding them blocks nothing: the watcher waits for the
    command's own process only, at most ``timeout_s``."""
    env = dict(os.environ, KFORGE_FINDING_KIND=str(finding.get("kind")), KFORGE_FINDING_SEVERITY=str(finding.get("severity")),
               KFORGE_RUN_DIR=run_dir, KFORGE_RUN_NAME=os.path.basename(run_dir))
    with tempfile.TemporaryFile() as stdin, tempfile.TemporaryFile() as out:
        stdin.write(json.dumps(finding).encode())
        stdin.seek(0)
        try:
            proc = subprocess.Popen(hook.command, shell=True, stdin=stdin, stdout=out, stderr=out, env=env,
                                    start_new_session=True)  # its own group: killed whole
        except OSError as e:
            return f"could not start ({e})"
        try:
            proc.wait(timeout=hook.timeout_s)
        except subprocess.TimeoutExpired:
            _kill(proc)
            return f"timed out after {hook.timeout_s:g}s (killed)"
        except BaseException:  # Ctrl-C: the command goes too
            _kill(proc)
            raise
        if proc.returncode == 0:
            return None
        tail = _tail(out.fileno()).decode(errors="replace").strip()[-STDERR_TAIL:].replace("\n", " | ")
    what = f"killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exited with status {proc.returncode}"
    return what + (f": {tail}" if tail else "")


def _tail(fd: int) -> bytes:
    """The last bytes the command wrote (a daemon may still be writing: read what is there now)."""
    size = os.fstat(fd).st_size
    n = min(size, 4 * STDERR_TAIL)
    return os.pread(fd, n, size - n)


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    proc.wait()  # the shell itself: SIGKILLed, it exits at once (its descendants' files are not waited on)


def after_pass(hook: OnFinding, result, report: Callable[[str], None]) -> int:
    """Run the command for each new finding of the pass's runs; how many commands failed."""
    failed = 0
    for r in result.ok:
        todo = _locked(r.ingested_dir, hook.lock_timeout_s, report, "its new findings are not sent this pass",
                       lambda: new_findings(r.ingested_dir, r.summary.get("findings") or [], report, mark=False))
        for f in todo or []:
            claimed = claim_finding(r.ingested_dir, f, hook.lock_timeout_s, report)
            if claimed is None:
                break  # warned; the rest are tried again at the next pass
            if not claimed:
                continue  # another watcher sent it meanwhile
            err = run_command(hook, f, r.run_dir)
            if err is not None:
                failed += 1
                steps = step_range(f.get("first_step"), f.get("last_step")) or "unknown steps"
                report(f"--on-finding for {f.get('kind')} at {steps} of "
                       f"{r.run_dir}: {err}")
    return failed
