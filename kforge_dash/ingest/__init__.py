"""Ingest: merge a run's rank shards and restarts into RUN/ingested/ (docs/CONTRACT.md).

    shards.py     list attempts and part files, read footers and rows of one part
    manifest.py   the footer cache and the state an append checks (ingested/manifest.parquet)
    footers.py    footers of many parts read by worker processes
    launches.py   attempts grouped into launches; FLOPs and peak per launch (flops.py)
    read.py       rows of one step window, coalesced; ranks.parquet writer
    merge.py      old kept rows merged with new ones (append)
    append.py     the plan of an append and its old outputs
    reduce.py     per-step reductions over ranks
    summary.py    summary.json
    run.py        ingest_run: unchanged? -> plan -> rows -> derive -> write -> summarise
"""

_LAZY = {"ingest_run": "run", "IngestError": "options", "IngestFailure": "options", "IngestOptions": "options",
         "IngestResult": "options", "IngestWarning": "options", "IngestNotReady": "options",
         "IngestWaiting": "options"}


def __getattr__(name):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'kforge_dash.ingest' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{mod}", __name__), name)
