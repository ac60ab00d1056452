"""kforge_dash: ingest, export and the dashboard (the post-processing side of kforge)."""
