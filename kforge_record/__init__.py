"""kforge_record: a tiny, crash-safe recorder of per-step training facts (see docs/CONTRACT.md).

Imports only pyarrow (and torch when the training process already has it). ``Recorder`` and
``ModelSpec`` load on first use: ingest imports ``kforge_record.schema`` and ``.atomic`` alone,
without the recorder's writer, its numpy/pyarrow conversion and its environment probes.

    recorder.py   the in-loop recorder: end_step reads two clocks and appends a tuple
    options.py    the Recorder's options, validated once at construction
    checks.py     one check per kind of option value, shared by every option of kforge
    model.py      the model description recorded for FLOPs, and its FLOPs per token
    phase.py      phase timers: with rec.phase("data")
    env.py        what the recorder learns from its process once: rank, launch, device
    inbox.py      the hand-over between the training thread and the writer thread
    convert.py    buffered rows to an Arrow table, on the writer thread
    writer.py     the writer thread: everything that touches the disk
    compact.py    a rank's small part files merged into bigger ones as the run goes
    leftovers.py  what a killed merge left in an attempt folder, removed
    atomic.py     the one way kforge publishes a file: temp name, fsync, rename
    regular_file.py  open only regular files, never blocking
    schema.py     the on-disk contract between the recorder and ingest
    check.py      a run directory checked against that contract
    heartbeat.py  the rank's heartbeat, in a memory-mapped file a SIGKILL keeps
    hang.py       the hang watch: a rank that ends no step for hang_after_s leaves its evidence
    hw.py         GPU telemetry of this rank's GPU, on a daemon thread
    replica.py    a parameter checksum replicas agree on to the bit
    lifecycle.py  live recorders at SIGTERM, at fork, off the main thread
    warn.py       the recorder's one way to warn: once per kind, never raising
    version.py    the kforge version
    integrations/ adapters for HF Trainer, Lightning, Accelerate, KempnerForge
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
