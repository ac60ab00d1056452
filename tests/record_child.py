"""A stand-in training loop run as a child process by the crash tests.

Usage: python record_child.py RUN_DIR MODE [options as key=value]
MODE off-main: the Recorder is built on another thread, then used from the main thread.
Prints "step N" after each end_step so the parent knows how far it got (mode flush-each also
calls flush() every step and prints "flushed N" once it returned).
start_at=UNIX_TIME: busy-wait until then before building the Recorder (children started together).
heal_at=N (mode disk-full): writes fail until step N, where the loop first flushes, then frees the
"disk"; after the first window from N on it flushes again (the writer then handled that window alone).
progress=PATH: instead of printing, write the last ended step into PATH (8 bytes, through mmap:
the page survives a SIGKILL), so that a loop with nothing but end_step stays that fast.
"""

import mmap
import resource
import signal
import struct
import sys
import threading
import time

from kforge_record import Recorder

run_dir, mode = sys.argv[1], sys.argv[2]
opts = dict(a.split("=", 1) for a in sys.argv[3:])
steps = int(opts.get("steps", 1_000_000))
sleep_s = float(opts.get("sleep", 0.002))

stop = []
if mode == "flag-handler":
    # The usual pattern: the job's handler only asks the loop to stop after the current step.
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))

if mode == "prev-handler":
    # A handler the job installed before the recorder: it must still run after our flush.
    def _prev(signum, frame):
        print("previous handler ran", flush=True)
        sys.exit(0)
    signal.signal(signal.SIGTERM, _prev)

start_at = float(opts.get("start_at", 0))
while time.time() < start_at:  # several children building their Recorder in the same instant
    pass

window = int(opts.get("flush_every_steps", 20))


def build():
    return Recorder(run_dir, rank=0, world_size=1,
                    flush_every_steps=window,
                    flush_every_s=float(opts.get("flush_every_s", 3600)),
                    max_backlog_rows=int(opts.get("max_backlog_rows", 100_000)))


if mode == "off-main":
    # Built on a setup thread, used from the main thread's loop below.
    built = []
    setup = threading.Thread(target=lambda: built.append(build()))
    setup.start()
    setup.join()
    rec = built[0]
else:
    rec = build()

if mode == "disk-full":
    # Past meta.json, no file may grow beyond 1 byte: every part write fails with EFBIG,
    # the way a full disk fails with ENOSPC. SIGXFSZ would kill us; the recorder must see the error.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1, resource.RLIM_INFINITY))

class SlowToConvert:
    """slow=MS: each step also logs a value the writer thread needs MS milliseconds to read."""

    def __float__(self):
        time.sleep(float(opts["slow"]) / 1000)
        return 1.0


extra = {"slow": SlowToConvert()} if "slow" in opts else {}
progress = None
if "progress" in opts:
    with open(opts["progress"], "wb") as f:
        f.write(bytes(8))
    with open(opts["progress"], "r+b") as f:
        progress = mmap.mmap(f.fileno(), 8)

heal_at = int(opts.get("heal_at", 0))
stop_after = 0
for step in range(1, steps + 1):
    if heal_at and step == heal_at:
        rec.flush()  # let the writer meet the full disk for every window so far, then free space
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    rec.start_step()
    time.sleep(sleep_s)
    rec.end_step(step, loss=1.0 / step, lr=1e-3, tokens=128, **extra)
    if heal_at and step == heal_at + window - 1:
        # The first window after the heal is handed over: wait until the writer has handled it alone.
        # Otherwise, on a loaded machine, the loop runs on and the writer takes several windows at
        # once, whose rows push more of the waiting ones out of the bound (up to all 50).
        rec.flush()
    if progress is not None:
        struct.pack_into("<q", progress, 0, step)
        continue
    print(f"step {step}", flush=True)
    if mode == "flush-each":  # flush() every step: "flushed N" means steps 1..N are on disk
        rec.flush()
        print(f"flushed {step}", flush=True)
    if stop:
        stop_after = stop_after or step
        if step >= stop_after + 10:
            break  # ten more steps after the signal, then a clean exit
print(f"dropped {rec.dropped_rows}", flush=True)
rec.close()
print("done", flush=True)
