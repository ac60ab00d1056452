"""What an importer reads from one run of another tracker, before it becomes kforge shards."""

from __future__ import annotations

from dataclasses import dataclass, field

# Why a point was superseded (``superseded.parquet``'s ``reason``; docs/imports.md)
PURGE_STEP = "purge_step"  # a restart (SessionLog.START, SummaryWriter(purge_step=)) purged it
OUT_OF_ORDER = "out_of_order"  # a step going back purged it (event files older than brain.Event:2)
REPEATED_STEP = "repeated_step"  # a later point of the same tag and step replaced it


@dataclass
class Series:
    """One tag's points, in the order the tracker's own reader returns them."""

    steps: list = field(default_factory=list)
    walls: list = field(default_factory=list)
    values: list = field(default_factory=list)

    def add(self, step: int, wall: float, value: float) -> None:
        self.steps.append(step)
        self.walls.append(wall)
        self.values.append(value)


@dataclass
class Superseded:
    """Points the tracker's reader no longer shows, kept aside (columns of ``superseded.parquet``)."""

    tags: list = field(default_factory=list)
    steps: list = field(default_factory=list)
    walls: list = field(default_factory=list)
    values: list = field(default_factory=list)
    reasons: list = field(default_factory=list)
    by_steps: list = field(default_factory=list)  # the step of the event that superseded it

    def add(self, tag: str, step: int, wall: float, value: float, reason: str, by_step: int) -> None:
        self.tags.append(tag)
        self.steps.append(step)
        self.walls.append(wall)
        self.values.append(value)
        self.reasons.append(reason)
        self.by_steps.append(by_step)


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
