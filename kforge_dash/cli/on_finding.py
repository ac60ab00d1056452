"""`kforge-ingest --on-finding CMD`: findings as events. CMD runs once per new finding of a pass.

CMD is run by the shell with the finding (summary.json's finding object) as JSON on stdin and
``KFORGE_FINDING_KIND``, ``KFORGE_FINDING_SEVERITY``, ``KFORGE_RUN_DIR`` and ``KFORGE_RUN_NAME`` in
its environment; its output is captured (the end of its stderr is shown when it fails). A command
that fails or runs past its timeout (then its whole process group is killed) is reported on stderr
and the watch goes on.

Once per finding, across passes and restarts of the watcher: the findings a command was run for are
kept in RUN/ingested/on_finding.json, written *before* the command runs (a watcher killed meanwhile
loses that one event rather than sending it twice). A finding is the same one while its kind,
metric, phase and ranks are and its steps overlap the kept ones (a live run's finding grows: a
straggler that goes on, an episode that has not ended); the kept steps grow with it.

Also across watchers of one run (two terminals, a cron job and a user): reading the kept findings,
choosing the new ones and writing them back happen under the run's lock RUN/ingested/.on_finding.lock,
so of two watchers only the first to take it runs the command. The commands run after the lock is
released (the record is written first, so holding it while they run would only make the other
watcher wait). A watcher that cannot take the lock within ``lock_timeout_s`` (another one stuck
holding it), or cannot write the record, sends nothing for that run this pass, says so once, and
tries again at the next pass.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

from kforge_dash.optional import require
from kforge_record.atomic import write_json_atomic

SEEN_FILE = "on_finding.json"
LOCK_FILE = ".on_finding.lock"  # beside SEEN_FILE; not a temp file (ingest's clean-up leaves it)
LOCK_TIMEOUT_S = 10.0  # held for a read and a small write: only a stuck watcher holds it this long
SEEN_VERSION = 1
STDERR_TAIL = 300  # characters of a failing command's stderr shown


@dataclass(frozen=True)
class OnFinding:
    command: str
    timeout_s: float
    lock_timeout_s: float = LOCK_TIMEOUT_S  # the longest wait for the run's on-finding lock

    def __post_init__(self):
        if not isinstance(self.command, str) or not self.command.strip():
            raise ValueError("--on-finding: the command is empty")
        if not self.timeout_s > 0:
            raise ValueError(f"--on-finding-timeout: must be > 0, got {self.timeout_s!r}")
        if not (isinstance(self.lock_timeout_s, (int, float)) and self.lock_timeout_s >= 0):
            raise ValueError(f"lock_timeout_s: must be >= 0 seconds, got {self.lock_timeout_s!r}")


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
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as e:
        warn(f"{path}: unreadable ({type(e).__name__}: {e}); every finding of this run counts as new")
        return []
    seen = data.get("seen") if isinstance(data, dict) else None
    return [s for s in seen or [] if isinstance(s, dict) and isinstance(s.get("id"), list)]


def new_findings(ingested_dir: str, findings: list[dict], warn: Callable[[str], None]) -> list[dict]:
    """The findings not seen before in this run; all of them are marked seen (on disk) on return."""
    path = os.path.join(ingested_dir, SEEN_FILE)
    seen = _load(path, warn)
    new, changed = [], False
    for f in findings:
        if not isinstance(f, dict):
            continue
        same = [s for s in seen if s["id"] == _identity(f) and _overlaps(s, f)]
        if not same:
            new.append(f)
            lo = f.get("first_step")
            hi = f.get("last_step") if f.get("last_step") is not None else lo
            seen.append({"id": _identity(f), "first_step": lo, "last_step": hi})
            changed = True
            continue
        s = same[0]
        if f.get("first_step") is not None:  # the finding grew: keep its steps
            lo, hi = min(s["first_step"], f["first_step"]), max(s["last_step"], f.get("last_step") or f["first_step"])
            changed |= (lo, hi) != (s["first_step"], s["last_step"])
            s["first_step"], s["last_step"] = lo, hi
    if changed:
        write_json_atomic(path, {"version": SEEN_VERSION, "seen": seen})
    return new


def claim_new_findings(ingested_dir: str, findings: list[dict], lock_timeout_s: float,
                       warn: Callable[[str], None]) -> list[dict]:
    """new_findings under the run's on-finding lock: the findings this caller is to send, recorded as
    sent. None of them (with one warning) when the lock was not had within ``lock_timeout_s`` or the
    record could not be written: the next pass tries again."""
    filelock = require("filelock", extra="ingest", purpose="--on-finding")
    lock = filelock.FileLock(os.path.join(ingested_dir, LOCK_FILE))
    try:
        with lock.acquire(timeout=lock_timeout_s):
            return new_findings(ingested_dir, findings, warn)
    except filelock.Timeout:  # (before OSError: a Timeout is one)
        warn(f"{lock.lock_file}: held by another watcher of this run for over {lock_timeout_s:g}s; "
             "its new findings are not sent this pass (tried again at the next)")
    except OSError as e:
        warn(f"{os.path.join(ingested_dir, SEEN_FILE)}: could not be updated ({type(e).__name__}: {e}); "
             "its new findings are not sent this pass (tried again at the next)")
    return []


def run_command(hook: OnFinding, finding: dict, run_dir: str) -> str | None:
    """Run the command for one finding; None when it exited 0, else what went wrong (one line)."""
    env = dict(os.environ, KFORGE_FINDING_KIND=str(finding.get("kind")), KFORGE_FINDING_SEVERITY=str(finding.get("severity")),
               KFORGE_RUN_DIR=run_dir, KFORGE_RUN_NAME=os.path.basename(run_dir))
    try:
        proc = subprocess.Popen(hook.command, shell=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env, start_new_session=True)  # its own group: killed whole
    except OSError as e:
        return f"could not start ({e})"
    try:
        _, err = proc.communicate(json.dumps(finding).encode(), timeout=hook.timeout_s)
    except subprocess.TimeoutExpired:
        _kill(proc)
        return f"timed out after {hook.timeout_s:g}s (killed)"
    except BaseException:  # Ctrl-C: the command goes too
        _kill(proc)
        raise
    if proc.returncode == 0:
        return None
    tail = err.decode(errors="replace").strip()[-STDERR_TAIL:].replace("\n", " | ")
    return f"exited with status {proc.returncode}" + (f": {tail}" if tail else "")


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    proc.communicate()


def after_pass(hook: OnFinding, result, report: Callable[[str], None]) -> int:
    """Run the command for each new finding of the pass's runs; how many commands failed."""
    failed = 0
    for r in result.ok:
        for f in claim_new_findings(r.ingested_dir, r.summary.get("findings") or [], hook.lock_timeout_s, report):
            err = run_command(hook, f, r.run_dir)
            if err is not None:
                failed += 1
                report(f"--on-finding for {f.get('kind')} at steps {f.get('first_step')}-{f.get('last_step')} of "
                       f"{r.run_dir}: {err}")
    return failed
