"""kforge_dash: the post-processing side of kforge, one sub-package per stage.

    contract.py   what ingest hands export and browse (file names, columns, the summary reader)
    text.py       numbers, percents, durations and counts as text, one format each
    column_registry.py  each output column and shown summary field: label, unit, format, help
    run_view.py   one run's summary.json as every front end shows it (header, runs-table row, cards)
    optional.py   optional dependencies: import by name, or say which extra installs it
    progress.py   how ingest reports progress (by default, silently)
    ingest/       shards -> RUN/ingested/{steps,ranks}.parquet + summary.json
    findings/     findings, goodput, what-if and hosts: an analysis of what ingest wrote
    importers/    other trackers' logs (TensorBoard, W&B offline) -> kforge shards
    export/       RUN/ingested/ -> TensorBoard event file, offline W&B run
    browse/       the Streamlit app: views that render, plain functions that prepare
    pipeline.py   ingest then export, and the --watch loop
    cluster.py    the same on a Dask cluster (kforge-ingest --dask)
    cli/          kforge-ingest, kforge-dash

Nothing imports upward: kforge_record <- contract <- ingest <- findings <- ingest/run.py <- {export, browse}
<- pipeline <- cli (tests/test_layout.py).
"""

# Lazy, so `import kforge_dash` stays light (polars is imported only when ingest is used).
_LAZY = {"ingest_run": "ingest.run", "IngestError": "ingest.options", "IngestResult": "ingest.options",
         "IngestOptions": "ingest.options", "ingest_path": "pipeline"}


def __getattr__(name):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'kforge_dash' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{mod}", __name__), name)
