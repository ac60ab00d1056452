"""Import every run of a TensorBoard log folder or of W&B offline runs under a kforge ROOT."""

from __future__ import annotations

import os
from dataclasses import dataclass

from kforge_dash.importers import tensorboard, wandb_log
from kforge_dash.importers.shards import ImportError_, WriteOutcome, write_run
from kforge_dash.importers.source import SourceRun


@dataclass(frozen=True)
class RunImport:
    """What became of one source run: written (``outcome``), or why not (``error``)."""

    name: str
    source: str
    outcome: WriteOutcome | None
    warnings: tuple[str, ...]
    errors: tuple[str, ...]  # corrupt data (points after it lost) or the reason nothing was written
    skipped: str | None = None  # why a source with nothing to import was passed over (not an error)


def _run_name(prefix: str, name: str) -> str:
    return f"{prefix}{name}"


def import_tensorboard(logdir: str, root: str, *, prefix: str = "") -> list[RunImport]:
    """One kforge run per TensorBoard run folder under ``logdir``: named by its path below ``logdir``
    (``/`` as ``__``; ``logdir`` itself by its own name), after ``prefix``."""
    if not os.path.isdir(logdir):
        raise FileNotFoundError(f"{logdir}: no such folder")
    out = []
    base = os.path.basename(os.path.abspath(logdir))
    for folder in tensorboard.find_runs(logdir):
        rel = os.path.relpath(folder, logdir)
        name = _run_name(prefix, base if rel == "." else rel.replace(os.sep, "__"))
        out.append(_write(tensorboard.read_run(folder, name), root))
    return out


def import_wandb(path: str, root: str, *, prefix: str = "") -> list[RunImport]:
    """One kforge run per ``.wandb`` file: ``path`` itself, or each under the folder ``path``
    (an offline run folder, or a ``wandb/`` folder of many)."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file or folder")
    out = []
    taken: dict[str, int] = {}
    for f in wandb_log.find_files(path):
        try:
            run = wandb_log.read_file(f)
        except OSError as e:
            out.append(RunImport(os.path.basename(f), f, None, (), (f"{f}: could not be read: {e.strerror or e}",)))
            continue
        name = _run_name(prefix, run.name)
        taken[name] = taken.get(name, 0) + 1
        run.name = name if taken[name] == 1 else f"{name}-{taken[name]}"  # a run resumed offline: a file each
        out.append(_write(run, root))
    return out


def _write(run: SourceRun, root: str) -> RunImport:
    if not any(len(s) for s in run.series.values()) and not len(run.superseded):
        return RunImport(run.name, run.source, None, tuple(run.warnings), tuple(run.errors), skipped="no scalars")
    try:
        os.makedirs(root, exist_ok=True)
        outcome = write_run(run, root)
    except (ImportError_, OSError) as e:
        return RunImport(run.name, run.source, None, tuple(run.warnings), (*run.errors, str(e)))
    return RunImport(run.name, run.source, outcome, tuple(run.warnings), tuple(run.errors))
