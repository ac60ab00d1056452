"""A hang finding (summary.json, kind ``hang``; findings/hang.py) as plain text lines, and
the per-rank strip the run page draws: one way to each, used by the CLI screen, the report, the
TensorBoard text and the run page's hang card. Names from disk (frames, phases, hosts, groups)
stay text: callers escape them for their medium.
"""

from __future__ import annotations

from dataclasses import dataclass


def hang_of(summary: dict | None) -> dict | None:
    """The run's first hang finding, or None."""
    for f in (summary or {}).get("findings") or []:
        if isinstance(f, dict) and f.get("kind") == "hang":
            return f
    return None


def _ranks(rs) -> str:
    from kforge_dash.text import rank_list

    rs = [r for r in rs or [] if isinstance(r, int)]
    return rank_list(rs) or "no rank"


def hang_lines(f: dict) -> list[str]:
    """The hang's details under its message: where each group of ranks stands, their lines, the collective."""
    out = []
    for s in f.get("states") or []:
        if isinstance(s, dict):
            step = s.get("last_step")
            where = f"last ended step {step}" if step is not None else "no step ended"
            phase = s.get("phase")
            out.append(f"{s.get('role')}: {_ranks(s.get('ranks'))}: {where}, "
                       f"{'in phase ' + str(phase) if phase else 'in no known phase'}")
    for g in f.get("stacks") or []:
        if isinstance(g, dict):
            out.append(f"{len(g.get('ranks') or [])} at {g.get('frame') or 'an unknown line'} ({_ranks(g.get('ranks'))})")
    c = f.get("collective")
    if isinstance(c, dict):
        out.append(f"collective: {c.get('op')} #{c.get('seq')} of group {c.get('group')}"
                   f"{' (' + str(c.get('desc')) + ')' if c.get('desc') else ''}, sizes {c.get('sizes')}")
    else:
        out.append("collective: unknown (no flight-recorder dump; docs/hangs.md says how to turn it on)")
    if f.get("gil_held"):
        out.append(f"held the GIL (stacks from faulthandler): {_ranks(f['gil_held'])}")
    if f.get("no_evidence"):
        out.append(f"no evidence from {_ranks(f['no_evidence'])}")
    return out


@dataclass(frozen=True)
class RankCell:
    """One rank in the run page's strip."""

    rank: int
    role: str  # outlier, majority, stalled, no evidence
    last_step: int | None
    phase: str | None


def rank_strip(f: dict) -> list[RankCell]:
    """Every rank of the hang by rank: its role, last ended step and phase."""
    cells = {}
    for s in f.get("states") or []:
        if isinstance(s, dict):
            for r in s.get("ranks") or []:
                if isinstance(r, int):
                    cells[r] = RankCell(r, str(s.get("role")), s.get("last_step"), s.get("phase"))
    for r in f.get("no_evidence") or []:
        if isinstance(r, int):
            cells.setdefault(r, RankCell(r, "no evidence", None, None))
    return [cells[r] for r in sorted(cells)]
