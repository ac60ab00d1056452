"""Two processes that both recorded the same rank of one launch (a misconfigured launcher).

kforge_record claims an attempt folder with ``mkdir``; a recorder that finds its launch's folder
taken claims ``<attempt id>-p<pid>-<time>`` instead (docs/CONTRACT.md, "Shards"). Several such
folders of one rank are harmless when one process wrote them all (a second Recorder in a script);
written by different processes, they are a second writer of that rank, which ingest reports.
"""

from __future__ import annotations

import json
import os

from kforge_record.regular_file import read_regular_bytes
from kforge_record.schema import META_FILE, launch_of_attempt


def warn_second_writers(attempts: list, warnings: list[str]) -> list:
    """Warn about each second writer among ``attempts`` (the run's listed attempt folders, with
    ``rank``, ``attempt_id``, ``dir``); returns ``attempts`` as they were."""
    claims: dict[tuple[int, str], list] = {}
    for a in attempts:
        claims.setdefault((a.rank, launch_of_attempt(a.attempt_id)), []).append(a)
    for (rank, launch), group in claims.items():
        if len(group) > 1 and len({_writer_of(a.dir) for a in group}) > 1:
            folders = ", ".join(a.dir for a in group)
            warnings.append(f"rank {rank}: {len(group)} processes wrote launch {launch} as this rank ({folders}): "
                            "a second writer of the same rank (check the launcher's rank assignment); "
                            "each folder is ingested as an attempt of its own")
    return attempts


def _writer_of(folder: str) -> tuple:
    """(host, pid) from meta.json; the folder itself when meta.json cannot tell (another writer)."""
    try:
        meta = json.loads(read_regular_bytes(os.path.join(folder, META_FILE)))
        return (str(meta.get("host")), str(meta.get("pid")))
    except (OSError, ValueError, AttributeError):
        return (folder,)
