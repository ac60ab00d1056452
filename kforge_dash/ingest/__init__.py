"""Ingest: merge a run's rank shards and restarts into RUN/ingested/ (docs/CONTRACT.md).

    inputs/       what ingest reads: part files, footers, meta.json, the plan (inputs/__init__.py lists them)
    rowpass/      the row pass: windows of rows -> de-duplicated -> one row per step, ranks.parquet
    lineage/      restarts and in-process rollbacks: how each launch took over, superseded steps
    options.py    ingest's interface types: IngestOptions, its result, its errors
    option_spec.py  one definition of each option: its check, its help, its command-line spelling
    kept.py       the options kept with a run (ingested/options.json): given now, else kept, else default
    lock.py       the run's ingest lock, taken here only
    shipped.py    what a window's result weighs as shipped to the --dask driver, and its worker's CPU
    summary.py    summary.json
    temps.py      temp files a killed ingest or export left behind
    straggler_costs.py  which what-if costs a finding supports, and the materiality rule of findings
    flight_recorder.py  the ranks a hung job waits for, from PyTorch flight-recorder dumps (kforge-hang; the
                  hang finding): fr_dumps.py reads the dumps into one shape, fr_waits.py follows who waits for whom
    run.py        ingest_run: unchanged? -> plan -> rows -> derive -> write -> summarise -> findings

Import order (tests/test_layout.py): the modules above <- kforge_dash/findings/ (findings and goodput: an
analysis of the outputs above, steps.parquet and ranks.parquet) <- run.py, which calls both.

The per-window work is ``ingest_window(WindowTask)``: plain values in, plain values out, so a
scheduler (Dask, a process pool) can run windows elsewhere; ``plan_windows`` cuts the windows.
"""

_LAZY = {
    "ingest_run": "run", "ingest_window": "rowpass.window", "WindowTask": "rowpass.window", "WindowRows": "rowpass.window",
    "plan_windows": "inputs.read", "read_window": "inputs.read", "reduce_steps": "rowpass.reduce",
    "IngestError": "options", "IngestFailure": "options", "IngestNotReady": "options", "IngestOptions": "options",
    "IngestResult": "options", "IngestWaiting": "options", "IngestWarning": "options",
}


def __getattr__(name):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'kforge_dash.ingest' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{mod}", __name__), name)
