"""Ingest: merge a run's rank shards and restarts into RUN/ingested/ (docs/CONTRACT.md).

    shards.py     list attempts and part files, read footers and rows of one part
    parquet_io.py part files read at the least cost per file (footers, columns)
    second_writers.py  two processes that recorded the same rank of one launch
    manifest.py   the footer cache and the state an append checks (ingested/manifest.parquet)
    footers.py    footers of many parts read by worker processes
    launches.py   attempts grouped into launches; FLOPs and peak per launch (flops.py)
    meta_fields.py  the types of the meta.json fields ingest reads
    options.py    ingest's interface types: IngestOptions, its result, its errors
    option_spec.py  one definition of each option: its check, its help, its command-line spelling
    kept.py       the options kept with a run (ingested/options.json): given now, else kept, else default
    lock.py       the run's ingest lock, taken here only
    plan.py       the plan, from metadata only: launches, parts to read, cut-offs, append or not
    read.py       rows of one step window (or of a batch of its ranks): the window plan, the scan
    coalesce.py   Recorder.log rows folded into their step's end_step row
    window.py     ingest_window: one window's rows -> de-duplicated -> one row per step (start_window +
                  Reducer: each batch reduced on a worker thread while the next is read)
    shipped.py    what a window's result weighs as shipped to the --dask driver, and its worker's CPU
    rows.py       the row pass: every window, into ranks.parquet and per-step rows
    merge.py      old kept rows merged with new ones (append)
    rollbacks.py  steps that went back within an attempt: in-process restarts, superseded.parquet, their wasted time
    append.py     the plan of an append and its old outputs
    reduce.py     per-step reductions over ranks: one kernel, a window's batches added up
    period.py     the job's step time: the period between step ends, each rank on its own clock, across windows
    buffers.py    numpy work space reused window after window; the one column copier into it
    summary.py    summary.json
    temps.py      temp files a killed ingest or export left behind
    arrays.py     numpy -> Arrow without pa.array (which imports pandas)
    coverage.py   which rows of a merged part file the last ingest already read
    heartbeat_check.py  whether a heartbeat.bin's body is one a recorder could have written
    ranks_writer.py  ranks.parquet, each window's rows appended on a background thread
    restarts.py   how far each launch got and how the next took over: restarts, kills, overlaps
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
    "ingest_run": "run", "ingest_window": "window", "WindowTask": "window", "WindowRows": "window",
    "plan_windows": "read", "read_window": "read", "reduce_steps": "reduce",
    "IngestError": "options", "IngestFailure": "options", "IngestNotReady": "options", "IngestOptions": "options",
    "IngestResult": "options", "IngestWaiting": "options", "IngestWarning": "options",
}


def __getattr__(name):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'kforge_dash.ingest' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{mod}", __name__), name)
