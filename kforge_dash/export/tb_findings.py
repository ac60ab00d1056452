"""summary.json findings as TensorBoard markers (docs/CONTRACT.md, "Exports").

``findings/<kind>``: a scalar point at each finding's first step, in that step's own Event; its
value is how many findings of that kind start there (1.0 mostly). Markers on the step axis next to
``train/loss``, and stable across re-exports while the findings stand: a value that changed every
pass (a score, the goodput fraction) would rewrite earlier events and turn tensorboard.py's
append of new steps into a rewrite of the whole file.
"""

from __future__ import annotations


def findings_by_step(summary: dict | None) -> dict[int, list[tuple[str, float]]]:
    """{step: [(tag, value)]} of the findings markers."""
    counts: dict[tuple[int, str], int] = {}
    for f in (summary or {}).get("findings") or []:
        if isinstance(f, dict) and isinstance(f.get("first_step"), int) and isinstance(f.get("kind"), str):
            key = (f["first_step"], f"findings/{f['kind']}")
            counts[key] = counts.get(key, 0) + 1
    out: dict[int, list[tuple[str, float]]] = {}
    for (step, tag), n in sorted(counts.items()):
        out.setdefault(step, []).append((tag, float(n)))
    return out
