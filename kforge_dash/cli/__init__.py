"""Command-line entry points, thin click wrappers over the library.

    ingest.py     kforge-ingest
    on_finding.py kforge-ingest --on-finding CMD: findings as events
    options.py    click options made from the one definition of each option, and --version
    dash.py       kforge-dash
    report.py     kforge-report
    hang.py       kforge-hang: which ranks a hung job waits for, from flight-recorder dumps
    import_runs.py  kforge-import: TensorBoard / W&B offline runs as kforge runs
"""
