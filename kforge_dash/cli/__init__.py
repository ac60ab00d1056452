"""Command-line entry points: kforge-ingest (ingest.py) and kforge-dash (dash.py)."""
