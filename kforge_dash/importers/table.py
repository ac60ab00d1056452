"""An imported run's points as kforge rows: one row per step, one column per tag.

Per tag, a step logged twice keeps its last point (the one a chart of the tag ends on); the
earlier ones are superseded (``repeated_step``). A step's ``time`` is the latest wall time of the
points kept at it. ``step_time_s`` and ``tokens`` are null: the tracker did not record them, and a
missing value is null, never made up.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from kforge_dash.importers.source import REPEATED_STEP, SourceRun
from kforge_dash.importers.tag_columns import ColumnPlan
from kforge_record.schema import FIXED_COLUMNS


@dataclass(frozen=True)
class Rows:
    table: pa.Table  # the part files' rows, sorted by step, columns in shard order
    points: int  # points kept


def _last_per_step(steps: np.ndarray) -> np.ndarray:
    """Indices of the last point of each distinct step, in step order."""
    order = np.argsort(steps, kind="stable")
    s = steps[order]
    last = np.ones(len(s), dtype=bool)
    last[:-1] = s[1:] != s[:-1]
    return order[last]


def build_rows(run: SourceRun, plan: ColumnPlan) -> Rows:
    per_tag = {}
    for tag, series in run.series.items():
        if tag not in plan.columns or not len(series):
            continue
        steps, walls, values = series.arrays()
        keep = _last_per_step(steps)
        if len(keep) < len(steps):
            dropped = np.ones(len(steps), dtype=bool)
            dropped[keep] = False
            run.superseded.extend(tag, steps[dropped], walls[dropped], values[dropped], REPEATED_STEP, steps[dropped])
        per_tag[tag] = (steps[keep], walls[keep], values[keep])
    all_steps = np.unique(np.concatenate([s for s, _, _ in per_tag.values()])) if per_tag else np.zeros(0, np.int64)
    n = len(all_steps)
    time = np.full(n, -np.inf)
    columns: dict[str, pa.Array] = {}
    points = 0
    for tag, (steps, walls, values) in per_tag.items():
        at = np.searchsorted(all_steps, steps)
        np.maximum.at(time, at, walls)
        full = np.zeros(n, dtype=np.float64)
        full[at] = values
        mask = np.ones(n, dtype=bool)
        mask[at] = False
        columns[plan.columns[tag]] = pa.array(full, mask=mask, type=pa.float64())
        points += len(steps)
    fixed = []
    for name, type_name in FIXED_COLUMNS:
        if name == "step":
            fixed.append(pa.array(all_steps, type=pa.int64()))
        elif name == "time":
            fixed.append(pa.array(time, type=pa.float64()))
        elif name in columns:
            fixed.append(columns.pop(name))
        else:
            fixed.append(pa.nulls(n, type=pa.type_for_alias(type_name)))
    names = [name for name, _ in FIXED_COLUMNS] + sorted(columns)
    table = pa.Table.from_arrays(fixed + [columns[c] for c in sorted(columns)], names=names)
    return Rows(table, points)
