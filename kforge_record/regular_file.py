"""Open only regular files, never blocking: the one gate every kforge reader goes through.

A FIFO (or a symlink to one) nothing writes blocks ``open()`` for ever; a device may never end.
So whatever kforge reads from a run (part files, meta.json, end.json, heartbeat.bin, summary.json,
on_finding.json, options files, flight-recorder dumps) is opened here: ``os.stat`` first (a FIFO or
device is refused before any open), then an ``O_NONBLOCK`` open and ``fstat`` of what was opened
(the path may have been swapped in between). Readers that take a path (pyarrow, polars) get it
only after ``check_regular_file``.

``NotRegularFile`` is an OSError, so every reader's ``except OSError`` already skips the file with
the warning naming it.
"""

from __future__ import annotations

import os
import stat

_KINDS = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class NotRegularFile(OSError):
    """A path that is not a regular file (after symlinks): never opened for reading."""

    def __init__(self, path: str, mode: int):
        kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
        super().__init__(f"{kind}, not a regular file: not read")
        self.filename = os.fspath(path)

    def __str__(self) -> str:  # the message alone: callers name the file themselves
        return self.args[0]


def is_regular_file(path: str | os.PathLike) -> bool:
    """True when ``path`` (symlinks followed) is a regular file; never opens it."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def check_regular_file(path: str | os.PathLike) -> None:
    """Raise NotRegularFile (or FileNotFoundError / OSError from stat) unless ``path`` is a regular
    file: call before handing a path to a reader that opens it itself (pyarrow, polars)."""
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise NotRegularFile(path, mode)


def open_regular(path: str | os.PathLike, mode: str = "rb", encoding: str | None = None):
    """``open(path, mode)`` for reading, refusing anything but a regular file and never blocking:
    NotRegularFile (an OSError) for a FIFO, device, socket or directory."""
    if mode not in ("r", "rb", "rt"):
        raise ValueError(f"open_regular reads only, not mode {mode!r}")
    fd = open_regular_fd(path)
    try:
        return os.fdopen(fd, mode, encoding=None if "b" in mode else (encoding or "utf-8"))
    except BaseException:
        os.close(fd)
        raise


def read_regular_bytes(path: str | os.PathLike, limit: int | None = None, *, follow_symlinks: bool = True) -> bytes:
    """The bytes of a regular file (at most ``limit``), as open_regular refuses anything else;
    ``follow_symlinks=False``: a symlink is refused too (O_NOFOLLOW: evidence files a job wrote itself)."""
    fd = open_regular_fd(path, follow_symlinks=follow_symlinks)
    with os.fdopen(fd, "rb") as f:
        return f.read() if limit is None else f.read(limit)


def open_regular_fd(path: str | os.PathLike, *, follow_symlinks: bool = True) -> int:
    """A read-only descriptor on a regular file (the caller closes it); as open_regular."""
    if follow_symlinks:
        check_regular_file(path)
    nofollow = 0 if follow_symlinks else getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | nofollow)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(path, st.st_mode)  # swapped for a FIFO since the stat
        os.set_blocking(fd, True)  # (no effect on a regular file: plain reads from here on)
        return fd
    except BaseException:
        os.close(fd)
        raise
