"""kforge_record: a tiny, crash-safe recorder of per-step training facts (see docs/CONTRACT.md).

Imports only pyarrow (and torch when the training process already has it). ``Recorder`` and
``ModelSpec`` load on first use: ingest imports ``kforge_record.schema`` and ``.atomic`` alone,
without the recorder's writer, its numpy/pyarrow conversion and its environment probes.
"""

from .schema import SCHEMA_VERSION, SchemaError
from .version import __version__

__all__ = ["Recorder", "ModelSpec", "SCHEMA_VERSION", "SchemaError", "__version__"]

_LAZY = {"Recorder": "recorder", "ModelSpec": "model"}


def __getattr__(name):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'kforge_record' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{mod}", __name__), name)
    globals()[name] = value  # once: later lookups are plain attribute reads
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
