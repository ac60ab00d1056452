"""Who waits for whom in a hung job, from its ranks' flight-recorder dumps (flight_recorder.py explains the rules).

``Job`` holds every rank's dump (fr_dumps.RankDump) with each process group's members resolved; ``wait_of`` is
what one rank waits for (its head: the oldest collective it has not seen complete); ``terminal`` is where the
waits end: the ranks with nothing pending that others wait for, the ranks stuck in a collective a peer
completed, and the ranks the dumps cannot tell apart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kforge_dash.ingest.fr_dumps import Op, RankDump

_P2P = re.compile(r"(send|recv)\s*(\d+)\s*(?:->|<-)\s*(\d+)")


@dataclass(frozen=True)
class Wait:
    rank: int
    op: Op
    on: frozenset  # the ranks (with a dump) it waits for
    unknown: frozenset  # members without a dump, which it may wait for
    completed_by: tuple[int, ...] = ()  # peers that completed its head: the rank itself is stuck


class Job:
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
        self._inferred: dict[str, tuple[int, ...]] = {}
        self._descs: dict[str, str] = {}

    def members(self, rank: int, group: str) -> tuple[int, ...]:
        view = self.dumps[rank].groups.get(group)
        if view is not None and view.members:
            return view.members
        if group not in self._inferred:  # once per group: asked by each rank waiting in it
            others = (d.groups[group].members for d in self.dumps.values() if group in d.groups and d.groups[group].members)
            descs = {d.groups[group].desc for d in self.dumps.values() if group in d.groups}
            self._inferred[group] = next(others, None) or (
                tuple(range(self.world)) if "default_pg" in descs or group == "0"  # gloo: no pg_config; the world group
                else tuple(sorted(self.mentions.get(group, ()))))  # gloo: the ranks whose dumps name the group
        return self._inferred[group] or (rank,)

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
                frozenset(b for b in dumped if not same_collective(self.heads[b], op)),
                frozenset(b for b in members if b not in self.dumps))
        return self._states[key]

    def desc(self, group: str) -> str:
        """The group's description ('' when no dump gives one; gloo names every new group 'undefined')."""
        if group not in self._descs:
            self._descs[group] = next((d.groups[group].desc for d in self.dumps.values() if group in d.groups
                                       and d.groups[group].desc not in ("", "undefined")), "")
        return self._descs[group]

    def issued(self, rank: int, group: str, seq: int) -> bool | None:
        d = self.dumps[rank]
        if (group, seq) in d.issued:  # an index: scanning each member's buffer made 512 ranks take 6.6 s (bench_hang_fr.py)
            return True
        view = d.groups.get(group)
        return None if view is None or view.enqueued is None else view.enqueued >= seq

    def completed(self, rank: int, group: str, seq: int) -> bool:
        view = self.dumps[rank].groups.get(group)
        return view is not None and view.completed is not None and view.completed >= seq


def _peer(job: Job, rank: int, op: Op) -> int | None:
    """The global rank a send/recv goes to or comes from (its profiling name holds group ranks)."""
    m = _P2P.search(op.name)
    members = job.members(rank, op.group)
    local = int(m.group(3)) if m else None
    return members[local] if local is not None and local < len(members) else None


def wait_of(job: Job, rank: int, head: Op) -> Wait:
    members = job.members(rank, head.group)
    if head.is_p2p:
        peer = _peer(job, rank, head)
        if peer is None or peer == rank:
            return Wait(rank, head, frozenset(), frozenset())
        if peer not in job.dumps:
            return Wait(rank, head, frozenset(), frozenset({peer}))
        other = job.heads[peer]  # both posted, each the other's head: they wait on each other
        posted = (other is not None and other.is_p2p and other.group == head.group and _pairs(head, other)
                  and _peer(job, peer, other) == rank)
        return Wait(rank, head, frozenset() if posted else frozenset({peer}), frozenset())
    missing, done, elsewhere, unknown = job.collective_state(members, head)  # shared by all who wait in it
    if missing - {rank}:
        return Wait(rank, head, missing if rank not in missing else missing - {rank}, unknown)
    if done:
        return Wait(rank, head, frozenset(), frozenset(), completed_by=tuple(sorted(done - {rank})))
    return Wait(rank, head, elsewhere if rank not in elsewhere else elsewhere - {rank}, unknown)


def same_collective(a: Op | None, b: Op) -> bool:
    return a is not None and not a.is_p2p and a.group == b.group and a.seq == b.seq


def _pairs(a: Op, b: Op) -> bool:
    """a send and the recv it meets (or the reverse)."""
    return {a.name[:4], b.name[:4]} == {"send", "recv"}


def _closed_cycles(waits: dict[int, Wait]) -> set[int]:
    """Ranks that wait on each other in a cycle that no wait leaves (Tarjan's strongly connected components,
    iterative: O(ranks + waits), where following the waits from each rank in turn was O(ranks x waits))."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    comp: dict[int, int] = {}
    stack: list[int] = []
    on_stack: set[int] = set()
    components: list[list[int]] = []
    for root in waits:
        if root in index:
            continue
        work = [(root, iter(waits[root].on))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(waits[nxt].on) if nxt in waits else iter(())))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp[m] = len(components)
                    members.append(m)
                    if m == node:
                        break
                components.append(members)
    closed = set()
    for c, members in enumerate(components):
        if len(members) > 1 and all(comp[b] == c for m in members if m in waits for b in waits[m].on):
            closed.update(members)
    return closed


@dataclass(frozen=True)
class Ends:
    """Where the waits end."""

    idle: frozenset  # ranks others wait for, with nothing pending: stuck outside communication
    stuck: frozenset  # ranks stuck in a collective a peer completed: their own GPU or communicator stopped
    stalled: frozenset  # ranks whose collective every known member issued and none completed (or a send/recv both posted)
    cycles: frozenset  # ranks waiting on each other in a cycle that no wait leaves

    @property
    def undecided(self) -> frozenset:
        return self.stalled | self.cycles


def terminal(waits: dict[int, Wait], dumps: dict[int, RankDump]) -> Ends:
    awaited: set[int] = set()
    for on in {id(w.on): w.on for w in waits.values()}.values():  # the waits share their sets: each added once
        awaited |= on
    return Ends(idle=frozenset(r for r in dumps if r not in waits and r in awaited),
                stuck=frozenset(r for r, w in waits.items() if w.completed_by),
                stalled=frozenset(r for r, w in waits.items() if not w.completed_by and not w.on and not w.unknown),
                cycles=frozenset(_closed_cycles(waits)))
