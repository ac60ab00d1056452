"""A hung launch explained (``hang``), and ranks that issued different collectives (``desync``).

Evidence comes from the recorder's hang watch (kforge_record/hang.py, read by hang_evidence.py):
a rank that ended no step for ``hang_after_s`` wrote its last step, phase and stacks. A launch
whose ranks left evidence of a stall that never ended (no later step, no clean close) is hung.
The ranks the others wait for (the outliers, not the majority) are, in this order of trust:

1. those the flight-recorder dumps name (kforge_dash/ingest/flight_recorder.py), when FR was on;
2. the ranks behind: the lowest last ended step, when ranks differ in it;
3. the ranks in a phase that is not the majority's, then at a user frame that is not the majority's.

Ranks alike everywhere name no rank (all stalled together: a network or communicator fault) and
the message says so. A launch killed without stall evidence is no hang (unrecorded_steps says
what it lost). Ranks with no evidence are listed ("no evidence from ranks …"): a node that died
leaves none.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from kforge_dash.findings.finding import Finding, RunFacts
from kforge_dash.findings.hang_evidence import RankStall, attempt_stall, fr_dump_paths
from kforge_dash.text import counted, duration, rank_list, rank_runs

CLEAN_ENDS = ("close", "exit")  # end.json reasons of a loop that went on to its end: its last stall was no hang


@dataclass(frozen=True, kw_only=True)
class HangFinding(Finding):
    """A Finding with the hang's own keys (docs/CONTRACT.md, findings)."""

    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {**super().to_dict(), **self.extra}


def hang_findings(facts: RunFacts, warnings: list[str] | None = None) -> list[Finding]:
    warnings = [] if warnings is None else warnings
    out: list[Finding] = []
    for launch in facts.launches:
        stalls, silent = {}, []
        for a in sorted(launch.attempts, key=lambda a: a.rank):
            if isinstance(a.end, dict) and a.end.get("reason") in CLEAN_ENDS:
                continue
            s = attempt_stall(a, warnings)
            if s is None:
                silent.append(a)
            else:
                stalls[a.rank] = s
        if not stalls:
            continue
        verdict = _fr_verdict(launch, warnings)
        out.append(_hang(facts, launch, stalls, [a.rank for a in silent], verdict))
        if verdict is not None and verdict.desync:
            out.append(_desync(facts, launch, stalls, verdict))
    return out


def _fr_verdict(launch, warnings: list[str]):
    paths = [p for a in launch.attempts for p in fr_dump_paths(a)]
    if not paths:
        return None
    from kforge_dash.ingest.flight_recorder import analyze_fr, read_fr_dumps

    dumps, warn = read_fr_dumps(paths)
    warnings.extend(f"hang: {w}" for w in warn)
    if not dumps:
        return None
    sizes = [a.world_size for a in launch.attempts if isinstance(a.world_size, int)]
    verdict = analyze_fr(dumps, world_size=max(sizes) if sizes else None)
    warnings.extend(f"hang: flight recorder: {w}" for w in verdict.warnings)
    return verdict


def outliers(stalls: dict[int, RankStall]) -> tuple[tuple[int, ...], str]:
    """(the ranks the others wait for, by what they differ: "step", "phase", "frame" or "" when alike)."""
    ranks = sorted(stalls)
    steps = {r: stalls[r].last_step if stalls[r].last_step is not None else -1 for r in ranks}
    if len(set(steps.values())) > 1:
        low = min(steps.values())
        return tuple(r for r in ranks if steps[r] == low), "step"
    for key in ("phase", "frame"):
        counts = Counter(getattr(stalls[r], key) for r in ranks)
        if len(counts) > 1:
            (top, n), (_, n2) = counts.most_common(2)
            if n > n2:
                return tuple(r for r in ranks if getattr(stalls[r], key) != top), key
    return (), ""


def _groups(stalls: dict[int, RankStall], key) -> list[dict]:
    by: dict = {}
    for r, s in sorted(stalls.items()):
        by.setdefault(key(s), []).append(r)
    return sorted(({"ranks": rs, "key": k} for k, rs in by.items()), key=lambda g: (-len(g["ranks"]), g["ranks"]))


def _named(launch, stalls: dict[int, RankStall], verdict) -> tuple[tuple[int, ...], str, tuple[int, ...]]:
    """(ranks, by, those of them without a dump). The flight recorder's ranks, and with them the ranks
    it has no dump from that their own evidence sets apart (a loop holding the GIL writes no dump):
    the dumps never name a rank they do not hold, the rank's step, phase and line may."""
    named = tuple(r for r in (verdict.ranks if verdict is not None else ()) if r in launch.ranks)
    if not named:
        ranks, by = outliers(stalls)
        return ranks, by, ()
    own = tuple(r for r in outliers(stalls)[0] if r in verdict.ranks_without_dump and r not in named)
    return tuple(sorted(named + own)), "fr", own


def _hang(facts: RunFacts, launch, stalls: dict[int, RankStall], silent: list[int], verdict) -> Finding:
    ranks, by, own = _named(launch, stalls, verdict)
    behind = [stalls[r] for r in ranks if r in stalls] or list(stalls.values())  # alike: the phase they all stalled in
    last = min((s.last_step for s in behind if s.last_step is not None), default=None)
    phases = {s.phase for s in behind}
    phase = phases.pop() if len(phases) == 1 else None
    others = [s for r, s in stalls.items() if r not in ranks]
    waited = max((_waited(launch, s) for s in (others or stalls.values())), default=None)
    stacks = [{"ranks": g["ranks"], "frame": g["key"]} for g in _groups(stalls, lambda s: s.frame)]
    states = [{"ranks": g["ranks"], "last_step": g["key"][0], "phase": g["key"][1],
               "role": "outlier" if g["key"][2] else "majority" if ranks else "stalled"}
              for g in _groups(stalls, lambda s: (s.last_step, s.phase, s.rank in ranks))]
    coll = verdict.collective if verdict is not None else None
    collective = None if coll is None else {"group": coll.group, "seq": coll.seq, "op": coll.op, "sizes": coll.sizes,
                                            "desc": coll.desc, "waiting": list(coll.waiting)}
    extra = {"waited_s": None if waited is None else round(waited, 3), "stacks": stacks, "collective": collective,
             "states": states, "no_evidence": sorted(silent), "by": by or None,
             "fr_reason": verdict.reason if verdict is not None else None,
             "gil_held": sorted(r for r, s in stalls.items() if s.source == "faulthandler")}
    hosts = facts.hosts_of(ranks, {launch.index}) if ranks else ()
    return HangFinding(kind="hang", severity="error", first_step=None if last is None else last + 1,
                       last_step=None if last is None else last + 1, phase=phase, ranks=ranks, hosts=hosts,
                       score=waited, message=_message(launch, stalls, ranks, (by, own), phase, last, waited, silent, collective),
                       extra=extra)


def _waited(launch, s: RankStall) -> float:
    """How long the rank had waited when last seen: to its end.json (a SIGTERM), else to its evidence."""
    end = next((a.end for a in launch.attempts if a.rank == s.rank and isinstance(a.end, dict)), None)
    until = end.get("end_time") if end and isinstance(end.get("end_time"), (int, float)) else s.written_at
    return max(0.0, (until or 0.0) - (s.last_time or until or 0.0))


def _plural(ranks) -> str:
    return rank_list(ranks) or ""


def _wheres(stalls, ranks) -> str:
    """", in phase data at f.py:3 in g" when the ranks are alike, else each group: "; rank 1 in phase …; rank 2 …"."""
    by: dict[str, list[int]] = {}
    for r in ranks:
        if r in stalls:
            by.setdefault(_where(stalls[r]), []).append(r)
    if len(by) <= 1:
        return "".join(f", {w}" for w in by)
    return ": " + "; ".join(f"{_plural(rs)} {w}" for w, rs in by.items())


def _where(s: RankStall) -> str:
    bits = [f"in phase {s.phase}" if s.phase else "in no phase" if s.source == "recorder" else "holding the GIL"]
    if s.frame:
        bits.append(f"at {s.frame}")
    return " ".join(bits)


def _message(launch, stalls, ranks, by_own, phase, last, waited, silent, collective) -> str:
    by, own = by_own
    after = "before its first step" if last is None else f"after step {last}"
    who = rank_list(ranks) or ""
    hosts = sorted({stalls[r].host for r in ranks if r in stalls and stalls[r].host})
    text = f"Launch {launch.index} hung {after}: "
    if ranks:
        why = {"fr": "the flight recorder names", "step": "behind the others:", "phase": "in another phase:",
               "frame": "at another line:"}[by]
        text += f"{why} {who}" + (f" on {', '.join(hosts)}" if hosts else "") + _wheres(stalls, ranks)
        if own:
            text += f" ({_plural(own)} left no dump: named by {'its' if len(own) == 1 else 'their'} own evidence)"
        others = [s for r, s in stalls.items() if r not in ranks]
        if others:
            common = Counter(_where(s) for s in others).most_common(1)[0][0]
            text += f"; {counted(len(others), 'other rank')} waited for {'it' if len(ranks) == 1 else 'them'}"
            text += f" {common}" + (f" for at least {duration(waited)}" if waited is not None else "")
    else:
        s = next(iter(stalls.values()))
        text += (f"rank {s.rank} stalled, {_where(s)}" if len(stalls) == 1 else
                 f"all {len(stalls)} ranks with evidence stalled alike, {_where(s)} (no rank stands out: a network or "
                 "communicator fault, or every rank stuck in one call)")
        text += f", for at least {duration(waited)}" if waited else ""
    if collective:
        text += f"; they wait in {collective['op']} #{collective['seq']} of group {collective['group']}"
    if silent:
        text += (f"; no evidence from {rank_list(silent)} (a rank that died, "
                 "exited or whose node failed leaves none; the others may wait for it)")
    return text + "."


def _desync(facts: RunFacts, launch, stalls, verdict) -> Finding:
    d = verdict.desync[0]
    variants = d["variants"]
    minority = tuple(sorted(r for v in variants[1:] for r in v["ranks"]))
    desc = "; ".join(f"{rank_runs(v['ranks'])}: {v['op']} sizes {v['sizes']} {v['dtypes']}" for v in variants)
    more = f" ({len(verdict.desync) - 1} more such sequence numbers)" if len(verdict.desync) > 1 else ""
    last = min((s.last_step for s in stalls.values() if s.last_step is not None), default=None)
    return HangFinding(kind="desync", severity="error", first_step=None if last is None else last + 1,
                       last_step=None if last is None else last + 1, ranks=minority,
                       hosts=facts.hosts_of(minority, {launch.index}), score=float(len(verdict.desync)),
                       message=(f"Launch {launch.index}: ranks issued different collectives at sequence number {d['seq']} "
                                f"of group {d['group']} ({desc}){more}: a code path that differs between ranks."),
                       extra={"desync": verdict.desync[:20]})
