"""`kforge-import tensorboard LOGDIR ROOT` / `kforge-import wandb PATH ROOT`: a click wrapper over kforge_dash.importers."""

from __future__ import annotations

import sys

try:
    import click
except ImportError as e:  # optional dependency, imported at the edge
    raise SystemExit("kforge-import needs the ingest extra: pip install 'kforge[ingest]'") from e

_EXIT = """
Exit status: 0 every run imported (warnings aside), 1 a run was not imported or its source is
corrupt (the points before the corrupt record are imported), 2 usage error.
"""
_PREFIX = click.option("--prefix", default="", metavar="TEXT",
                       help="Put TEXT before every run folder's name (e.g. 'tb-'): to keep runs of several sources "
                            "apart under one ROOT.")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Import old TensorBoard logs and W&B offline runs as kforge runs under ROOT.

    Each run becomes ROOT/NAME in the recorder's shard format, which `kforge-ingest ROOT` and the
    dashboard read as they read a recorded run: steps, wall times and every scalar by tag (the loss,
    gradient norm and learning rate mapped where the tag says so unambiguously), hparams where the log
    has them, and the tag imported:tensorboard or imported:wandb. Importing again writes the same
    files and leaves an unchanged run untouched. See docs/imports.md.
    """


@main.command(epilog=_EXIT)
@click.argument("logdir", type=click.Path(exists=True, file_okay=False))
@click.argument("root", type=click.Path(file_okay=False))
@_PREFIX
def tensorboard(logdir, root, prefix) -> None:
    """Import every TensorBoard run (a folder holding tfevents files) under LOGDIR into ROOT.

    A run is named by its path below LOGDIR ('/' as '__'; LOGDIR's own events by LOGDIR's name).
    Values are those TensorBoard's EventAccumulator shows, bit for bit, restarts purged as it purges
    them (purge_step, steps going back); the purged points are kept in ROOT/NAME/imported/superseded.parquet.
    """
    from kforge_dash.importers.api import import_tensorboard

    _report(lambda: import_tensorboard(logdir, root, prefix=prefix), f"no TensorBoard event files under {logdir}")


@main.command(epilog=_EXIT)
@click.argument("path", type=click.Path(exists=True))
@click.argument("root", type=click.Path(file_okay=False))
@_PREFIX
def wandb(path, root, prefix) -> None:
    """Import W&B offline runs into ROOT: PATH is a .wandb file, an offline run folder
    (wandb/offline-run-*), or a folder of them (every .wandb file under it).

    A run is named '<display name>-<run id>' (the run id alone when it has no name). Values are
    those of wandb's own reader (wandb leet inspect), NaN and infinities included; wandb's own keys
    (_step, _runtime, _timestamp) are not imported, _timestamp gives the wall time.
    """
    from kforge_dash.importers.api import import_wandb

    _report(lambda: import_wandb(path, root, prefix=prefix), f"no .wandb file under {path}")


def _report(do, nothing: str) -> None:
    try:
        results = do()
    except OSError as e:
        click.echo(f"kforge-import: error: {e}", err=True)
        sys.exit(1)
    if not results:
        click.echo(f"kforge-import: error: {nothing}", err=True)
        sys.exit(1)
    failed = False
    for r in results:
        o = r.outcome
        if o is None:
            line = f"{r.name}: skipped, {r.skipped}" if r.skipped else f"{r.name}: not imported"
        else:
            line = f"{r.name}: {o.status}, {o.steps} steps, {o.points} points"
            line += f", {o.superseded} superseded (imported/superseded.parquet)" if o.superseded else ""
        click.echo(line)
        for w in r.warnings:
            click.echo(f"  warning: {w}", err=True)
        for e in r.errors:
            click.echo(f"  error: {e}", err=True)
        failed = failed or bool(r.errors)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
