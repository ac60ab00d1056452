"""Which ranks a hung job waits for, from PyTorch flight-recorder dumps alone (docs/hangs.md).

Each rank's *head* is the oldest collective in its buffer that has not completed: what it waits in.
A rank waits for another when:

- its head is collective #s of group G and the other, a member of G, never issued #s (its dump says
  it enqueued fewer): it waits for a rank that is not there;
- its head is a send or recv: it waits for its peer;
- its head was issued by every member and none completed it: it waits for the members whose own
  head is elsewhere (they are held up first).

Following these waits from every waiting rank ends at the *cause*: a rank with nothing pending
(every collective it issued completed: stuck outside communication, e.g. a held GIL, a data loader,
an endless loop) or a rank stuck in a collective that its peers completed (a collective cannot
complete on one rank without the others: its own GPU or communicator stopped, e.g. a GPU error).
Ranks that wait in a cycle, or that all issued one collective that none completed, cannot be told
apart from the dumps: then none of them is named, and the reason says so.

``analyze_fr`` takes raw dumps (``read_fr_dumps`` reads them: pickle or JSON, format 2.x, NCCL or
gloo) and returns a ``FrVerdict``. kforge-hang (cli/hang.py) prints it; ingest's ``hang`` finding
uses it. Its own code: PyTorch's fr_trace and NVIDIA's nvidia-resiliency-ext attribution were read,
not copied.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from kforge_dash.ingest.fr_dumps import Op, RankDump, fr_dump_files, normalize, printable, read_fr_dumps
from kforge_dash.ingest.fr_waits import Ends, Job, Wait, same_collective, terminal, wait_of
from kforge_dash.text import rank_list, rank_runs

__all__ = ["Collective", "FrVerdict", "analyze_fr", "fr_dump_files", "read_fr_dumps"]

# Ops whose every rank passes tensors of one shape; all_to_all and the *_v ops differ by design.
_SAME_SIZES = {"all_reduce", "allreduce", "broadcast", "reduce", "_all_gather_base", "all_gather", "allgather",
               "_reduce_scatter_base", "reduce_scatter", "reduce_scatter_tensor", "all_gather_into_tensor",
               "_allgather_base", "allreduce_coalesced", "barrier"}


@dataclass(frozen=True)
class Collective:
    """The collective the others wait in."""

    group: str  # the process group's name (pg_config's key)
    seq: int  # its collective_seq_id (a send/recv: its p2p_seq_id)
    op: str  # profiling name without the backend: all_reduce, _all_gather_base, send 0->3
    sizes: list  # input sizes
    dtypes: list = field(default_factory=list)
    desc: str = ""  # the group's description: TENSOR_MODEL_PARALLEL_GROUP, default_pg
    group_ranks: tuple[int, ...] = ()  # its members (global ranks); () when no dump says
    waiting: tuple[int, ...] = ()  # the ranks whose head it is
    p2p: bool = False


@dataclass(frozen=True)
class FrVerdict:
    ranks: tuple[int, ...]  # the ranks named as the cause (the outliers the others wait for)
    collective: Collective | None  # null when the dumps hold none
    desync: list[dict]  # ranks that issued different collectives at one seq (op/sizes/dtypes differ)
    reason: str  # one sentence: why these ranks, or why the dumps cannot tell
    ranks_without_dump: tuple[int, ...]
    waiting: tuple[int, ...] = ()  # the ranks that wait in a collective (the majority)
    idle: tuple[int, ...] = ()  # named ranks with nothing pending: stuck outside communication
    stuck: tuple[int, ...] = ()  # named ranks stuck in a collective their peers completed
    undecided: tuple[int, ...] = ()  # ranks stalled together (a cycle, or one collective none completed)
    world_size: int | None = None
    warnings: tuple[str, ...] = ()  # parts of the dumps that could not be used
    # who waits for whom: ranks with one head and one set of ranks waited for, each as {"ranks", "group", "desc",
    # "seq", "op", "p2p", "waits_for", "completed_by"} (completed_by: peers that completed it: the ranks are stuck)
    wait_groups: list[dict] = field(default_factory=list)


def _plural(ranks) -> str:
    return rank_list(sorted(set(ranks))) or ""


def _desync(dumps: dict[int, RankDump], job: Job) -> list[dict]:
    """Ranks of one group that issued different collectives at one sequence number. A group is its name and its
    members: groups split from one (torch's split_group) share a name, and each counts its own sequence."""
    seen: dict[tuple, dict[int, tuple]] = {}
    for r, d in dumps.items():
        for o in d.ops:
            if not o.is_p2p:
                key = (o.group, job.members(r, o.group), o.seq)
                sizes = (repr(o.sizes), repr(o.out_sizes)) if o.name in _SAME_SIZES else ()
                by_rank = seen.setdefault(key, {})
                by_rank[r] = by_rank.get(r, ()) + ((o.name, sizes, repr(o.dtypes), repr(o.out_dtypes)),)
    out = []
    for (group, _, seq), by_rank in sorted(seen.items(), key=lambda kv: (kv[0][0], kv[0][2], kv[0][1])):
        variants: dict[tuple, list[int]] = {}
        for r, sig in by_rank.items():
            variants.setdefault(tuple(sorted(sig)), []).append(r)
        if len(variants) > 1:
            ops = {r: next(o for o in dumps[r].ops if o.group == group and o.seq == seq and not o.is_p2p) for r in by_rank}
            out.append({"group": group, "desc": job.desc(group), "seq": seq, "variants": [
                {"ranks": sorted(rs), "op": ops[rs[0]].name, "sizes": ops[rs[0]].sizes, "dtypes": ops[rs[0]].dtypes}
                for rs in sorted(variants.values(), key=lambda rs: (-len(rs), rs))]})
    return out


def _collective(job: Job, waits: dict[int, Wait], causes: set[int]) -> Collective | None:
    """The collective most ranks wait in for the causes (a collective before a send/recv)."""
    direct = [w for w in waits.values() if w.on & causes or (w.rank in causes and w.completed_by)]
    pool = [w for w in direct if not w.op.is_p2p] or direct or list(waits.values())
    if not pool:
        return None
    key = Counter((w.op.group, w.op.is_p2p, w.op.seq if not w.op.is_p2p else 0, w.op.name) for w in pool).most_common(1)[0][0]
    chosen = [w for w in pool if (w.op.group, w.op.is_p2p, w.op.seq if not w.op.is_p2p else 0, w.op.name) == key]
    op = chosen[0].op
    members = job.members(chosen[0].rank, op.group)
    heads = ([w.rank for w in waits.values() if same_collective(w.op, op) and w.rank in members] if not op.is_p2p
             else [w.rank for w in chosen])
    return Collective(group=op.group, seq=op.p2p_seq if op.is_p2p else op.seq, op=op.name, sizes=op.sizes,
                      dtypes=op.dtypes, desc=job.desc(op.group), group_ranks=members, waiting=tuple(sorted(heads)),
                      p2p=op.is_p2p)


def _wait_groups(job: Job, waits: dict[int, Wait]) -> list[dict]:
    groups: dict[tuple, list[int]] = {}
    for r, w in sorted(waits.items()):
        key = (w.op.group, w.op.is_p2p, w.op.p2p_seq if w.op.is_p2p else w.op.seq, w.op.name, w.on, w.completed_by)
        groups.setdefault(key, []).append(r)
    out = [{"ranks": rs, "group": g, "desc": job.desc(g), "seq": seq, "op": name, "p2p": p2p, "waits_for": sorted(on),
            "completed_by": list(done)} for (g, p2p, seq, name, on, done), rs in groups.items()]
    return sorted(out, key=lambda d: (d["p2p"], -len(d["ranks"]), d["ranks"]))


def _op_text(job: Job, rank: int, op: Op) -> str:
    members = job.members(rank, op.group)
    group = f"{job.desc(op.group) or 'group'} {op.group}" + (f" (ranks {rank_runs(members)})" if len(members) > 1 else "")
    return f"{op.name} #{op.p2p_seq if op.is_p2p else op.seq} of {group}"


def collective_text(c: Collective) -> str:
    group = f"{c.desc or 'group'} {c.group}" + (f" (ranks {rank_runs(c.group_ranks)})" if len(c.group_ranks) > 1 else "")
    return f"{c.op} #{c.seq} of {group}"


def _reason(job: Job, waits: dict[int, Wait], ends: Ends, no_dump: tuple[int, ...]) -> str:
    parts = _idle_reason(job, waits, ends.idle) if ends.idle else []
    for r in sorted(ends.stuck):
        w = waits[r]
        parts.append(f"rank {r} never saw {_op_text(job, r, w.op)} complete, which {_plural(w.completed_by)} completed")
    if ends.stuck:
        one = len(ends.stuck) == 1
        parts[-1] += (": a collective completes on no rank unless every member ran it, so "
                      f"{'its' if one else 'their'} own GPU{'' if one else 's'} or communicator{'' if one else 's'} "
                      "stopped (e.g. a GPU error)")
    if ends.cycles:
        parts.append(f"{_plural(ends.cycles)} wait on each other in a cycle (each waits in a collective or send/recv "
                     "that another never issued: collectives called in a different order on different ranks)")
    stalled: dict[tuple, set[int]] = {}
    for r in sorted(ends.stalled):
        op = waits[r].op
        stalled.setdefault((op.group, op.seq, op.name, op.is_p2p), set()).add(r)
    for rs in stalled.values():
        w = waits[min(rs)]
        text = _op_text(job, w.rank, w.op)
        if w.op.is_p2p:
            parts.append(f"{_plural(rs)} wait in {text}, posted on both sides and not completed")
        elif len(job.members(w.rank, w.op.group)) <= 1:
            parts.append(f"{_plural(rs)} {'waits' if len(rs) == 1 else 'wait'} in {text}, whose other members no dump "
                         "names (a gloo dump holds no group membership, and a group a rank never used is not in it)")
        else:
            parts.append(f"{_plural(rs)} issued {text} and none saw it complete: the dumps cannot tell which rank "
                         "stalled (a network or communicator fault, or a GPU hung inside it)")
    awaited = sorted({b for w in waits.values() for b in w.unknown})
    if awaited:
        parts.append(f"no dump from {_plural(awaited)}, which the others may wait for: no evidence from "
                     f"{'it' if len(awaited) == 1 else 'them'}")
    if not waits:
        parts.append("no rank with a dump waits in a collective: every entry in the dumps completed (no hang in them)")
    if no_dump and not awaited:
        parts.append(f"no dump from {_plural(no_dump)}")
    text = "; ".join(parts)
    return text[0].upper() + text[1:] + "."


def _idle_reason(job: Job, waits: dict[int, Wait], idle: frozenset) -> list[str]:
    parts = []
    awaited: dict[tuple, tuple[set[int], set[int], str]] = {}  # what the others wait in -> (idle ranks, waiters)
    collective_waits = {r for w in waits.values() if not w.op.is_p2p for r in w.on & idle}
    for w in waits.values():
        for r in w.on & idle:
            if w.op.is_p2p and r in collective_waits:
                continue  # a rank awaited in a collective is named by that; the sends to it add nothing
            key = (w.op.group, w.op.seq, w.op.name) if not w.op.is_p2p else (w.op.name, w.rank)
            if key not in awaited:
                awaited[key] = (set(), set(), _op_text(job, w.rank, w.op) if not w.op.is_p2p
                                else f"the peer of {w.op.name} of rank {w.rank}")
            awaited[key][0].add(r)
            awaited[key][1].add(w.rank)
    by_ranks: dict[tuple, list[str]] = {}
    for rs, by, text in awaited.values():
        by_ranks.setdefault(tuple(sorted(rs)), []).append(f"{text}, which {_plural(by)} wait in")
    for rs, texts in by_ranks.items():
        more = f" (and {len(texts) - 1} more)" if len(texts) > 1 else ""
        parts.append(f"{_plural(rs)} never issued {texts[0]}{more}")
    one = len(idle) == 1
    parts.append(f"{_plural(idle)} {'has' if one else 'have'} nothing pending (every collective "
                 f"{'it' if one else 'they'} issued completed): stuck outside communication, on the CPU side "
                 "(a held GIL, data loading, a loop)")
    return parts


def analyze_fr(dumps: Mapping[int, dict], *, world_size: int | None = None) -> FrVerdict:
    """The ranks a hung job waits for, and why, from its ranks' flight-recorder dumps (rank -> dump)."""
    warnings: list[str] = []
    ranks: dict[int, RankDump] = {}
    for key, raw in dumps.items():
        try:
            r = int(key)
            ranks[r], w = normalize(r, raw)
        except (AttributeError, TypeError, ValueError, KeyError) as e:
            warnings.append(f"rank {printable(key)}: its dump could not be used ({type(e).__name__}: {e})")
            continue
        warnings.extend(w)
    ranks = dict(sorted(ranks.items()))
    job = Job(ranks, world_size)
    no_dump = tuple(r for r in range(job.world) if r not in ranks)
    waits = {r: wait_of(job, r, d.head) for r, d in ranks.items() if d.head is not None}
    ends = terminal(waits, ranks)
    # A rank without a dump is never named: it may have died (the likely cause) or its dump was not collected.
    causes = set(ends.idle | ends.stuck)
    coll = _collective(job, waits, causes) if waits else None
    return FrVerdict(ranks=tuple(sorted(causes)), collective=coll, desync=_desync(ranks, job),
                     reason=_reason(job, waits, ends, no_dump), ranks_without_dump=no_dump,
                     waiting=tuple(sorted(r for r in waits if r not in causes)), idle=tuple(sorted(ends.idle)),
                     stuck=tuple(sorted(ends.stuck)), undecided=tuple(sorted(ends.undecided)), world_size=job.world,
                     warnings=tuple(warnings), wait_groups=_wait_groups(job, waits))
