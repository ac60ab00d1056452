"""A user's --on-finding command, for the tests: appends what it was given to a file, then behaves as told.

python on_finding_cmd.py OUT MODES: MODES is comma-separated, each "ok", "fail-KIND" (exit 3 with a
message on stderr for a finding of KIND), "slow-KIND" (sleep a minute for a finding of KIND),
"sleep-N" (sleep N seconds for any finding) or "daemon" (first leave a process in a session of its
own, holding this command's stdout and stderr, for 30 s; its pid is written as "daemon_pid").
"""

import json
import os
import subprocess
import sys
import time

out, modes = sys.argv[1], sys.argv[2].split(",")
finding = json.load(sys.stdin)
daemon = None
if "daemon" in modes:  # inherits fds 0-2; out of reach of a kill of this command's process group
    daemon = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True).pid
with open(out, "a") as f:
    f.write(json.dumps({"kind_env": os.environ.get("KFORGE_FINDING_KIND"), "run": os.environ.get("KFORGE_RUN_NAME"),
                        "severity_env": os.environ.get("KFORGE_FINDING_SEVERITY"), "pid": os.getpid(),
                        "daemon_pid": daemon, "finding": finding}) + "\n")
if f"fail-{finding['kind']}" in modes:
    print("boom: cannot reach the chat server", file=sys.stderr)
    sys.exit(3)
if f"slow-{finding['kind']}" in modes:
    time.sleep(60)
for m in modes:
    if m.startswith("sleep-"):
        time.sleep(float(m.split("-", 1)[1]))
