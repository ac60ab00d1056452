"""What an export hands back: one outcome per exporter, and the summary.json ``exports`` shape."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from kforge_dash.contract import EXPORT_NAMES
from kforge_dash.export.history import History


@dataclass(frozen=True, kw_only=True)
class ExporterOutcome:
    """What one exporter did. ``error`` is None exactly when ``ok``."""

    ok: bool
    path: str | None = None  # the event file / the offline run dir
    error: str | None = None
    points: int | None = None  # TensorBoard: values written; W&B: history rows logged
    run_id: str | None = None  # W&B only
    seconds: float | None = None

    def to_dict(self) -> dict:
        return {"ok": self.ok, "path": self.path, "error": self.error, "points": self.points,
                "run_id": self.run_id, "seconds": self.seconds}


class Exporter(Protocol):
    """One export target, chosen once (kforge_dash.export.exporters): a name and one call.

    ``export`` never raises for the target's own failure: it returns an outcome with ``ok=False``.
    ``needs`` names an exporter whose success this one requires in the same pass (the upload
    needs the W&B export), or is None.
    """

    name: str
    needs: str | None

    def export(self, history: History) -> ExporterOutcome: ...


@dataclass(frozen=True, kw_only=True)
class ExportResult:
    """Per exporter outcome; None means the exporter was not asked for (--no-tensorboard, no --upload ...)."""

    run_dir: str
    tensorboard: ExporterOutcome | None
    wandb: ExporterOutcome | None
    upload: ExporterOutcome | None

    @property
    def ok(self) -> bool:
        return all(o.ok for o in (self.tensorboard, self.wandb, self.upload) if o is not None)

    @property
    def errors(self) -> list[str]:
        return [f"{name}: {o.error}" for name, o in self.items() if o is not None and not o.ok]

    def items(self):
        return (("tensorboard", self.tensorboard), ("wandb", self.wandb), ("upload", self.upload))

    def to_dict(self) -> dict:
        """The ``exports`` value of summary.json (docs/CONTRACT.md)."""
        return {name: (o.to_dict() if o is not None else None) for name, o in self.items()}

    @classmethod
    def of(cls, run_dir: str, outcomes: dict[str, ExporterOutcome]) -> ExportResult:
        return cls(run_dir=run_dir, **{n: outcomes.get(n) for n in EXPORT_NAMES})
