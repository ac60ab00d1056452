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

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from kforge_dash.ingest.fr_dumps import Op, RankDump, normalize, read_fr_dumps

__all__ = ["Collective", "FrVerdict", "analyze_fr", "read_fr_dumps", "ranks_text"]

_P2P = re.compile(r"(send|recv)\s*(\d+)\s*(?:->|<-)\s*(\d+)")
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


@dataclass(frozen=True)
class _Wait:
    rank: int
    op: Op
    on: frozenset  # the ranks (with a dump) it waits for
    unknown: frozenset  # members without a dump, which it may wait for
    completed_by: tuple[int, ...] = ()  # peers that completed its head: the rank itself is stuck


def ranks_text(ranks) -> str:
    """'0-3, 8, 10': ranks in runs."""
    rs = sorted(set(ranks))
    runs, i = [], 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        runs.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}" if j > i + 1 else f"{rs[i]}, {rs[j]}")
        i = j + 1
    return ", ".join(runs)


def _plural(ranks) -> str:
    return ("rank " if len(set(ranks)) == 1 else "ranks ") + ranks_text(ranks)


class _Job:
    """All ranks' dumps, with group membership resolved."""

    def __init__(self, dumps: dict[int, RankDump], world_size: int | None):
        self.dumps = dumps
        sizes = [len(v.members) for d in dumps.values() for v in d.groups.values() if v.members]
        self.world = world_size or max([*sizes, max(dumps, default=-1) + 1])
        mentions: dict[str, set[int]] = {}
        for r, d in dumps.items():
            for g in d.groups:
                mentions.setdefault(g, set()).add(r)
        self.mentions = mentions
        self.heads = {r: d.head for r, d in dumps.items()}
        self._states: dict[tuple, tuple] = {}

    def members(self, rank: int, group: str) -> tuple[int, ...]:
        view = self.dumps[rank].groups.get(group)
        if view is not None and view.members:
            return view.members
        others = [d.groups[group].members for d in self.dumps.values() if group in d.groups and d.groups[group].members]
        if others:
            return others[0]
        if view is not None and (view.desc == "default_pg" or group == "0"):  # gloo: no pg_config; the world group
            return tuple(range(self.world))
        return tuple(sorted(self.mentions.get(group, {rank})))

    def collective_state(self, members: tuple[int, ...], op: Op) -> tuple[frozenset, frozenset, frozenset, frozenset]:
        """Of a collective's members: (never issued it, completed it, waiting elsewhere first, without a dump).

        Once per collective, not per rank that waits in it: 4,096 ranks in one all_reduce checked each other
        member in turn (N^2): 27 s -> 14 s at 4,096 ranks of 200 entries (bench_hang_fr.py)."""
        key = (members, op.group, op.seq)
        if key not in self._states:
            dumped = [b for b in members if b in self.dumps]
            self._states[key] = (
                frozenset(b for b in dumped if self.issued(b, op.group, op.seq) is False),
                frozenset(b for b in dumped if self.completed(b, op.group, op.seq)),
                frozenset(b for b in dumped if not _same(self.heads[b], op)),
                frozenset(b for b in members if b not in self.dumps))
        return self._states[key]

    def desc(self, group: str) -> str:
        return next((d.groups[group].desc for d in self.dumps.values() if group in d.groups and d.groups[group].desc), "")

    def issued(self, rank: int, group: str, seq: int) -> bool | None:
        d = self.dumps[rank]
        if (group, seq) in d.issued:  # an index: scanning each member's buffer made 512 ranks take 6.6 s (bench_hang_fr.py)
            return True
        view = d.groups.get(group)
        return None if view is None or view.enqueued is None else view.enqueued >= seq

    def completed(self, rank: int, group: str, seq: int) -> bool:
        view = self.dumps[rank].groups.get(group)
        return view is not None and view.completed is not None and view.completed >= seq


def _peer(job: _Job, rank: int, op: Op) -> int | None:
    """The global rank a send/recv goes to or comes from (its profiling name holds group ranks)."""
    m = _P2P.search(op.name)
    members = job.members(rank, op.group)
    local = int(m.group(3)) if m else None
    return members[local] if local is not None and local < len(members) else None


def _wait(job: _Job, rank: int, head: Op) -> _Wait:
    members = job.members(rank, head.group)
    if head.is_p2p:
        peer = _peer(job, rank, head)
        if peer is None or peer == rank:
            return _Wait(rank, head, frozenset(), frozenset())
        if peer not in job.dumps:
            return _Wait(rank, head, frozenset(), frozenset({peer}))
        other = job.heads[peer]  # both posted, each the other's head: they wait on each other
        posted = (other is not None and other.is_p2p and other.group == head.group and _pairs(head, other)
                  and _peer(job, peer, other) == rank)
        return _Wait(rank, head, frozenset() if posted else frozenset({peer}), frozenset())
    missing, done, elsewhere, unknown = job.collective_state(members, head)
    if missing - {rank}:
        return _Wait(rank, head, missing - {rank}, unknown)
    if done:
        return _Wait(rank, head, frozenset(), frozenset(), completed_by=tuple(sorted(done - {rank})))
    return _Wait(rank, head, elsewhere - {rank}, unknown)


def _same(a: Op | None, b: Op) -> bool:
    return a is not None and not a.is_p2p and a.group == b.group and a.seq == b.seq


def _pairs(a: Op, b: Op) -> bool:
    """a send and the recv it meets (or the reverse)."""
    return {a.name[:4], b.name[:4]} == {"send", "recv"}


def _reach(waits: dict[int, _Wait], start: int) -> set[int]:
    seen, todo = set(), [start]
    while todo:
        r = todo.pop()
        if r in seen:
            continue
        seen.add(r)
        if r in waits:
            todo.extend(waits[r].on)
    return seen


def _terminal(waits: dict[int, _Wait], dumps: dict[int, RankDump]) -> tuple[set[int], set[int], set[int]]:
    """(idle causes, stuck causes, undecided): where the waits end."""
    idle, stuck, undecided = set(), set(), set()
    reach = {r: _reach(waits, r) for r in dumps}
    for r in dumps:
        w = waits.get(r)
        if w is None:
            if any(r in x.on for x in waits.values()):
                idle.add(r)
        elif w.completed_by:
            stuck.add(r)
        elif not w.on and not w.unknown:
            undecided.add(r)  # one collective all issued and none completed; or a send/recv both posted
        elif w.on and all(r in reach[b] for b in reach[r] if b != r) and any(b != r for b in reach[r]):
            undecided.add(r)  # a cycle of waits with no way out
    return idle, stuck, undecided


def _desync(dumps: dict[int, RankDump], job: _Job) -> list[dict]:
    seen: dict[tuple[str, int], dict[int, tuple]] = {}
    for r, d in dumps.items():
        for o in d.ops:
            if not o.is_p2p:
                seen.setdefault((o.group, o.seq), {}).setdefault(r, ())
                sizes = (repr(o.sizes), repr(o.out_sizes)) if o.name in _SAME_SIZES else ()
                seen[(o.group, o.seq)][r] += ((o.name, sizes, repr(o.dtypes), repr(o.out_dtypes)),)
    out = []
    for (group, seq), by_rank in sorted(seen.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        variants: dict[tuple, list[int]] = {}
        for r, sig in by_rank.items():
            variants.setdefault(tuple(sorted(sig)), []).append(r)
        if len(variants) > 1:
            ops = {r: next(o for o in dumps[r].ops if o.group == group and o.seq == seq and not o.is_p2p) for r in by_rank}
            out.append({"group": group, "desc": job.desc(group), "seq": seq, "variants": [
                {"ranks": sorted(rs), "op": ops[rs[0]].name, "sizes": ops[rs[0]].sizes, "dtypes": ops[rs[0]].dtypes}
                for rs in sorted(variants.values(), key=lambda rs: (-len(rs), rs))]})
    return out


def _collective(job: _Job, waits: dict[int, _Wait], causes: set[int]) -> Collective | None:
    """The collective most ranks wait in for the causes (a collective before a send/recv)."""
    direct = [w for w in waits.values() if w.on & causes or (w.rank in causes and w.completed_by)]
    pool = [w for w in direct if not w.op.is_p2p] or direct or list(waits.values())
    if not pool:
        return None
    key = Counter((w.op.group, w.op.is_p2p, w.op.seq if not w.op.is_p2p else 0, w.op.name) for w in pool).most_common(1)[0][0]
    chosen = [w for w in pool if (w.op.group, w.op.is_p2p, w.op.seq if not w.op.is_p2p else 0, w.op.name) == key]
    op = chosen[0].op
    heads = [w.rank for w in waits.values() if _same(w.op, op)] if not op.is_p2p else [w.rank for w in chosen]
    return Collective(group=op.group, seq=op.p2p_seq if op.is_p2p else op.seq, op=op.name, sizes=op.sizes,
                      dtypes=op.dtypes, desc=job.desc(op.group), group_ranks=job.members(chosen[0].rank, op.group),
                      waiting=tuple(sorted(heads)), p2p=op.is_p2p)


def _op_text(job: _Job, rank: int, op: Op) -> str:
    members = job.members(rank, op.group)
    group = f"{job.desc(op.group) or 'group'} {op.group}" + (f" (ranks {ranks_text(members)})" if members else "")
    return f"{op.name} #{op.p2p_seq if op.is_p2p else op.seq} of {group}"


def collective_text(c: Collective) -> str:
    group = f"{c.desc or 'group'} {c.group}" + (f" (ranks {ranks_text(c.group_ranks)})" if c.group_ranks else "")
    return f"{c.op} #{c.seq} of {group}"


def _reason(job: _Job, waits, idle, stuck, undecided, no_dump: tuple[int, ...]) -> str:
    parts = []
    if idle:
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
    for r in sorted(stuck):
        w = waits[r]
        parts.append(f"rank {r} never saw {_op_text(job, r, w.op)} complete, which {_plural(w.completed_by)} "
                     f"completed (a collective completes on no rank unless every member ran it): rank {r}'s own GPU "
                     "or communicator stopped (e.g. a GPU error)")
    if undecided and not (idle or stuck):
        parts.append(f"{_plural(undecided)} wait on each other (every member issued the collective and none "
                     "completed it, or a send and its recv are both posted): the dumps cannot tell which rank stalled")
    awaited = sorted({b for w in waits.values() for b in w.unknown})
    if awaited:
        parts.append(f"no dump from {_plural(awaited)}, which the others may wait for: no evidence from "
                     f"{'it' if len(awaited) == 1 else 'them'}")
    elif no_dump and not parts:
        parts.append(f"no dump from {_plural(no_dump)}")
    if not parts:
        return "No rank waits in a collective: every entry in the dumps completed (no hang in these dumps)."
    text = "; ".join(parts)
    return text[0].upper() + text[1:] + "."


def analyze_fr(dumps: Mapping[int, dict], *, world_size: int | None = None) -> FrVerdict:
    """The ranks a hung job waits for, and why, from its ranks' flight-recorder dumps (rank -> dump)."""
    warnings: list[str] = []
    ranks: dict[int, RankDump] = {}
    for r, raw in sorted(dumps.items()):
        try:
            ranks[r], w = normalize(r, raw)
        except (AttributeError, TypeError, ValueError, KeyError) as e:
            warnings.append(f"rank {r}: its dump could not be used ({type(e).__name__}: {e})")
            continue
        warnings.extend(w)
    job = _Job(ranks, world_size)
    no_dump = tuple(r for r in range(job.world) if r not in ranks)
    waits = {r: _wait(job, r, d.head) for r, d in ranks.items() if d.head is not None}
    idle, stuck, undecided = _terminal(waits, ranks)
    causes = idle | stuck
    if not causes and not undecided:  # only ranks without a dump are waited for: name them when nothing else can be
        awaited = {b for w in waits.values() for b in w.unknown}
        if awaited and all(not w.on for w in waits.values()):
            causes = awaited
    coll = _collective(job, waits, causes) if waits else None
    named = tuple(sorted(causes))
    return FrVerdict(ranks=named, collective=coll, desync=_desync(ranks, job),
                     reason=_reason(job, waits, idle, stuck, undecided, no_dump), ranks_without_dump=no_dump,
                     waiting=tuple(sorted(r for r in waits if r not in causes)), idle=tuple(sorted(idle)),
                     stuck=tuple(sorted(stuck)), undecided=tuple(sorted(undecided - causes)), world_size=job.world,
                     warnings=tuple(warnings))
