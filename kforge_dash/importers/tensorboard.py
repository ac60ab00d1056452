"""Read TensorBoard event files as TensorBoard's ``EventAccumulator`` does, ten times faster.

A *run* is a folder holding files with ``tfevents`` in their name (not ``.profile-empty``),
read in name order, as TensorBoard's directory loader does. Scalars are ``simple_value`` summaries
and 0-d tensors of the ``scalars`` plugin; every value is the float the event's protobuf holds,
converted exactly as ``EventAccumulator`` converts it (the same compiled protos).

Restarts, as ``EventAccumulator`` (``purge_orphaned_data=True``) handles them: with a file version
of 2 or more (``brain.Event:2``, every writer since TensorFlow 1.0), a ``SessionLog.START`` event at
step S (``SummaryWriter(purge_step=S)``) purges every point of every tag at step >= S; with an older
or no file version, a summary event whose step is below the latest step seen purges the points of
its own tags at or after its step. Purged points are kept aside (``Superseded``), never dropped.
"""

from __future__ import annotations

import os

import numpy as np
from google.protobuf.message import DecodeError
from tensorboard.compat.proto import event_pb2

from kforge_dash.importers import scalar_events
from kforge_dash.importers.source import OUT_OF_ORDER, PURGE_STEP, SourceFile, SourceRun
from kforge_dash.importers.tfrecord import read_records

_START = event_pb2.SessionLog.START
_BULK_MIN = 64  # a shorter run of plain scalar events is taken event by event (numpy's per-call cost)


def is_event_file(name: str) -> bool:
    return "tfevents" in name and not name.endswith(".profile-empty")


def find_runs(logdir: str) -> list[str]:
    """The run folders under ``logdir`` (itself included), sorted; symlinked folders are not followed."""
    runs = []
    for folder, dirs, files in os.walk(logdir):
        dirs.sort()
        if any(is_event_file(f) and os.path.isfile(os.path.join(folder, f)) for f in files):
            runs.append(folder)
    return sorted(runs)


def read_run(folder: str, name: str) -> SourceRun:
    """Every scalar of the TensorBoard run in ``folder``; problems go to the run's warnings/errors."""
    files = sorted(f for f in os.listdir(folder) if is_event_file(f) and os.path.isfile(os.path.join(folder, f)))
    run = SourceRun(kind="tensorboard", name=name, source=folder, files=[])
    acc = _Accumulator(run)
    for f in files:
        path = os.path.join(folder, f)
        try:
            run.files.append(SourceFile(path, os.path.getsize(path)))
            records = read_records(path)
        except OSError as e:
            run.errors.append(f"{path}: could not be read: {e.strerror or e}; skipped")
            continue
        acc.records(records)
        if records.stop is not None:
            stop = records.stop
            (run.warnings if stop.kind == "truncated" else run.errors).append(
                f"{stop.message()}; the rest of the file is not read (TensorBoard stops there too)")
    return run


class _Accumulator:
    """EventAccumulator's scalar bookkeeping: the points kept by tag, the purges, the hparams."""

    def __init__(self, run: SourceRun):
        self.run = run
        self.file_version: float | None = None
        self.most_recent_step = -1
        self.metadata_seen: set[str] = set()
        self.tensor_scalars: set[str] = set()

    def records(self, records) -> None:
        """Every record of one file, in order: runs of plain scalar events in bulk where nothing can
        purge between them (file version 2: only a SessionLog.START event purges, and it is not plain)."""
        plain = scalar_events.decode(records.buf, records.starts, records.lengths)
        n = len(records.starts)
        i = 0
        for j in [*np.flatnonzero(~plain.mask).tolist(), n]:
            if j - i >= _BULK_MIN and self.file_version and self.file_version >= 2:
                self._bulk(plain, i, j)
            else:
                for k in range(i, j):
                    self._plain(plain, k)
            if j < n:
                self._parsed(records, j)
            i = j + 1

    def _bulk(self, plain, i: int, j: int) -> None:
        if self.run.start_time is None:
            self.run.start_time = float(plain.walls[i])
        codes = plain.codes[i:j]
        order = np.argsort(codes, kind="stable")
        sorted_codes = codes[order]
        cuts = np.flatnonzero(sorted_codes[1:] != sorted_codes[:-1]) + 1
        for rows in np.split(order, cuts):
            rows = rows + i
            self.run.series_of(plain.tags[int(plain.codes[rows[0]])]).extend(
                plain.steps[rows], plain.walls[rows], plain.values[rows])

    def _plain(self, plain, k: int) -> None:
        """One plain scalar event, as ``event`` would take it."""
        step, wall, tag = int(plain.steps[k]), float(plain.walls[k]), plain.tags[int(plain.codes[k])]
        if self.run.start_time is None:
            self.run.start_time = wall
        if not (self.file_version and self.file_version >= 2):
            if step < self.most_recent_step:
                self._purge(step, [tag], OUT_OF_ORDER)
            else:
                self.most_recent_step = step
        self.run.series_of(tag).add(step, wall, float(plain.values[k]))

    def _parsed(self, records, k: int) -> None:
        try:
            event = event_pb2.Event.FromString(records.data(k))
        except DecodeError as e:
            self.run.errors.append(f"{records.path}: the record at byte offset {int(records.starts[k]) - 12} "
                                   f"is not an Event ({e}); skipped")
            return
        self.event(event)

    def event(self, event) -> None:
        what = event.WhichOneof("what")
        if self.run.start_time is None:
            self.run.start_time = event.wall_time
        if what == "file_version":
            self.file_version = _file_version(event.file_version)
        self._maybe_purge(event, what)
        if what == "summary":
            self._summary(event)

    def _maybe_purge(self, event, what) -> None:
        if self.file_version and self.file_version >= 2:
            if what == "session_log" and event.session_log.status == _START:
                self._purge(event.step, None, PURGE_STEP)
        elif event.step < self.most_recent_step and what == "summary":
            self._purge(event.step, [v.tag for v in event.summary.value], OUT_OF_ORDER)
        else:
            self.most_recent_step = event.step

    def _purge(self, step: int, tags, reason: str) -> None:
        """Points at ``step`` or later (of ``tags``; None: of every tag) go to the superseded points."""
        for tag in (self.run.series if tags is None else [t for t in dict.fromkeys(tags) if t in self.run.series]):
            s = self.run.series[tag]
            steps, walls, values = s.arrays()
            keep = steps < step
            if keep.all():
                continue
            self.run.superseded.extend(tag, steps[~keep], walls[~keep], values[~keep], reason, step)
            s.replace(steps[keep], walls[keep], values[keep])

    def _summary(self, event) -> None:
        step, wall = event.step, event.wall_time
        for v in event.summary.value:
            tag = v.tag
            if tag not in self.metadata_seen and v.HasField("metadata"):
                self._metadata(tag, v.metadata)
            kind = v.WhichOneof("value")
            if kind == "simple_value":
                value = v.simple_value
            elif kind == "tensor" and tag in self.tensor_scalars:
                value = _tensor_scalar(v.tensor)
                if value is None:
                    continue
            else:
                continue
            self.run.series_of(tag).add(step, wall, value)

    def _metadata(self, tag: str, metadata) -> None:
        """The first metadata of a tag only, as EventAccumulator keeps it."""
        self.metadata_seen.add(tag)
        plugin = metadata.plugin_data.plugin_name
        if plugin == "scalars":
            self.tensor_scalars.add(tag)
        elif plugin == "hparams":
            self._hparams(metadata.plugin_data.content)

    def _hparams(self, content: bytes) -> None:
        from tensorboard.plugins.hparams import plugin_data_pb2

        try:
            data = plugin_data_pb2.HParamsPluginData.FromString(content)
        except DecodeError as e:
            self.run.warnings.append(f"{self.run.source}: hparams that cannot be read ({e}); left out")
            return
        for key, value in data.session_start_info.hparams.items():
            kind = value.WhichOneof("kind")
            if kind in ("number_value", "string_value", "bool_value"):
                self.run.hparams[key] = getattr(value, kind)


def _file_version(text: str) -> float:
    """event_util.ParseFileVersion: "brain.Event:2" -> 2.0; unreadable -> -1."""
    try:
        return float(text.split("brain.Event:")[-1])
    except ValueError:
        return -1.0


def _tensor_scalar(tensor) -> float | None:
    """A 0-d (or one-element) float tensor's value as EventAccumulator's caller reads it
    (``tensor_util.make_ndarray(proto).item()``); None for any other tensor."""
    from tensorboard.util import tensor_util

    try:
        arr = tensor_util.make_ndarray(tensor)
    except Exception:  # a tensor TensorBoard cannot decode either
        return None
    if arr.size != 1 or arr.dtype.kind != "f":
        return None
    return float(arr.item())
