"""Lines that would hide each other: a run whose drawn series equals an earlier run's (a shared lr
schedule, two runs of one seed) is drawn dashed over it, and the page says so."""

from __future__ import annotations

import numpy as np

from kforge_dash.browse.series import CompareData


def identical_runs(data: CompareData, metric: str) -> dict[str, str]:
    """{run: the earlier run whose drawn `metric` it repeats exactly (same steps, same values)}."""
    seen: dict[bytes, str] = {}
    out: dict[str, str] = {}
    for s in data.series:
        if s.metric != metric or s.kind != "raw" or len(s.y) == 0:
            continue
        first = seen.setdefault(np.ascontiguousarray(s.step).tobytes() + b"|" + np.ascontiguousarray(s.y).tobytes(), s.run)
        if first != s.run:
            out[s.run] = first
    return out


def identical_notes(data: CompareData) -> list[str]:
    """One line per run drawn over an identical one, e.g. 'b: loss the same as a (dashed)'."""
    return [f"{run}: {m} the same as {first} (dashed)" for m in data.drawn_metrics()
            for run, first in identical_runs(data, m).items()]
