"""A parameter checksum that data-parallel replicas agree on to the bit, for the replica check.

Replicas of a data-parallel job hold the same parameters after every optimizer step, to the bit
(DDP, FSDP after its all-gather, model-parallel shards within their data-parallel group). Ingest's
``replica_divergence`` finding (docs/diagnosis.md) compares a value that should be the same on
every rank across ranks. A silent data corruption that flips a bit of one rank's parameters does not
show in the gradient norm after the all-reduce, because every rank gets the same reduced gradients.
It shows in this checksum from that step on::

    from kforge_record.replica import PARAM_CHECKSUM, param_checksum
    if step % 100 == 0:
        rec.end_step(step, loss=loss, **{PARAM_CHECKSUM: param_checksum(model.parameters())})

The checksum is the sum, over every element of every parameter, of its bits read as a signed integer
of the same width. The sum is taken modulo 2**52, so a float64 holds it exactly. Any one-bit flip
changes it. It is computed on the parameters' device, with no host synchronisation: the recorder
copies the 0-d tensor at its next flush, off the loop. The cost is one read of every parameter and
one integer reduction each, memory-bound: about a parameter-bytes / memory-bandwidth. A 7B bf16 model
is ~14 GB, which is a few ms on an H100. Record it every N steps, not every step.

Under tensor or pipeline parallelism, the replicas of a shard are the ranks of its data-parallel
group. Each rank records the checksum of its own shard under ``group_checksum_name(GROUP)``, with a
GROUP naming its model-parallel coordinates (``tp0-pp1``). Ingest compares each such name among the
ranks that record it.
"""

from __future__ import annotations

PARAM_CHECKSUM = "param_checksum"  # the scalar name ingest's replica check reads
_MOD = (1 << 52) - 1
_INT_OF_SIZE = {1: "int8", 2: "int16", 4: "int32", 8: "int64"}


def group_checksum_name(group: str) -> str:
    """The scalar name for the checksum of one data-parallel group's parameters under model parallelism
    (``param_checksum/tp0-pp1``): ingest compares it only among the ranks that record it, the group."""
    return f"{PARAM_CHECKSUM}/{group}"


def param_checksum(params):
    """A 0-d int64 tensor on the parameters' device (give it to ``end_step``/``log``); None without any."""
    import torch

    total = None
    for p in params:
        t = p.detach().reshape(-1)
        if t.numel() == 0:
            continue
        as_int = t.view(getattr(torch, _INT_OF_SIZE[t.element_size()])).to(torch.int64)
        s = torch.bitwise_and(as_int.sum(), _MOD)  # int64 sums wrap; the low 52 bits stay exact
        total = s if total is None else torch.bitwise_and(total + s.to(total.device), _MOD)
    return total
