"""A user's --on-finding command, for the tests: appends what it was given to a file, then behaves as told.

python on_finding_cmd.py OUT MODES: MODES is comma-separated, each "ok", "fail-KIND" (exit 3 with a
message on stderr for a finding of KIND) or "slow-KIND" (sleep a minute for a finding of KIND).
"""

import json
import os
import sys
import time

out, modes = sys.argv[1], sys.argv[2].split(",")
finding = json.load(sys.stdin)
with open(out, "a") as f:
    f.write(json.dumps({"kind_env": os.environ.get("KFORGE_FINDING_KIND"), "run": os.environ.get("KFORGE_RUN_NAME"),
                        "severity_env": os.environ.get("KFORGE_FINDING_SEVERITY"), "pid": os.getpid(),
                        "finding": finding}) + "\n")
if f"fail-{finding['kind']}" in modes:
    print("boom: cannot reach the chat server", file=sys.stderr)
    sys.exit(3)
if f"slow-{finding['kind']}" in modes:
    time.sleep(60)
