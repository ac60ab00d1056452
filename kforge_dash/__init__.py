"""kforge_dash: ingest, export and the dashboard (the post-processing side of kforge)."""

# Lazy, so `import kforge_dash` stays light (polars is imported only when ingest is used).
_LAZY = {"ingest_run": "ingest", "ingest_path": "ingest", "IngestError": "ingest", "IngestResult": "ingest"}


def __getattr__(name):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'kforge_dash' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{mod}", __name__), name)
