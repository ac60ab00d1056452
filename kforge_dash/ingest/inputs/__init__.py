"""What ingest reads: the run's part files, footers and metadata, and the plan made from them.

    shards.py     list attempts and part files, read footers and rows of one part
    parquet_io.py part files read at the least cost per file (footers, columns)
    second_writers.py  two processes that recorded the same rank of one launch
    manifest.py   the footer cache and the state an append checks (ingested/manifest.parquet)
    footers.py    footers of many parts read by worker processes
    meta_fields.py  the types of the meta.json fields ingest reads
    heartbeat_check.py  whether a heartbeat.bin's body is one a recorder could have written
    coverage.py   which rows of a merged part file the last ingest already read
    read.py       rows of one step window (or of a batch of its ranks): the window plan, the scan
    plan.py       the plan, from metadata only: launches, parts to read, cut-offs, append or not
    launches.py   attempts grouped into launches; FLOPs and peak per launch (flops.py)
    flops.py
"""
