"""What an importer reads from one run of another tracker, before it becomes kforge shards."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# Why a point was superseded (``superseded.parquet``'s ``reason``; docs/imports.md)
PURGE_STEP = "purge_step"  # a restart (SessionLog.START, SummaryWriter(purge_step=)) purged it
OUT_OF_ORDER = "out_of_order"  # a step going back purged it (event files older than brain.Event:2)
REPEATED_STEP = "repeated_step"  # a later point of the same tag and step replaced it


class Series:
    """One tag's points, in the order the tracker's own reader returns them: arrays appended in bulk
    (``extend``) and single points (``add``), kept in order."""

    def __init__(self):
        self._chunks: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._steps: list[int] = []
        self._walls: list[float] = []
        self._values: list[float] = []
        self.add_step, self.add_wall, self.add_value = self._steps.append, self._walls.append, self._values.append

    def add(self, step: int, wall: float, value: float) -> None:
        self.add_step(step)
        self.add_wall(wall)
        self.add_value(value)

    def extend(self, steps: np.ndarray, walls: np.ndarray, values: np.ndarray) -> None:
        self._flush()
        self._chunks.append((steps, walls, values))

    def _flush(self) -> None:
        if self._steps:
            self._chunks.append((np.array(self._steps, dtype=np.int64), np.array(self._walls, dtype=np.float64),
                                 np.array(self._values, dtype=np.float64)))
            self._steps.clear()
            self._walls.clear()
            self._values.clear()

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(steps int64, walls float64, values float64), every point in order."""
        self._flush()
        if len(self._chunks) != 1:
            parts = self._chunks or [(np.zeros(0, np.int64), np.zeros(0), np.zeros(0))]
            self._chunks = [tuple(np.concatenate([c[i] for c in parts]) for i in range(3))]
        return self._chunks[0]

    def replace(self, steps: np.ndarray, walls: np.ndarray, values: np.ndarray) -> None:
        self._steps.clear()
        self._walls.clear()
        self._values.clear()
        self._chunks = [(steps, walls, values)]

    def __len__(self) -> int:
        return sum(len(c[0]) for c in self._chunks) + len(self._steps)


class Superseded:
    """Points the tracker's reader no longer shows, kept aside (the rows of ``superseded.parquet``)."""

    def __init__(self):
        self.chunks: list[dict] = []

    def extend(self, tag: str, steps: np.ndarray, walls: np.ndarray, values: np.ndarray, reason: str,
               by_steps: np.ndarray | int) -> None:
        """``by_steps``: the step of the event that superseded each point (one for all, or one each)."""
        if len(steps):
            self.chunks.append({"tag": np.full(len(steps), tag, dtype=object), "step": steps, "time": walls,
                                "value": values, "reason": np.full(len(steps), reason, dtype=object),
                                "superseded_at_step": np.broadcast_to(np.asarray(by_steps, dtype=np.int64), len(steps))})

    def column(self, name: str) -> np.ndarray:
        return np.concatenate([c[name] for c in self.chunks]) if self.chunks else np.zeros(0)

    def __len__(self) -> int:
        return sum(len(c["step"]) for c in self.chunks)


@dataclass(frozen=True)
class SourceFile:
    path: str
    size: int


@dataclass
class SourceRun:
    """One run of another tracker as read: its points by tag, what it superseded, and about it."""

    kind: str  # "tensorboard" or "wandb"
    name: str  # the kforge run folder it becomes under ROOT
    source: str  # the folder or file it was read from
    files: list[SourceFile]
    series: dict[str, Series] = field(default_factory=dict)
    superseded: Superseded = field(default_factory=Superseded)
    hparams: dict = field(default_factory=dict)
    tags: list[str] = field(default_factory=list)
    host: str | None = None
    about: dict = field(default_factory=dict)  # the tracker's own ids (W&B run id, project, entity)
    start_time: float | None = None  # the tracker's own run start (Unix s), else the first point's
    warnings: list[str] = field(default_factory=list)  # read on, nothing lost but what they say
    errors: list[str] = field(default_factory=list)  # corrupt data: points after it are lost

    def series_of(self, tag: str) -> Series:
        s = self.series.get(tag)
        if s is None:
            s = self.series[tag] = Series()
        return s
