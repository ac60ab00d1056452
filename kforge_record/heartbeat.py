"""The rank's heartbeat: its last ended step and when, in a memory-mapped file a SIGKILL keeps.

Rows reach disk at each flush, so a killed job loses up to a window of them; the heartbeat says
how far the rank really got. ``RUN/rank-NNNNN/ATTEMPT_ID/heartbeat.bin`` (docs/CONTRACT.md), 24
bytes, little-endian::

    0   8 bytes  magic b"KFHB" + uint32 layout version (1)
    8   int64    the last ended step (end_step's ``step``)
    16  float64  its end time (Unix s, the row's ``time``)

Created zero-filled after the magic: a time of 0 means no step has ended yet. ``end_step`` stores
the step, then the time, into the shared mapping: two stores to memory, no system call (the
kernel owns the page, so a SIGKILL loses nothing written; only a crash of the whole node does).
A SIGKILL between the two stores leaves the new step beside the previous step's time.

Never raises into the loop: a heartbeat that cannot be made is warned once and the stores go to a
private buffer instead, so the hot path has no branch for it. (The one thing that could hurt: a
file truncated to 0 bytes while the job runs makes the next store a SIGBUS, as for any mapped
file; nothing in kforge truncates it, and deleting it is harmless.)
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass

from .regular_file import read_regular_bytes

HEARTBEAT_FILE = "heartbeat.bin"
MAGIC = b"KFHB" + struct.pack("<I", 1)
SIZE = 24
_BODY = struct.Struct("<qd")


def _views(buf) -> tuple[memoryview, memoryview]:
    mv = memoryview(buf)
    return mv.cast("q"), mv.cast("d")  # [1]: the step, [2]: its time


def detached() -> tuple[memoryview, memoryview]:
    """Views on a private buffer: where the stores go when there is no heartbeat file (a forked
    child must never write its parent's)."""
    return _views(bytearray(SIZE))


def open_heartbeat(attempt_dir: str, warn) -> tuple[memoryview, memoryview]:
    """(step view, time view) on a fresh ``heartbeat.bin`` in ``attempt_dir``; store with
    ``step_view[1] = step`` then ``time_view[2] = t``."""
    path = os.path.join(attempt_dir, HEARTBEAT_FILE)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            os.write(fd, MAGIC + bytes(SIZE - len(MAGIC)))
            mm = mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)  # the mapping keeps the file
        return _views(mm)
    except (OSError, ValueError) as e:
        warn("heartbeat", f"could not create {path} ({e!r}); a SIGKILL's lost steps will not be known")
        return detached()


@dataclass(frozen=True)
class Heartbeat:
    """What a heartbeat file says: the last ended step and its end time (Unix s)."""

    step: int
    time: float


def read_heartbeat(path: str) -> Heartbeat | None:
    """The heartbeat in ``path``; None when absent or no step ended. Raises ValueError for a file
    that is not a heartbeat (wrong size or magic, an end time that is not finite), OSError when it
    cannot be read or is not a regular file (a FIFO is never opened: regular_file.py)."""
    try:
        data = read_regular_bytes(path, SIZE + 1)  # a FIFO or device: refused, never blocks
    except FileNotFoundError:
        return None
    if len(data) != SIZE or data[:4] != MAGIC[:4]:
        raise ValueError(f"not a kforge heartbeat ({len(data)} bytes)")
    if data[:8] != MAGIC:
        raise ValueError(f"heartbeat layout {struct.unpack_from('<I', data, 4)[0]} is newer than this reader's (1)")
    step, t = _BODY.unpack_from(data, 8)
    if not math.isfinite(t):  # no recorder stores that: a damaged or foreign file (ingest checks the rest)
        raise ValueError(f"an impossible heartbeat: its end time is {t!r} (step {step})")
    return None if t == 0.0 else Heartbeat(step, t)
