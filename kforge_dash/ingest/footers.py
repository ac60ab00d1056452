"""Reading the footers of many part files: on a few threads, or in worker processes.

A footer costs 40-130 us in pyarrow (open the file, read its tail, parse the Thrift footer, build
the Arrow schema), with the GIL released, and then 15-120 us of Python (shards.read_part: the
key-value metadata and the step statistics; more for a merged part). So ``read_attempts`` reads
the attempt folders (meta.json, end.json, footers) on a few threads, whose pyarrow and file
reads overlap one another's Python; each attempt's warnings are kept with it and handed on in
the listing's order, as if read one after the other. A run of 1024 ranks x 1000 parts (a million
footers) goes to worker processes first (``read_footers``), which run the Python side in parallel
too. The workers are plain `python -m kforge_dash.ingest.footers IN OUT` processes (not
multiprocessing, whose spawn re-imports the caller's __main__: a notebook, a Streamlit page or an
unguarded script would break or run again). Any failure leaves the footers to the caller.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor


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
                procs.append((subprocess.Popen([sys.executable, "-m", "kforge_dash.ingest.footers", src, dst],
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


def read_many(items: list) -> list:
    """[(path, PartInfo | None, warnings)] for (path, rank) items, read here one after the other."""
    from kforge_dash.ingest import shards

    out = []
    for path, rank in items:
        warns: list[str] = []
        out.append((path, shards.read_part(path, rank, warns), warns))
    return out


THREADS = 2  # threads reading attempts (more do not pay on 2 cores)
THREADS_MIN_PARTS = 256  # below this, one thread reads them (a few ms in all)
CHUNK = 32  # part files per task: few tasks, yet the first comes back soon


def read_attempts(listing: list, warnings: list[str], cache, *, threads: int | None = None) -> list:
    """shards.read_attempt of every attempt folder, on a few threads when there are many part
    files: [Attempt | None] in the listing's order, each attempt's warnings added to ``warnings``
    in that order too, as if read one after the other. ``cache``: a manifest.FooterCache."""
    from kforge_dash.ingest import shards

    threads = min(THREADS, usable_cpus()) if threads is None else threads
    if threads < 2 or sum(len(af.parts) for af in listing) < THREADS_MIN_PARTS:
        return [shards.read_attempt(af, warnings, cache) for af in listing]
    chunks, size = [[]], 0
    for af in listing:  # consecutive attempts of about CHUNK parts
        if size >= CHUNK:
            chunks.append([])
            size = 0
        chunks[-1].append(af)
        size += len(af.parts) + 1

    def read(chunk: list) -> list:
        out = []
        for af in chunk:
            mine, theirs = [], cache.child()
            out.append((shards.read_attempt(af, mine, theirs), mine, theirs))
        return out

    attempts = []
    with ThreadPoolExecutor(threads, thread_name_prefix="kforge-footers") as pool:
        futures = [pool.submit(read, chunk) for chunk in chunks]
        try:
            for future in futures:  # in order: a vanished part (PartVanished) is raised where it would be
                for attempt, mine, theirs in future.result():
                    warnings.extend(mine)
                    cache.absorb(theirs)
                    attempts.append(attempt)
        finally:
            for future in futures:
                future.cancel()
    return attempts


def _main(src: str, dst: str) -> None:
    with open(src, "rb") as f:
        items = pickle.load(f)
    out = read_many(items)
    with open(dst, "wb") as f:
        pickle.dump(out, f, protocol=pickle.HIGHEST_PROTOCOL)


if __name__ == "__main__":
    _main(sys.argv[1], sys.argv[2])
