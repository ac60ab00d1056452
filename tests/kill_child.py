"""A launch of a 2-rank job on the fake clock of findings_fixtures, run as a child process.

Usage: python kill_child.py RUN_DIR T_START FIRST LAST FLUSH_AT KILL [PAUSE_AT]

Both ranks (two Recorders in this process) start at T_START (their processes 5 s before), run
steps FIRST..LAST of 0.1 s each, flush after step FLUSH_AT (0: never) and then either SIGKILL this
process after step LAST (KILL=1: the rows after FLUSH_AT are lost, the heartbeats stay) or close
(KILL=0). Prints "clock T" (the fake clock after the last step) before it dies. PAUSE_AT: after
that step (past FLUSH_AT) print "paused" and wait for a line on stdin before going on.
"""

import os
import signal
import sys

from findings_fixtures import Clock, drive, install, open_ranks

run_dir, t_start, first, last, flush_at, kill = sys.argv[1:7]
first, last, flush_at = int(first), int(last), int(flush_at)
pause_at = int(sys.argv[7]) if len(sys.argv) > 7 else 0


class _Patch:  # what findings_fixtures.install needs of pytest's monkeypatch
    def setattr(self, obj, name, value):
        setattr(obj, name, value)


clock = install(_Patch(), Clock(float(t_start)), process_lead_s=5.0)
recs = open_ranks(run_dir, 2, flush_every_steps=10_000)


def phases(rank, step):
    return [("fwd_bwd", 0.1)]


if flush_at:
    drive(recs, range(first, flush_at + 1), clock, phases=phases)
    for rec in recs.values():
        rec.flush()
    first = flush_at + 1
if pause_at:
    drive(recs, range(first, pause_at + 1), clock, phases=phases)
    print("paused", flush=True)
    sys.stdin.readline()
    first = pause_at + 1
drive(recs, range(first, last + 1), clock, phases=phases)
print(f"clock {clock.t!r}", flush=True)
if kill == "1":
    os.kill(os.getpid(), signal.SIGKILL)
for rec in recs.values():
    rec.close()
