"""TensorBoard export: one event file per run, written from tensorboard's own protos and framing.

Why not ``SummaryWriter.add_scalar``: it builds, queues and frames one Event per value (~40 µs a
value). Here each step is one ``Event`` whose ``Summary`` holds all of that step's values, framed by
tensorboard's own ``RecordWriter`` (TFRecord, masked CRC32C) into a temp file that then atomically
replaces the run's single kforge event file, so a re-export never duplicates a point and a reader
sees either the old file or the new one.

Framing: tensorboard's ``RecordWriter`` computes its masked CRC32C in pure Python (~40 µs for a
20-value step, most of the export's time). When ``google-crc32c`` (C, optional, in the ``ingest``
extra) is installed, ``_FastRecordWriter`` writes the very same bytes with the C checksum; the tests
check it against tensorboard's ``RecordWriter`` byte for byte.

Values are ``simple_value`` (float32, what ``add_scalar`` writes and ``EventAccumulator.Scalars``
reads). NaN and inf are written as they are: TensorBoard stores them, and a NaN loss must show.
Null is no point. Wall time is the step's recorded time (steps.parquet ``time``).
"""

from __future__ import annotations

import glob
import os
import struct

from kforge_dash.export.history import History
from kforge_dash.optional import require
from kforge_record.atomic import atomic_path

EVENT_SUFFIX = ".kforge"  # marks the event files this module owns (others in the logdir are left alone)
FILE_VERSION = "brain.Event:2"


def _protos():
    event_pb2 = require("tensorboard.compat.proto.event_pb2", extra="ingest", purpose="TensorBoard export")
    record_writer = require("tensorboard.summary.writer.record_writer", extra="ingest", purpose="TensorBoard export")
    return event_pb2, record_writer.RecordWriter


def _masked_crc32c_c():
    """google-crc32c's C checksum with TFRecord's masking, or None when it is not installed."""
    try:
        import google_crc32c
    except ImportError:
        return None
    if google_crc32c.implementation != "c":
        return None  # its pure-Python fallback is no faster than tensorboard's
    value = google_crc32c.value

    def masked(data: bytes) -> int:
        x = value(data)
        return (((x >> 15) | (x << 17)) + 0xA282EAD8) & 0xFFFFFFFF

    return masked


class _FastRecordWriter:
    """tensorboard's RecordWriter format (uint64 length, masked CRC of it, data, masked CRC of data)."""

    def __init__(self, f, masked_crc):
        self._write = f.write
        self._crc = masked_crc

    def write(self, data: bytes) -> None:
        header = struct.pack("<Q", len(data))
        crc = self._crc
        self._write(header + struct.pack("<I", crc(header)) + data + struct.pack("<I", crc(data)))


def event_file_name(history: History) -> str:
    # Deterministic (first step's time), so re-exporting the same history rewrites the same name.
    t0 = int(history.frame["time"][0]) if history.n_steps else 0
    return f"events.out.tfevents.{t0:010d}{EVENT_SUFFIX}"


def write_tensorboard(history: History, logdir: str, *, with_ranks: bool = True, fast_crc: bool = True) -> tuple[str, int]:
    """Write the history to ``logdir``; returns (event file path, number of points written).

    ``fast_crc=False`` always frames with tensorboard's own (pure-Python) RecordWriter.
    """
    event_pb2, RecordWriter = _protos()
    Event = event_pb2.Event
    os.makedirs(logdir, exist_ok=True)
    path = os.path.join(logdir, event_file_name(history))
    # The temp name must not contain "tfevents": TensorBoard would read a leftover one as events.
    tmp = os.path.join(logdir, f".kforge-events.{os.getpid()}.tmp")
    tags = history.tags + (history.rank_tags if with_ranks else ())
    points = 0
    with atomic_path(path, tmp=tmp):
        with open(tmp, "wb") as f:
            masked_crc = _masked_crc32c_c() if fast_crc else None
            w = _FastRecordWriter(f, masked_crc) if masked_crc else RecordWriter(f)
            t0 = float(history.frame["time"][0]) if history.n_steps else 0.0
            w.write(Event(wall_time=t0, file_version=FILE_VERSION).SerializeToString())
            for row in history.rows(with_ranks=with_ranks):
                ev = Event(step=row[0], wall_time=row[1])
                add = ev.summary.value.add  # in place: building Values then a Summary copies each twice
                for tag, v in zip(tags, row[2:]):
                    if v is not None:
                        add(tag=tag, simple_value=v)
                points += len(ev.summary.value)
                w.write(ev.SerializeToString())
    # Older kforge files (a different first-step time) would duplicate every point: remove them.
    for old in glob.glob(os.path.join(glob.escape(logdir), f"events.out.tfevents.*{EVENT_SUFFIX}")):
        if old != path:
            _remove(old)
    return path, points


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
