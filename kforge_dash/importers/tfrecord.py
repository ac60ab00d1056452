"""TFRecord framing, read with checksums: what TensorBoard event files are made of.

A record is ``uint64 length | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)``,
little-endian; the CRC is CRC-32C (Castagnoli) from ``google-crc32c`` (a C library), masked as
TensorFlow does (rotate right by 15, add 0xa282ead8). A file is read whole and walked once.

What stops a walk (``RecordStop``): a tail shorter than a record (a file being written, or cut
off: ``truncated``) or a record whose length or data fails its checksum (``corrupt``). Both keep
every record before them, as TensorBoard's own reader does, and name the file and byte offset.
"""

from __future__ import annotations

import struct
from array import array
from dataclasses import dataclass

import google_crc32c
import numpy as np

_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")
_MASK_DELTA = 0xA282EAD8


def masked_crc32c(data: bytes) -> int:
    return _masked(google_crc32c.value(data))


@dataclass(frozen=True)
class RecordStop:
    """Why a walk stopped before the end of its file."""

    path: str
    offset: int  # byte offset of the record that could not be read
    kind: str  # "truncated" (a short tail: a live or cut-off file) or "corrupt" (a checksum failed)
    detail: str

    def message(self) -> str:
        return f"{self.path}: {self.detail} at byte offset {self.offset}"


@dataclass(frozen=True)
class Records:
    """Where each whole record's data lies in the file's bytes, in order, and why the walk stopped
    (None: at the end)."""

    path: str
    buf: bytes
    starts: np.ndarray  # int64 byte offset of each record's data
    lengths: np.ndarray  # int64 length of each record's data
    stop: RecordStop | None

    def data(self, i: int) -> bytes:
        start = int(self.starts[i])
        return self.buf[start:start + int(self.lengths[i])]


def read_records(path: str) -> Records:
    """Every whole record of the TFRecord file ``path`` (an OSError is the caller's)."""
    with open(path, "rb") as f:
        buf = f.read()
    starts, length_crcs, data_crcs = array("q"), array("Q"), array("Q")  # 8 bytes a record each, not ~36
    add_start, add_lcrc, add_dcrc = starts.append, length_crcs.append, data_crcs.append
    value = google_crc32c.value
    unpack = _LENGTH.unpack_from
    end = len(buf)
    off = 0
    stop = None
    # The walk only computes the CRCs (one C call each); masking and comparing them with the stored
    # ones is done for all records at once below: 1.19 -> 0.73-1.0 us a record, on a loaded machine
    # (PYTHONPATH=$PWD python3 benchmarks/bench_import.py).
    while off < end:
        if end - off < 12:
            stop = RecordStop(path, off, "truncated", f"a {end - off}-byte tail, shorter than a record header")
            break
        length = unpack(buf, off)[0]
        start = off + 12
        if end - start < length + 4:
            if _masked(value(buf[off:off + 8])) != _CRC.unpack_from(buf, off + 8)[0]:
                stop = RecordStop(path, off, "corrupt", "a record whose length fails its checksum")
            else:
                stop = RecordStop(path, off, "truncated", f"a record of {length} bytes cut short ({end - start} bytes there)")
            break
        add_start(start)
        add_lcrc(value(buf[off:start - 4]))
        add_dcrc(value(buf[start:start + length]))
        off = start + length + 4
    st = np.frombuffer(starts, dtype=np.int64)
    lengths = np.frombuffer(buf, dtype="<u8", count=0) if not len(st) else _gather_u64(buf, st - 12).astype(np.int64)
    bad = (_masked_np(np.frombuffer(length_crcs, dtype=np.uint64)) != _gather_u32(buf, st - 4)) | (
        _masked_np(np.frombuffer(data_crcs, dtype=np.uint64)) != _gather_u32(buf, st + lengths))
    if bad.any():
        first = int(np.argmax(bad))
        which = "length" if _masked(length_crcs[first]) != _CRC.unpack_from(buf, int(st[first]) - 4)[0] else "data"
        stop = RecordStop(path, int(st[first]) - 12, "corrupt", f"a record whose {which} fails its checksum")
        st, lengths = st[:first], lengths[:first]
    return Records(path, buf, st, lengths, stop)


def _masked(crc: int) -> int:
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def _masked_np(crc: np.ndarray) -> np.ndarray:
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def _gather_u32(buf: bytes, at: np.ndarray) -> np.ndarray:
    raw = np.frombuffer(buf, dtype=np.uint8)
    b = raw[at[:, None] + np.arange(4)].astype(np.uint64)
    return b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16) | (b[:, 3] << 24)


def _gather_u64(buf: bytes, at: np.ndarray) -> np.ndarray:
    raw = np.frombuffer(buf, dtype=np.uint8)
    return np.ascontiguousarray(raw[at[:, None] + np.arange(8)]).view("<u8").ravel()
