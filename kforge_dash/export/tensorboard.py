"""TensorBoard export: one event file per run, in the run directory, from tensorboard's own protos.

Layout: ``RUN/events.out.tfevents.<N>.kforge``, so ``tensorboard --logdir runs/`` lists the run under
its own name (TensorBoard names a run by the directory holding its event files, relative to the
logdir). Event files of an older layout (``RUN/ingested/tensorboard/*.kforge``) are removed.

A TensorBoard server that is already running must follow re-exports. Both of its loaders keep a
file open and read on from where they stopped, so a file replaced under the same name is never
seen again. Their rules (tensorboard's ``directory_watcher.py``: a run's
files are read in name order, the next one only once the current one has no more data, and only
a name greater than the current one; the Rust data server reads each file from its last offset)
give the two cases:

* only new steps came (the new export starts with the bytes of the file on disk, as an ingest
  append gives): the new events are **appended** to the same file, in one write and an fsync;
* anything else (a full re-ingest changed earlier values, a restart, other options): the export is
  a **new file** with a greater ``N`` (the first step's time, or one more than the previous file's
  when that is not greater). It starts with a ``SessionLog.START`` at its first step, TensorBoard's
  rule for a restarted job: the points from that step on that were read from the file before are
  dropped, so nothing is shown twice. That previous file stays (one, never more): the Python
  loader reads a file to its end before it moves on, and one deleted under it (read again by
  name) stops it for good; the files before it are removed.
* the same bytes as on disk: nothing is written (a reload sees no change).

Why not ``SummaryWriter.add_scalar``: it builds, queues and frames one Event per value (~40 µs a
value). Here each step is one ``Event`` whose ``Summary`` holds all of that step's values, framed by
tensorboard's own ``RecordWriter`` (TFRecord, masked CRC32C) into a temp file first.

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

from kforge_dash import column_registry as reg
from kforge_dash.export.history import History
from kforge_dash.export.tb_findings import findings_by_step
from kforge_dash.optional import require
from kforge_dash.text import md_text
from kforge_record.atomic import publish

EVENT_SUFFIX = ".kforge"  # marks the event files this module owns (others in the logdir are left alone)
FILE_VERSION = "brain.Event:2"


def _protos():
    event_pb2 = require("tensorboard.compat.proto.event_pb2", extra="ingest", purpose="TensorBoard export")
    record_writer = require("tensorboard.summary.writer.record_writer", extra="ingest", purpose="TensorBoard export")
    return event_pb2, record_writer.RecordWriter


def _text_value(add, tag: str, text: str) -> None:
    """A text-plugin summary value (what tensorboard's text_pb writes: a scalar DT_STRING tensor)."""
    from tensorboard.compat.proto import types_pb2
    from tensorboard.plugins.text import metadata as text_metadata

    v = add(tag=tag, metadata=text_metadata.create_summary_metadata(display_name=None, description=None))
    v.tensor.dtype = types_pb2.DT_STRING
    v.tensor.tensor_shape.SetInParent()  # a scalar string, as text_pb writes it
    v.tensor.string_val.append(text.encode("utf-8"))


def _descriptions(history: History) -> dict:
    """{tag: scalar SummaryMetadata} whose display name and description (TensorBoard's tooltip on a card) are
    the column registry's label and help; written with each tag's first point only (as SummaryWriter does)."""
    from tensorboard.plugins.scalar import metadata as scalar_metadata

    def meta(label: str, help_: str):
        return scalar_metadata.create_summary_metadata(display_name=md_text(label), description=md_text(help_))

    out = {tag: meta(reg.lookup(col).titled, reg.help_of(col)) for tag, col in zip(history.tags, history.columns)}
    step_time = reg.lookup("step_time_s")
    for tag in history.rank_tags:
        rank = int(tag.rsplit("/", 1)[1])
        out[tag] = meta(f"{step_time.titled}, rank {rank}", f"rank {rank}'s own start_step -> end_step time")
    return out


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


EVENT_GLOB = f"events.out.tfevents.*{EVENT_SUFFIX}"


def _number(path: str) -> int:
    """N of ``events.out.tfevents.<N>.kforge`` (-1 when the name has no number there)."""
    try:
        return int(os.path.basename(path).split(".")[3])
    except (IndexError, ValueError):
        return -1


def kforge_event_files(logdir: str) -> list[str]:
    """This module's event files in ``logdir``, in the order TensorBoard reads them (by name)."""
    return sorted(glob.glob(os.path.join(glob.escape(logdir), EVENT_GLOB)))


def event_file_name(history: History, current: str | None = None) -> str:
    """The first step's time (deterministic: re-exporting the same history gives the same name), or,
    for a rewrite, a name TensorBoard reads after ``current`` (see the module doc)."""
    n = int(history.frame["time"][0]) if history.n_steps else 0
    if current is not None:
        n = max(n, _number(current) + 1)
    return f"events.out.tfevents.{n:010d}{EVENT_SUFFIX}"


def _events(history: History, w, with_ranks: bool, event_pb2) -> int:
    Event = event_pb2.Event
    tags = history.tags + (history.rank_tags if with_ranks else ())
    t0 = float(history.frame["time"][0]) if history.n_steps else 0.0
    w.write(Event(wall_time=t0, file_version=FILE_VERSION).SerializeToString())
    if history.n_steps:
        start = Event(step=int(history.frame["step"][0]), wall_time=t0)
        start.session_log.status = event_pb2.SessionLog.START  # a rewrite replaces what was read before
        w.write(start.SerializeToString())
    points = 0
    marks = findings_by_step(history.summary)  # findings/<kind> text summaries (tb_findings.py)
    # Each tag's words (display name, tooltip) go with its first point; a tag with no point has none to carry them.
    nulls = history.frame.null_count().row(0, named=True) if history.n_steps else {}
    pending = {t: m for t, m in _descriptions(history).items() if t in tags and nulls.get(t, 0) < history.n_steps}
    for row in history.rows(with_ranks=with_ranks):
        ev = Event(step=row[0], wall_time=row[1])
        add = ev.summary.value.add  # in place: building Values then a Summary copies each twice
        if pending:  # the first steps only: once every tag had its first point, the plain loop below
            for tag, v in zip(tags, row[2:]):
                if v is not None:
                    meta = pending.pop(tag, None)
                    add(tag=tag, simple_value=v) if meta is None else add(tag=tag, simple_value=v, metadata=meta)
        else:
            for tag, v in zip(tags, row[2:]):
                if v is not None:
                    add(tag=tag, simple_value=v)
        points += len(ev.summary.value)  # scalar points: the text summaries below are notes, not points
        for tag, text in marks.get(row[0], ()):
            _text_value(add, tag, text)
        w.write(ev.SerializeToString())
    return points


def _extends(old: str, new: str) -> int | None:
    """len(old) when the file ``new`` starts with all of ``old``'s bytes, else None."""
    try:
        size = os.path.getsize(old)
        if os.path.getsize(new) < size:
            return None
        with open(old, "rb") as a, open(new, "rb") as b:
            while True:
                x = a.read(1 << 20)
                if not x:
                    return size
                if b.read(len(x)) != x:
                    return None
    except OSError:
        return None


def _append(path: str, tmp: str, offset: int) -> None:
    with open(tmp, "rb") as src:
        src.seek(offset)
        data = src.read()
    with open(path, "ab") as f:
        f.write(data)  # whole records only: a reader never sees half a new step for long
        f.flush()
        os.fsync(f.fileno())


def write_tensorboard(history: History, logdir: str, *, with_ranks: bool = True, fast_crc: bool = True) -> tuple[str, int]:
    """Write the history to ``logdir`` (the run directory); returns (event file path, points in it).

    Appends, rewrites under a new name or leaves the file as it is (module doc).
    ``fast_crc=False`` always frames with tensorboard's own (pure-Python) RecordWriter.
    """
    event_pb2, RecordWriter = _protos()
    os.makedirs(logdir, exist_ok=True)
    mine = kforge_event_files(logdir)
    current = mine[-1] if mine else None
    # The temp name must not contain "tfevents": TensorBoard would read a leftover one as events.
    tmp = os.path.join(logdir, f".kforge-events.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            masked_crc = _masked_crc32c_c() if fast_crc else None
            w = _FastRecordWriter(f, masked_crc) if masked_crc else RecordWriter(f)
            points = _events(history, w, with_ranks, event_pb2)
        offset = _extends(current, tmp) if current is not None else None
        if offset is not None:
            if offset < os.path.getsize(tmp):
                _append(current, tmp, offset)
            path = current
        else:
            path = os.path.join(logdir, event_file_name(history, current))
            publish(tmp, path)  # fsync, rename, fsync the directory
    finally:
        _remove(tmp)
    for old in mine:
        # The file before a rewrite stays: a running TensorBoard reading it goes on to the new one
        # only after reading it to the end, and a deleted file stops it there (module doc). The new
        # file's SessionLog.START drops that file's points, so a fresh TensorBoard shows none twice.
        if old not in (path, current):
            _remove(old)
    _remove_old_layout(logdir)
    return path, points


def _remove_old_layout(run_dir: str) -> None:
    """kforge's event files of the layout before RUN/ (RUN/ingested/tensorboard/), and that folder if empty."""
    old_dir = os.path.join(run_dir, "ingested", "tensorboard")
    if not os.path.isdir(old_dir):
        return
    for old in kforge_event_files(old_dir):
        _remove(old)
    try:
        os.rmdir(old_dir)
    except OSError:
        pass  # other files (the user's own) stay


def stale_export(run_dir: str) -> str | None:
    """A warning when a kforge event file from an earlier export is in ``run_dir`` (for ``--no-tensorboard``)."""
    found = kforge_event_files(run_dir)
    if not found:
        return None
    return (f"{found[-1]}: TensorBoard export switched off (--no-tensorboard); this event file of an earlier "
            "export was left as it is and may be older than the ingested outputs (delete it, or export again)")


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
