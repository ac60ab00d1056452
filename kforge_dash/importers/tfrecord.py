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
from dataclasses import dataclass

import google_crc32c

_HEADER = struct.Struct("<QI")
_CRC = struct.Struct("<I")
_MASK_DELTA = 0xA282EAD8


def masked_crc32c(data: bytes | memoryview) -> int:
    crc = google_crc32c.value(bytes(data))
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


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
    """The data of every whole record of one file, in order, and why the walk stopped (None: at the end)."""

    path: str
    data: list[bytes]
    stop: RecordStop | None


def read_records(path: str) -> Records:
    """Every record's data in the TFRecord file ``path`` (an OSError is the caller's)."""
    with open(path, "rb") as f:
        buf = f.read()
    out: list[bytes] = []
    append = out.append
    value = google_crc32c.value
    unpack_header = _HEADER.unpack_from
    unpack_crc = _CRC.unpack_from
    end = len(buf)
    off = 0
    stop = None
    while off < end:
        if end - off < 12:
            stop = RecordStop(path, off, "truncated", f"a {end - off}-byte tail, shorter than a record header")
            break
        length, length_crc = unpack_header(buf, off)
        crc = value(buf[off:off + 8])
        if length_crc != ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF:
            stop = RecordStop(path, off, "corrupt", "a record whose length fails its checksum")
            break
        start = off + 12
        if end - start < length + 4:
            stop = RecordStop(path, off, "truncated", f"a record of {length} bytes cut short ({end - start} bytes there)")
            break
        data = buf[start:start + length]
        crc = value(data)
        if unpack_crc(buf, start + length)[0] != ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF:
            stop = RecordStop(path, off, "corrupt", "a record whose data fails its checksum")
            break
        append(data)
        off = start + length + 4
    return Records(path, out, stop)
