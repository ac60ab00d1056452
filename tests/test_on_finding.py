"""kforge-ingest --on-finding CMD: a real command run once per new finding, across passes and restarts
of the watcher; a failing or slow one is reported and the ingest (the watch) goes on."""

from __future__ import annotations

import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from click.testing import CliRunner
from findings_fixtures import Clock, drive, install, open_ranks

from kforge_dash.cli.ingest import main

REPO = Path(__file__).resolve().parent.parent
CMD_SCRIPT = Path(__file__).resolve().parent / "on_finding_cmd.py"
NO_EXPORT = ["--no-tensorboard", "--no-wandb"]


def _cmd(out: Path, modes: str = "ok") -> str:
    return " ".join(shlex.quote(str(x)) for x in (sys.executable, CMD_SCRIPT, out, modes))


def _calls(out: Path) -> list[dict]:
    return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []


def _spike_nan(tmp_path) -> Path:
    root = tmp_path / "runs"
    shutil.copytree(REPO / "sample_runs" / "spike-nan", root / "spike-nan", ignore=shutil.ignore_patterns("ingested"))
    return root


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, IndexError):
        return True


def test_each_finding_is_sent_once_as_json_with_its_kind_also_after_a_rerun(tmp_path):
    root, out = _spike_nan(tmp_path), tmp_path / "calls.jsonl"
    r = CliRunner().invoke(main, [str(root), *NO_EXPORT, "--on-finding", _cmd(out)])
    assert r.exit_code == 0, r.output
    summary = json.loads((root / "spike-nan" / "ingested" / "summary.json").read_text())
    calls = _calls(out)
    assert [c["finding"] for c in calls] == summary["findings"] and len(calls) == 3
    assert all(c["kind_env"] == c["finding"]["kind"] and c["severity_env"] == c["finding"]["severity"]
               and c["run"] == "spike-nan" for c in calls)
    for again in (["--force"], []):  # a re-ingest from scratch, then an unchanged run: nothing new
        r = CliRunner().invoke(main, [str(root), *NO_EXPORT, *again, "--on-finding", _cmd(out)])
        assert r.exit_code == 0 and len(_calls(out)) == 3


def test_a_failing_or_slow_command_is_reported_and_the_ingest_goes_on(tmp_path):
    root, out = _spike_nan(tmp_path), tmp_path / "calls.jsonl"
    r = CliRunner().invoke(main, [str(root), *NO_EXPORT, "--on-finding", _cmd(out, "slow-loss_spike,fail-nonfinite"),
                                  "--on-finding-timeout", "1"])
    assert r.exit_code == 0, r.output
    assert "[warning] loss spike · step" in r.stdout  # the run's screen is printed as ever
    err = r.stderr.splitlines()
    assert sum("on-finding: --on-finding for loss_spike" in e and "timed out after 1s (killed)" in e for e in err) == 1
    assert sum("on-finding: --on-finding for nonfinite" in e and "exited with status 3: boom: cannot reach the chat server"
               in e for e in err) == 2
    calls = _calls(out)
    assert sorted(c["finding"]["kind"] for c in calls) == ["loss_spike", "nonfinite", "nonfinite"]
    # the slow ones were killed, not left running (SIGKILL lands a moment after killpg returns)
    _wait(lambda: all(_gone(c["pid"]) for c in calls), "the slow commands to be gone", timeout_s=10)
    r = CliRunner().invoke(main, [str(root), *NO_EXPORT, "--on-finding", _cmd(out, "fail-nonfinite")])
    assert r.exit_code == 0 and len(_calls(out)) == 3  # once: a failed command is not run again


def _wait(cond, what: str, proc=None, timeout_s: float = 120):
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert proc is None or proc.poll() is None, f"the watcher ended: {proc.communicate()}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_the_watch_sends_new_findings_as_they_appear_and_never_twice_across_restarts(tmp_path, monkeypatch):
    clock = install(monkeypatch, Clock())
    root, out = tmp_path / "runs", tmp_path / "calls.jsonl"
    recs = open_ranks(root / "live", 2, flush_every_steps=1000)
    summary_path = root / "live" / "ingested" / "summary.json"

    def record(steps, *, straggle: bool, nan_at=None):
        drive(recs, steps, clock, wait_phase="bwd",
              phases=lambda r, s: [("data", 0.01 + (0.05 if straggle and r == 1 else 0.0)), ("fwd", 0.1)],
              values=lambda r, s: {"loss": math.nan if (r, s) == (0, nan_at) else 1.0 / s, "tokens": 100})
        for rec in recs.values():
            rec.flush()

    record(range(1, 41), straggle=False)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    watcher = subprocess.Popen(
        [sys.executable, "-c", "from kforge_dash.cli.ingest import main; main()", str(root), "--watch", "0.2", *NO_EXPORT,
         "--quiet", "--on-finding", _cmd(out, "fail-straggler")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait(summary_path.exists, "the first pass", watcher)
        assert _calls(out) == []  # 40 clean steps: nothing to send
        record(range(41, 101), straggle=True)
        _wait(lambda: len(_calls(out)) >= 1, "the straggler", watcher)
        record(range(101, 141), straggle=True, nan_at=120)  # the straggler goes on; a NaN appears
        _wait(lambda: len(_calls(out)) >= 2, "the NaN", watcher)
        _wait(lambda: json.loads(summary_path.read_text())["last_step"] == 140, "steps 101-140", watcher)
    finally:
        watcher.send_signal(signal.SIGINT)
        _, err = watcher.communicate(timeout=120)
    assert watcher.returncode == 0, err
    assert "exited with status 3" in err  # the failing command was reported, and the watch went on
    (st,) = [f for f in json.loads(summary_path.read_text())["findings"] if f["kind"] == "straggler"]
    assert st["last_step"] == 140  # the straggler grew over two passes: still one finding
    r = CliRunner().invoke(main, [str(root), *NO_EXPORT, "--force", "--on-finding", _cmd(out)])  # a restart
    assert r.exit_code == 0, r.output
    calls = _calls(out)
    assert [(c["finding"]["kind"], c["finding"]["ranks"]) for c in calls] == [("straggler", [1]), ("nonfinite", [0])]
    assert abs(calls[0]["finding"]["first_step"] - 41) <= 5 and calls[1]["finding"]["first_step"] == 120
    for rec in recs.values():
        rec.close()


def _ingested_pass(root: Path):
    from kforge_dash.ingest.options import IngestOptions
    from kforge_dash.pipeline import ingest_paths

    done = ingest_paths([str(root)], options=IngestOptions(), exporters=[])
    assert len(done.ok) == 1 and len(done.ok[0].summary["findings"]) == 3
    return done


# kforge-ingest whose on-finding record is slow to write: each watcher, once it has read the record and
# chosen what to send, waits (up to 3 s) until the other has too, so two watchers that do not
# exclude each other both send every finding. MEET (the first argument) is a folder they meet in.
SLOW_RECORD_WATCHER = """
import os, sys, time
import kforge_dash.cli.on_finding as m
real, meet = m.write_json_atomic, sys.argv.pop(1)
def slow(path, obj):
    open(os.path.join(meet, str(os.getpid())), "w").close()
    deadline = time.monotonic() + 3
    while len(os.listdir(meet)) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    real(path, obj)
m.write_json_atomic = slow
from kforge_dash.cli.ingest import main
main()
"""


def test_two_watchers_of_one_run_send_each_finding_once(tmp_path):
    root, out, meet = _spike_nan(tmp_path), tmp_path / "calls.jsonl", tmp_path / "meet"
    meet.mkdir()
    done = _ingested_pass(root)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    watchers = [subprocess.Popen([sys.executable, "-c", SLOW_RECORD_WATCHER, str(meet), str(root), *NO_EXPORT, "--quiet",
                                  "--on-finding", _cmd(out)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for _ in range(2)]
    ends = [w.communicate(timeout=120) for w in watchers]
    assert [w.returncode for w in watchers] == [0, 0], ends
    assert not any("on-finding" in err for _, err in ends), ends
    calls = _calls(out)
    assert len(calls) == 3
    assert sorted(json.dumps(c["finding"], sort_keys=True) for c in calls) == \
        sorted(json.dumps(f, sort_keys=True) for f in done.ok[0].summary["findings"])  # each once, none twice


def test_a_watcher_that_cannot_take_the_lock_sends_nothing_that_pass_and_says_so_once(tmp_path):
    from filelock import FileLock

    from kforge_dash.cli.on_finding import LOCK_FILE, OnFinding, after_pass

    root, out = _spike_nan(tmp_path), tmp_path / "calls.jsonl"
    done = _ingested_pass(root)
    hook = OnFinding(_cmd(out), 60, lock_timeout_s=0.2)
    said = []
    with FileLock(str(root / "spike-nan" / "ingested" / LOCK_FILE)):  # another watcher, stuck holding it
        assert after_pass(hook, done, said.append) == 0
    assert len(said) == 1 and LOCK_FILE in said[0] and "not sent this pass" in said[0]
    assert _calls(out) == []
    assert after_pass(hook, done, said.append) == 0  # the next pass sends them
    assert len(_calls(out)) == 3 and len(said) == 1


def test_a_watcher_that_cannot_write_the_record_sends_nothing_that_pass_and_says_so_once(tmp_path, monkeypatch):
    import errno

    from kforge_dash.cli import on_finding
    from kforge_dash.cli.on_finding import SEEN_FILE, OnFinding, after_pass

    root, out = _spike_nan(tmp_path), tmp_path / "calls.jsonl"
    done = _ingested_pass(root)
    real_write = on_finding.write_json_atomic

    def full_disk(path, obj):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(on_finding, "write_json_atomic", full_disk)
    said = []
    assert after_pass(OnFinding(_cmd(out), 60), done, said.append) == 0
    assert len(said) == 1 and SEEN_FILE in said[0] and "No space left" in said[0] and "not sent this pass" in said[0]
    assert _calls(out) == []  # sent without a record, they would be sent again at the next pass
    monkeypatch.setattr(on_finding, "write_json_atomic", real_write)
    assert after_pass(OnFinding(_cmd(out), 60), done, said.append) == 0
    assert len(_calls(out)) == 3 and len(said) == 1


def _kill_daemons(calls):
    for c in calls:
        if c.get("daemon_pid"):
            try:
                os.kill(c["daemon_pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_command_that_leaves_a_daemon_holding_its_output_does_not_hold_the_watcher(tmp_path):
    """A daemon in its own session keeps the command's stdout/stderr open for 30 s: the watcher waits
    for the command only (issue 32.6). Four findings: exiting at once, then each slow and killed at 2 s."""
    from kforge_dash.cli.on_finding import OnFinding, after_pass

    root, out = _spike_nan(tmp_path), tmp_path / "calls.jsonl"
    done = _ingested_pass(root)
    n = len(json.loads((root / "spike-nan" / "ingested" / "summary.json").read_text())["findings"])
    said = []
    t0 = time.monotonic()
    try:
        assert after_pass(OnFinding(_cmd(out, "daemon"), 2), done, said.append) == 0
        took = time.monotonic() - t0
        assert len(_calls(out)) == n and said == []
        assert took < 10, f"{took:.1f} s: waited on the daemons"  # old code: n x 30 s
        for d in (root / "spike-nan" / "ingested").iterdir():
            if d.name == "on_finding.json":
                d.unlink()
        t0 = time.monotonic()
        assert after_pass(OnFinding(_cmd(out, "daemon,sleep-60"), 2), done, said.append) == n
        took = time.monotonic() - t0
    finally:
        _kill_daemons(_calls(out))
    assert len(said) == n and all("timed out after 2s (killed)" in s for s in said)
    assert took < n * 2 + 8, f"{took:.1f} s for {n} 2 s timeouts"


def test_a_watcher_killed_while_a_command_runs_loses_at_most_that_one_finding(tmp_path):
    """SIGKILL the watcher during the first of its 3 s commands, start it again: each finding is sent
    once: the one in flight by its own command (left running), the rest by the new watcher (issue 32.7)."""
    root, out = _spike_nan(tmp_path), tmp_path / "calls.jsonl"
    _ingested_pass(root)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    args = [sys.executable, "-m", "kforge_dash.cli.ingest", str(root), *NO_EXPORT, "--on-finding", _cmd(out, "sleep-3")]
    watcher = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _wait(lambda: len(_calls(out)) >= 1, "the first command", watcher)
    watcher.kill()
    watcher.wait()
    seen = json.loads((root / "spike-nan" / "ingested" / "on_finding.json").read_text())["seen"]
    assert len(seen) == 1  # only the finding in flight is marked sent
    again = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    _wait(lambda: all(_gone(c["pid"]) for c in _calls(out)), "the orphaned first command", timeout_s=20)
    summary = json.loads((root / "spike-nan" / "ingested" / "summary.json").read_text())
    sent = sorted(json.dumps(c["finding"], sort_keys=True) for c in _calls(out))
    assert sent == sorted(json.dumps(f, sort_keys=True) for f in summary["findings"])  # every finding, each once
