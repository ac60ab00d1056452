"""A window far bigger than chunk_rows (every rank's part files start at the same step, so a window
holds at least one part per rank) is read in batches of ranks, and gives the outputs of one read
of the window: steps.parquet byte for byte, ranks.parquet row for row, the same warnings."""

import os

import polars as pl
import pytest
from row_pass_fixtures import Returned, Whole, make_run, outputs, warns_of_make_run

from kforge_dash.ingest.options import IngestOptions
from kforge_dash.ingest.run import ingest_run
from kforge_dash.progress import NullProgress


class Reads(NullProgress):
    """Notes the rows of every read ingest reports."""

    def __init__(self):
        self.rows = []

    def rows_read(self, run_dir, rows):
        self.rows.append(rows)


@pytest.mark.parametrize(("chunk_rows", "resume_eval"), [(60, True), (100, False)])
def test_big_windows_are_read_in_batches_of_ranks_with_the_outputs_of_one_read(tmp_path, monkeypatch, chunk_rows,
                                                                              resume_eval):
    run = make_run(tmp_path / "run", monkeypatch, resume_eval=resume_eval)
    whole_reads, reads, returned_reads = Reads(), Reads(), Reads()
    with warns_of_make_run():
        ingest_run(run, options=IngestOptions(chunk_rows=chunk_rows), windows=Whole(), progress=whole_reads)
    whole = outputs(run)
    with warns_of_make_run():
        ingest_run(run, options=IngestOptions(chunk_rows=chunk_rows, force=True), progress=reads)
    batched = outputs(run)
    with warns_of_make_run():
        ingest_run(run, options=IngestOptions(chunk_rows=chunk_rows, force=True), windows=Returned(), progress=returned_reads)
    returned = outputs(run)

    assert batched[0] == whole[0] == returned[0]  # steps.parquet, byte for byte
    assert batched[1].equals(whole[1]) and returned[1].equals(whole[1])  # ranks.parquet: same rows, same order
    assert batched[2] == whole[2] == returned[2]
    warnings = "\n".join(whole[2]["warnings"])
    assert "'eval/loss' logged with different values" in warnings and "'loss' given by both" in warnings
    assert "recorded more than once" not in warnings  # rank 2's steps 34-36 ended again: a rollback, a restart
    rollback = [r for r in whole[2]["restarts"] if r.get("why") == "rollback"]
    assert len(rollback) == 1 and rollback[0]["in_process"] and rollback[0]["resumed_at_step"] == 34

    # One read per window held up to 12 x 30 rows and more; in batches, a read holds about
    # chunk_rows rows (whole part files of whole ranks). The window with the restart in it is cut
    # too, unless the resumed launch logged rows for a step of the earlier one (the eval at step
    # 54, which coalesces into launch 1's row): then its files meet their rank's earlier rows in
    # one batch, and here every rank's do.
    restart_window = whole_reads.rows[-1]
    assert max(whole_reads.rows) >= 3 * chunk_rows
    assert reads.rows == returned_reads.rows
    assert sum(reads.rows) == sum(whole_reads.rows)
    assert [n for n in reads.rows if n > chunk_rows + 30 + 2] == ([restart_window] if resume_eval else [])
    assert len(reads.rows) >= sum(whole_reads.rows) // (chunk_rows + 32)
    steps = pl.read_parquet(os.path.join(run, "ingested", "steps.parquet"))
    assert steps["step"].to_list() == list(range(1, 71))
