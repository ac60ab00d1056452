"""Reading many part-file footers ahead of the plan: in a few threads, or in worker processes.

A footer costs 40-90 us (pyarrow opens the file, reads its tail, parses the Thrift footer and
builds the Arrow schema) and then ~20 us of Python (shards.read_part: key-value metadata and the
step statistics). pyarrow's open releases the GIL, so a few threads (``FooterThreads``) overlap
one file's open with another's Python; a run of 1024 ranks x 1000 parts (a million footers) goes
to worker processes (``read_footers``), which also run the Python side in parallel. The workers
are plain `python -m kforge_dash.ingest.footers IN OUT` processes (not multiprocessing, whose
spawn re-imports the caller's __main__: a notebook, a Streamlit page or an unguarded script would
break or run again). Any failure leaves the footers to be read one by one by the caller.

Either way each part's warnings are kept with it, and the caller takes them in the listing's
order: the warnings come out in the same order however the reads were spread.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor


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


CHUNK = 32  # footers a thread reads per task: few tasks, yet the first chunk comes back soon


class FooterThreads:
    """Footers of (path, rank) items read ahead by ``threads`` threads, in chunks in the given order;
    ``take(path)`` waits for that part's chunk and hands out (PartInfo | None, warnings), once.
    ``close()`` drops what is not started yet and waits for the rest (no thread outlives the plan)."""

    def __init__(self, items: list, *, threads: int, chunk: int | None = None):
        chunk = chunk or CHUNK
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="kforge-footers")
        self._chunks: list[Future] = []
        self._where: dict[str, int] = {}  # path -> its chunk
        self._got: dict[int, dict] = {}  # chunk -> {path: (info, warnings)} not yet taken
        for i in range(0, len(items), chunk):
            part = items[i:i + chunk]
            for path, _ in part:
                self._where[path] = len(self._chunks)
            self._chunks.append(self._pool.submit(read_many, part))

    def take(self, path: str):
        """(PartInfo | None, warnings) of a part read ahead, or None when it was not among the items
        (or was taken already)."""
        k = self._where.pop(path, None)
        if k is None:
            return None
        got = self._got.get(k)
        if got is None:
            got = self._got[k] = {p: (info, warns) for p, info, warns in self._chunks[k].result()}
        out = got.pop(path)
        if not got:
            del self._got[k]
        return out

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def _main(src: str, dst: str) -> None:
    with open(src, "rb") as f:
        items = pickle.load(f)
    out = read_many(items)
    with open(dst, "wb") as f:
        pickle.dump(out, f, protocol=pickle.HIGHEST_PROTOCOL)


if __name__ == "__main__":
    _main(sys.argv[1], sys.argv[2])
