"""Which ranks of a KempnerForge job hold the same parameters, from its own ``config.distributed``, and
the name of this rank's parameter checksum (kforge_record.replica) for ingest's replica check.

KempnerForge builds its DeviceMesh (``kempnerforge/distributed/setup.py``) row-major over the dims
``pp, dp_replicate, dp_shard, tp`` (``dp_shard`` -1: the ranks the others leave). A rank's local
parameters (its FSDP shard of its tensor-parallel slice of its pipeline stage) are the same, to the
bit, on the ranks that differ from it in ``dp_replicate`` only: those are its replicas. The checksum
is recorded as ``param_checksum`` when every rank of the job is a replica of every other (pure DDP),
else as ``param_checksum/GROUP`` with GROUP this rank's (pp, dp_shard, tp) coordinates, e.g.
``pp0-dps1-tp0`` (only the dims above 1 named): ingest compares each name among the ranks that
record it. With ``dp_replicate`` 1 and more than one shard (plain FSDP) no two ranks hold the same
parameters and there is nothing to compare: ``replica_name`` says why. KempnerForge itself is never imported.
"""

from __future__ import annotations

from kforge_record.integrations.kempnerforge_config import field
from kforge_record.replica import PARAM_CHECKSUM, group_checksum_name


class NoReplicas(ValueError):
    """Why this job's ranks have no replicas to compare (the warning says it)."""


def _size(dist, name: str, default: int = 1) -> int:
    v = field(dist, name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or (v < 1 and not (name == "dp_shard" and v == -1)):
        raise NoReplicas(f"config.distributed.{name}: must be a positive integer, got {v!r}")
    return v


def replica_name(config, rank: int, world_size: int) -> str:
    """The scalar name of this rank's parameter checksum (module doc); NoReplicas when none can be compared."""
    dist = field(config, "distributed")
    pp, rep, tp = (_size(dist, n) for n in ("pp", "dp_replicate", "tp"))
    for n in ("cp", "ep"):
        if _size(dist, n) > 1:
            raise NoReplicas(f"config.distributed.{n} > 1: the drop-in does not know that mesh's layout")
    shard = _size(dist, "dp_shard", -1)
    if shard == -1:
        if world_size % (pp * rep * tp):
            raise NoReplicas(f"world size {world_size} is not a multiple of pp*dp_replicate*tp ({pp * rep * tp})")
        shard = world_size // (pp * rep * tp)
    if pp * rep * shard * tp != world_size:
        raise NoReplicas(f"pp*dp_replicate*dp_shard*tp = {pp * rep * shard * tp}, not the world size {world_size}")
    if rep == 1 and world_size > 1:
        raise NoReplicas("dp_replicate is 1: each rank holds its own shard of the parameters, no replica to compare "
                         "with (set dp_replicate > 1 for hybrid sharding)")
    t, s, p = rank % tp, (rank // tp) % shard, rank // (tp * shard * rep)
    coords = [f"{n}{i}" for n, i, size in (("pp", p, pp), ("dps", s, shard), ("tp", t, tp)) if size > 1]
    return group_checksum_name("-".join(coords)) if coords else PARAM_CHECKSUM


def local_params(model):
    """The parameters this rank holds: each DTensor's local shard (FSDP2, tensor parallel), else the tensor."""
    for p in model.parameters():
        to_local = getattr(p, "to_local", None)
        yield to_local() if callable(to_local) else p
