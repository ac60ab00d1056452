"""Which kforge column each imported tag becomes.

A tag that names the loss, the gradient norm or the learning rate (``WELL_KNOWN``, compared without
case) becomes kforge's ``loss``/``grad_norm``/``lr`` when it is the only such tag of its run; with two
candidates (``loss`` and ``train/loss``) neither is mapped (which one the charts should show is not
known) and both stay user scalars. Every other tag is a user scalar under its own name, except a
name kforge's shard format reserves (a fixed column, ``time/NAME_s`` phases, ``hw/*`` telemetry),
which becomes ``user/TAG``; empty names and names with NUL are left out.
"""

from __future__ import annotations

from dataclasses import dataclass

from kforge_record.schema import FIXED_NAMES, HW_COLUMNS, PHASE_PREFIX, PHASE_SUFFIX

WELL_KNOWN = {
    "loss": ("loss", "train/loss", "1_train/loss", "train_loss", "loss/train", "training_loss", "training/loss", "trainer/loss"),
    "grad_norm": ("grad_norm", "train/grad_norm", "1_train/grad_norm", "grad-norm", "gradient_norm", "train/gradient_norm",
                  "grad_norm/total", "optim/grad_norm"),
    "lr": ("lr", "learning_rate", "train/lr", "1_train/lr", "train/learning_rate", "optim/lr", "lr-adamw", "lr-adam", "lr-sgd"),
}
_BY_NAME = {name: column for column, names in WELL_KNOWN.items() for name in names}


@dataclass(frozen=True)
class ColumnPlan:
    """tag -> kforge column, and what was noted on the way."""

    columns: dict[str, str]  # every imported tag -> its column
    left_out: tuple[str, ...]  # tags no reader could name
    notes: tuple[str, ...]  # ambiguities and renames, one sentence each


def plan_columns(tags) -> ColumnPlan:
    tags = sorted(tags)
    left_out = tuple(t for t in tags if not t or "\0" in t)
    usable = [t for t in tags if t and "\0" not in t]
    candidates: dict[str, list[str]] = {}
    for t in usable:
        column = _BY_NAME.get(t.lower())
        if column:
            candidates.setdefault(column, []).append(t)
    notes = []
    columns = {}
    for column, found in sorted(candidates.items()):
        if len(found) == 1:
            columns[found[0]] = column
        else:
            notes.append(f"tags {', '.join(repr(t) for t in found)} could each be {column}: none is mapped, all kept by name")
    for t in usable:
        if t in columns:
            continue
        name = f"user/{t}" if _reserved(t) else t
        if name != t:
            notes.append(f"tag {t!r} is a name kforge reserves: kept as {name!r}")
        columns[t] = name
    return ColumnPlan(columns, left_out, tuple(notes))


def _reserved(name: str) -> bool:
    return (name in FIXED_NAMES or name in HW_COLUMNS or name.startswith("hw/")
            or (name.startswith(PHASE_PREFIX) and name.endswith(PHASE_SUFFIX)))
