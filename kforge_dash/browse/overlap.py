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


def chart_notes(parts: list[CompareData]) -> list[str]:
    """The notes under the charts, each said once: the parts' own (a note repeated by every chart is one
    line), then the runs drawn over identical ones, one line per earlier run and set of metrics:
    'b, c: loss, lr the same as a (dashed)' (it read 'b: loss the same as a (dashed)' per run and metric)."""
    same: dict[tuple[str, str], list[str]] = {}  # (earlier run, run) -> metrics
    for p in parts:
        for m in p.drawn_metrics():
            for run, first in identical_runs(p, m).items():
                same.setdefault((first, run), []).append(m)
    grouped: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for (first, run), metrics in same.items():
        grouped.setdefault((first, tuple(dict.fromkeys(metrics))), []).append(run)
    lines = [f"{', '.join(runs)}: {', '.join(metrics)} the same as {first} (dashed)"
             for (first, metrics), runs in grouped.items()]
    return list(dict.fromkeys([n for p in parts for n in p.notes] + lines))
