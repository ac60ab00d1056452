"""The run's ingest lock (RUN/ingested/.ingest.lock): the one place it is taken.

Held by an ingest (kforge_dash/ingest/run.py) and by an export of the run (kforge_dash/pipeline.py,
kforge_dash/export/run.py), so two of them never write RUN/ingested/ at once and an ingest that finds
a temp file there knows it is a dead one's (kforge_dash/ingest/temps.py)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator

from kforge_dash.contract import LOCK_FILE
from kforge_dash.ingest.options import IngestError
from kforge_dash.optional import require


class LockBusy(IngestError):
    """Another ingest or export of the run held its lock for longer than the timeout; the message
    names the lock file and the wait."""


def lock_path(ingested_dir: str) -> str:
    return os.path.join(ingested_dir, LOCK_FILE)


@contextlib.contextmanager
def run_lock(ingested_dir: str, *, timeout_s: float | None, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold the run's ingest lock for the block. Another holder is waited for up to ``timeout_s``
    seconds (None: for ever), ``on_wait`` called once when it has to wait; then LockBusy."""
    filelock = require("filelock", extra="ingest", purpose="kforge-ingest")
    lock = filelock.FileLock(lock_path(ingested_dir))
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        if on_wait is not None:
            on_wait()
        try:
            lock.acquire(timeout=-1 if timeout_s is None else timeout_s)
        except filelock.Timeout:
            raise LockBusy(f"another kforge-ingest of this run held {lock.lock_file} for over {timeout_s:g}s") from None
    try:
        yield
    finally:
        lock.release()
