"""Read W&B offline runs (``.wandb`` transaction logs) as wandb's own reader does.

A ``.wandb`` file is a 7-byte header (``:W&B``, magic 0xBEE1, version 0) and then LevelDB-log
records in 32 KiB blocks: ``uint32 crc | uint16 length | uint8 type`` (full, first, middle, last),
the CRC a zlib CRC-32 of the type byte and the data. Each whole record is a ``wandb.proto``
``Record``. What wandb keeps of a run's metrics is its ``history`` records: per record one step
(``step.num``), its items by key (nested keys joined with ``.``); numbers come from the items'
``number``/``integer`` fields or their ``value_json`` decoded as JSON (``NaN``, ``Infinity`` and
``-Infinity`` included), the same doubles ``wandb leet inspect --json`` prints. ``_timestamp`` is
the step's wall time; keys starting with ``_`` (``_step``, ``_runtime``, ``_timestamp``) are
wandb's own and not imported; a non-numeric value (text, media, a boolean) is left out, counted.
The run record gives the config (hparams), tags, host and start time.
"""

from __future__ import annotations

import json
import math
import os
import struct
import zlib

from google.protobuf.message import DecodeError

from kforge_dash.importers.source import SourceFile, SourceRun

_HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
_BLOCK = 32768
_REC = struct.Struct("<IHB")
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4
_TYPE_CRC = {t: zlib.crc32(bytes([t])) for t in range(256)}


def find_files(path: str) -> list[str]:
    """``path`` itself when it is a file, else every ``*.wandb`` file under it, sorted."""
    if os.path.isfile(path):
        return [path]
    out = []
    for folder, dirs, files in os.walk(path):
        dirs.sort()
        out += [os.path.join(folder, f) for f in sorted(files) if f.endswith(".wandb")]
    return out


def read_file(path: str) -> SourceRun:
    """One W&B run; its ``name`` is ``<display name>-<run id>`` (the run id alone without a name)."""
    from wandb.proto import wandb_internal_pb2

    run = SourceRun(kind="wandb", name="", source=path, files=[])
    with open(path, "rb") as f:
        buf = f.read()
    run.files.append(SourceFile(path, len(buf)))
    if buf[:7] != _HEADER:
        run.errors.append(f"{path}: not a W&B transaction log (header {buf[:7]!r}); nothing read")
        return run
    history = _History(run)
    for data in _records(buf, path, run):
        try:
            record = wandb_internal_pb2.Record.FromString(data)
        except DecodeError as e:
            run.errors.append(f"{path}: a record that is not a W&B Record ({e}); skipped")
            continue
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history.add(record.history)
        elif kind == "run":
            _run_record(run, record.run)
    history.finish()
    if not run.name:  # no run record: the file's own name (run-<id>)
        run.name = os.path.splitext(os.path.basename(path))[0]
    return run


def _records(buf: bytes, path: str, run: SourceRun):
    """The data of each whole logical record (fragments joined); stops, with a warning or an error
    naming the byte offset, at a short tail or a checksum that fails."""
    off, end = 7, len(buf)
    pending: list[bytes] | None = None
    while off < end:
        left = _BLOCK - off % _BLOCK
        if left < 7:  # a block's trailer: zeros
            off += left
            continue
        if end - off < 7:
            run.warnings.append(f"{path}: a {end - off}-byte tail at byte offset {off}, shorter than a record header; "
                                "stopped there")
            return
        crc, length, kind = _REC.unpack_from(buf, off)
        if crc == 0 and length == 0 and kind == 0:  # zero padding to the block's end
            off += left
            continue
        if off + 7 + length > end:
            run.warnings.append(f"{path}: a record cut short at byte offset {off} (a run still being written, or killed); "
                                "stopped there")
            return
        data = buf[off + 7:off + 7 + length]
        if zlib.crc32(data, _TYPE_CRC[kind]) != crc or kind not in (_FULL, _FIRST, _MIDDLE, _LAST):
            run.errors.append(f"{path}: a corrupt record at byte offset {off} (checksum or type fails); "
                              "the rest of the file is not read")
            return
        off += 7 + length
        if kind == _FULL:
            yield data
        elif kind == _FIRST:
            pending = [data]
        elif pending is not None:
            pending.append(data)
            if kind == _LAST:
                yield b"".join(pending)
                pending = None


def _run_record(run: SourceRun, rec) -> None:
    name = rec.display_name.replace(os.sep, "_").lstrip(".")
    run.name = f"{name}-{rec.run_id}" if name else rec.run_id
    run.host = rec.host or None
    if rec.HasField("start_time"):
        run.start_time = rec.start_time.seconds + rec.start_time.nanos / 1e9
    run.tags = list(rec.tags)
    for item in rec.config.update:
        key = item.key or ".".join(item.nested_key)
        if key == "_wandb":
            continue
        try:
            run.hparams[key] = json.loads(item.value_json)
        except ValueError:
            run.warnings.append(f"{run.source}: config {key!r} is not JSON; left out")
    run.about = {"run_id": rec.run_id, "project": rec.project, "entity": rec.entity, "display_name": rec.display_name}


class _History:
    def __init__(self, run: SourceRun):
        self.run = run
        self.skipped: dict[str, int] = {}

    def add(self, history) -> None:
        step = history.step.num
        values = {}
        wall = math.nan
        for item in history.item:
            key = item.key or ".".join(item.nested_key)
            if key == "_timestamp":
                wall = _number(item, key)
                wall = math.nan if wall is None else wall
            elif not key.startswith("_"):
                values[key] = item
        for key, item in values.items():
            value = _number(item, key)
            if value is None:
                self.skipped[key] = self.skipped.get(key, 0) + 1
            else:
                self.run.series_of(key).add(step, wall, value)

    def finish(self) -> None:
        for key, n in sorted(self.skipped.items()):
            self.run.warnings.append(f"{self.run.source}: {n} value(s) of {key!r} are not numbers (text, media, "
                                     "a boolean); left out")


def _number(item, key) -> float | None:
    kind = item.WhichOneof("value")  # typed values; older writers (and wandb-core today) use value_json
    if kind == "number":
        return item.number
    if kind == "integer":
        return float(item.integer)
    if kind is not None or not item.value_json:
        return None
    try:
        v = json.loads(item.value_json)
    except ValueError:
        return None
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
