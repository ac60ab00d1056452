"""How ingest reports progress: an object chosen once, by default one that says nothing.

Ingest calls ``lock_wait(run_dir)`` when another ingest of the run holds its lock,
``chunk(run_dir, done, total)`` after each window of rows, ``rows_read(run_dir, rows)`` just before
it for each read the window took (the whole window, or each batch of its ranks when the window
holds more than ``chunk_rows`` rows: the rows a read returns bound what ingest holds at once),
and ``done(run_dir)`` at the end.
The CLI picks RichProgress on a terminal, PlainProgress otherwise, NullProgress with --quiet.
"""

from __future__ import annotations

import sys


class NullProgress:
    """Says nothing (the default: a library call prints nothing)."""

    def lock_wait(self, run_dir: str) -> None:
        pass

    def chunk(self, run_dir: str, done: int, total: int) -> None:
        pass

    def rows_read(self, run_dir: str, rows: int) -> None:
        pass

    def done(self, run_dir: str) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


class PlainProgress(NullProgress):
    """One line on stderr per event (logs, pipes, Slurm output files)."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr

    def lock_wait(self, run_dir: str) -> None:
        print(f"{run_dir}: another kforge-ingest is writing this run; waiting for it", file=self.stream, flush=True)

    def chunk(self, run_dir: str, done: int, total: int) -> None:
        print(f"{run_dir}: chunk {done}/{total}", file=self.stream, flush=True)


class RichProgress(PlainProgress):
    """A transient rich progress bar on stderr (stdout stays for results)."""

    def __init__(self):
        super().__init__()
        from rich.console import Console
        from rich.progress import Progress

        self.bar = Progress(transient=True, console=Console(stderr=True))
        self.task = None

    def __enter__(self):
        self.bar.start()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.stop()

    def chunk(self, run_dir: str, done: int, total: int) -> None:
        if self.task is None:
            self.task = self.bar.add_task(run_dir, total=total)
        self.bar.update(self.task, completed=done, total=total, description=run_dir)

    def done(self, run_dir: str) -> None:
        if self.task is not None:
            self.bar.remove_task(self.task)
            self.task = None


def progress_for(*, quiet: bool) -> NullProgress:
    """NullProgress when quiet, a rich bar on a terminal, plain lines otherwise."""
    if quiet:
        return NullProgress()
    if sys.stderr.isatty():
        try:
            return RichProgress()
        except ImportError:
            pass
    return PlainProgress()
