"""The one way kforge publishes a file: write a temp name beside it, fsync, rename, fsync the folder.

Every writer uses it: the recorder's part files, meta.json and end.json; ingest's steps.parquet,
ranks.parquet, manifest.parquet and summary.json; the TensorBoard event file. A reader therefore
sees either the old file or the whole new one, also after a power cut. Temp names start with "."
and end with ".tmp", which every reader ignores (docs/CONTRACT.md).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from collections.abc import Iterator


def temp_name(path: str) -> str:
    """The temp file beside ``path`` that this process writes before publishing it."""
    d, name = os.path.split(path)
    return os.path.join(d, f".{name}.{os.getpid()}.tmp")


def fsync_dir(d: str) -> None:
    """Make a rename in ``d`` durable; best effort (some filesystems refuse to open a folder)."""
    try:
        fd = os.open(d or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_file(path: str) -> None:
    """Make the data of the file ``path`` durable (it must exist; an OSError is the caller's)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(tmp: str, path: str) -> None:
    """fsync the finished temp file ``tmp``, rename it over ``path``, fsync the folder."""
    fsync_file(tmp)
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path))


def publish_new(tmp: str, path: str) -> None:
    """Like ``publish``, but never replaces a file: FileExistsError when ``path`` exists already.

    A hard link is an exclusive, atomic rename: it fails when the name is taken. Where the
    filesystem has no hard links, ``O_EXCL`` claims the name first (an empty file for a moment,
    which readers skip as unreadable and read again next time) and the rename fills it.
    """
    fsync_file(tmp)
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError as e:
        if e.errno not in _NO_HARD_LINKS:
            raise
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        try:
            os.replace(tmp, path)
        except FileNotFoundError:  # the temp file was removed meanwhile: give the claimed name back
            with contextlib.suppress(OSError):
                os.remove(path)
            raise
    else:
        # Published: a temp file someone removed meanwhile (a clean-up, leftovers.py) must not make
        # this look like a failed write, or the rows would be written again under the next name.
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
    fsync_dir(os.path.dirname(path))


_NO_HARD_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.EMLINK, errno.ENOSYS}


@contextlib.contextmanager
def atomic_path(path: str, *, tmp: str | None = None, exclusive: bool = False) -> Iterator[str]:
    """Yield a temp path to write ``path``'s new content to; published on success, removed on error.

    For writers that want a file name (pyarrow, polars): ``with atomic_path(p) as t: df.write_parquet(t)``.
    ``exclusive=True``: never replace an existing ``path`` (FileExistsError instead).
    """
    tmp = tmp or temp_name(path)
    try:
        yield tmp
        (publish_new if exclusive else publish)(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)


def atomic_write_bytes(path: str, data: bytes) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)


def write_json_atomic(path: str, obj: dict) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode())
