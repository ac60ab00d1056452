"""The types of the meta.json fields ingest reads (docs/CONTRACT.md, "Shards").

A field of another type (a hand-edited ``"device": "gpu"``, ``"peak_tflops": "fast"``) is dropped
with a warning naming the file and the key, as if it were absent: the attempt's rows are kept,
and only what needed the field (MFU, the device name) is unknown.
"""

from __future__ import annotations

import math


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# meta.json fields ingest reads, with the type each must have (docs/CONTRACT.md "Shards"); a field
# of another type (a hand-edited "device": "gpu") is dropped with a warning, as if absent.
_META_FIELDS = {
    "run_name": (lambda v: isinstance(v, str), "a string"),
    "rank": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    "world_size": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0, "a positive integer"),
    "counts_tokens": (lambda v: isinstance(v, bool), "true or false"),
    "peak_tflops": (lambda v: _number(v) and v > 0, "a positive number"),
    "device": (lambda v: isinstance(v, dict), "an object"),
    "model": (lambda v: isinstance(v, dict), "an object"),
    "launch": (lambda v: isinstance(v, dict), "an object"),
    "hparams": (lambda v: isinstance(v, dict), "an object"),
    "tags": (lambda v: isinstance(v, list), "a list"),
}
_DEVICE_FIELDS = ("name", "type")  # strings


def typed_fields(meta: dict, path: str, warnings: list[str]) -> dict:
    """``meta`` without the fields whose type is wrong (null counts as absent), each one warned about."""
    out = dict(meta)
    for key, (ok, want) in _META_FIELDS.items():
        v = out.get(key)
        if v is not None and not ok(v):
            warnings.append(f"{path}: field {key!r} is {type(v).__name__} {_short(v)}, expected {want}; ignored")
            del out[key]
    dev = out.get("device")
    if isinstance(dev, dict):
        for key in _DEVICE_FIELDS:
            v = dev.get(key)
            if v is not None and not isinstance(v, str):
                warnings.append(f"{path}: field 'device.{key}' is {type(v).__name__} {_short(v)}, expected a string; ignored")
                out["device"] = dev = {k: x for k, x in dev.items() if k != key}
    return out


def _short(v) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."
