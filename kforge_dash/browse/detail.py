"""Which run the run detail page shows for its ?run=, and what it says instead when it cannot.

A run named in the URL is shown under that name or not at all: never another run's data under it
(e.g. a run deleted while its page is open is not replaced, once the listing cache expires, by the
first run of the root with ?run= dropped). Plain functions, no Streamlit.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kforge_dash.browse.runs import RunInfo, RunPathError, run_dir
from kforge_dash.contract import SUMMARY_FILE

HOW_TO_INGEST = "kforge-ingest RUN_DIR (or the Ingest button here and on the Compare page)"


@dataclass(frozen=True)
class RunChoice:
    """`run`: the run to show (None: show none). `problem`: why not, as plain text (the page shows it
    as text). `ingest`: the run to offer the Ingest button for (found but not, or no longer, ingested)."""
    run: RunInfo | None
    problem: str | None = None
    ingest: RunInfo | None = None


def _on_disk(root: Path, name: str) -> Path | None:
    try:
        path = run_dir(root, name)
    except RunPathError:
        return None
    return path if path.is_dir() else None


def listing_is_stale(root: str | Path, runs: list[RunInfo], wanted: str | None) -> bool:
    """True when a (cached) listing disagrees with the disk about the run the URL names: listed but
    its folder or its ingest is gone, or not listed but there. The page then lists the root again."""
    if not wanted:
        return False
    listed = next((r for r in runs if r.name == wanted), None)
    if listed is None:
        return _on_disk(Path(root), wanted) is not None
    return not listed.path.is_dir() or listed.ingested != (listed.path / "ingested" / SUMMARY_FILE).is_file()


def choose_run(root: str | Path, runs: list[RunInfo], wanted: str | None) -> RunChoice:
    """The run for ?run=`wanted` (None: the first ingested run), from a fresh listing `runs` of `root`."""
    ingested = [r for r in runs if r.ingested]
    if not wanted:
        if ingested:
            return RunChoice(ingested[0])
        return RunChoice(None, f"No ingested runs under {root} yet. Record a run with kforge_record, then "
                               f"ingest it: {HOW_TO_INGEST}.")
    listed = next((r for r in runs if r.name == wanted), None)
    if listed is None or not listed.path.is_dir():
        return RunChoice(None, f"Run {wanted!r} is not under {root}: it was deleted, renamed or moved (or never "
                               "recorded there). Nothing of it is shown; pick another run below.")
    if not listed.ingested:
        return RunChoice(None, f"Run {wanted!r} has no ingested outputs yet, so there is nothing to show. Ingest "
                               f"it: {HOW_TO_INGEST}.", ingest=listed)
    return RunChoice(listed)
