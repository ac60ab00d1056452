"""The row pass: every step window of rows -> de-duplicated rows -> one row per step, ranks.parquet.

    rows.py       the row pass: every window, into ranks.parquet and per-step rows
    window.py     ingest_window: one window's rows -> de-duplicated -> one row per step (start_window +
                  Reducer: each batch reduced on a worker thread while the next is read)
    reduce.py     per-step reductions over ranks: one kernel, a window's batches added up
    coalesce.py   Recorder.log rows folded into their step's end_step row
    merge.py      old kept rows merged with new ones (append)
    append.py     the plan of an append and its old outputs
    period.py     the job's step time: the period between step ends, each rank on its own clock, across windows
    buffers.py    numpy work space reused window after window; the one column copier into it
    arrays.py     numpy -> Arrow without pa.array (which imports pandas)
    ranks_writer.py  ranks.parquet, each window's rows appended on a background thread
"""
