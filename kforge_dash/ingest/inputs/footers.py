"""Reading many part-file footers in worker processes.

Parsing a Parquet footer is Python-bound (pyarrow's ParquetFile set-up), about 60-100 us a file,
so threads do not help; a run of 1024 ranks x 1000 parts has a million footers. Workers are
plain `python -m kforge_dash.ingest.inputs.footers IN OUT` processes (not multiprocessing, whose spawn
re-imports the caller's __main__: a notebook, a Streamlit page or an unguarded script would
break or run again). Any failure leaves the footers to be read one by one by the caller.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
import time


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity, e.g. a Slurm allocation), not the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def read_footers(items: list, *, workers: int) -> dict | None:
    """{path: (PartInfo | None, warnings)} for (path, rank) items, read by ``workers``
    processes; None when the workers could not do it (the caller reads them itself)."""
    import kforge_dash

    root = os.path.dirname(os.path.dirname(os.path.abspath(kforge_dash.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    size = -(-len(items) // workers)
    with tempfile.TemporaryDirectory(prefix="kforge-footers-") as tmp:
        procs = []
        try:
            for i in range(0, len(items), size):
                src, dst = os.path.join(tmp, f"{i}.in"), os.path.join(tmp, f"{i}.out")
                with open(src, "wb") as f:
                    pickle.dump(items[i:i + size], f, protocol=pickle.HIGHEST_PROTOCOL)
                # cwd: `python -m` puts the working directory first on sys.path, where another
                # checkout's kforge_dash/ could shadow this one.
                procs.append((subprocess.Popen([sys.executable, "-m", "kforge_dash.ingest.inputs.footers", src, dst],
                                               cwd=tmp, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                               stderr=subprocess.DEVNULL), dst))
            # A worker never takes this long unless stuck (footers take ~0.1 ms each): give up on it.
            deadline = time.monotonic() + 60 + 0.01 * size
            out = {}
            for p, dst in procs:
                if p.wait(timeout=max(0.0, deadline - time.monotonic())) != 0:
                    return None
                with open(dst, "rb") as f:
                    for path, info, warns in pickle.load(f):
                        out[path] = (info, warns)
            return out
        except (OSError, pickle.PickleError, EOFError, subprocess.TimeoutExpired):
            return None
        finally:
            for p, _ in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()


def _main(src: str, dst: str) -> None:
    from kforge_dash.ingest.inputs.shards import read_part

    with open(src, "rb") as f:
        items = pickle.load(f)
    out = []
    for path, rank in items:
        warns: list[str] = []
        out.append((path, read_part(path, rank, warns), warns))
    with open(dst, "wb") as f:
        pickle.dump(out, f, protocol=pickle.HIGHEST_PROTOCOL)


if __name__ == "__main__":
    _main(sys.argv[1], sys.argv[2])
