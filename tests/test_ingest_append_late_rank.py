"""An append where one rank's first rows arrive only in a later ingest (its first part flushed after the
other ranks' were ingested): the launch's first step lasts from its first rank's start (period.py), so the
append must give what a full ingest gives (steps.parquet step_time_s, summary.json)."""

import pytest
from findings_fixtures import Clock, install
from ingest_fixtures import assert_same, close_all, flush_all, full_outputs, open_ranks, read_outputs

from kforge_dash.ingest.options import IngestOptions
from kforge_dash.ingest.run import ingest_run

pytestmark = pytest.mark.usefixtures("closes_recorders")


def _steps(recs, clock, steps, *, first_lead=None):
    """Each step: every rank starts, 1 s later every rank ends (rank 1 starts ``first_lead`` s before the
    others in its first step: the launch's first step began with it)."""
    for s in steps:
        if first_lead is not None and s == steps[0]:
            recs[1].start_step()
            clock.t += first_lead
            for r in (0, 2):
                recs[r].start_step()
        else:
            for rec in recs.values():
                rec.start_step()
        clock.t += 1.0
        for rec in recs.values():
            rec.end_step(s, loss=1.0 / s, tokens=10)


@pytest.mark.parametrize("chunk_rows", [None, 10])
@pytest.mark.parametrize(("first", "before"), [(1, 1), (3, 1), (1, 2)])
def test_a_rank_whose_first_part_comes_late(tmp_path, monkeypatch, chunk_rows, first, before):
    """``before``: ingests of the other ranks' rows before rank 1's first part comes (the later ones appends)."""
    run = str(tmp_path / "late")
    clock = install(monkeypatch, Clock())
    recs = open_ranks(run, 3, flush_every_steps=10**6)
    opts = IngestOptions(chunk_rows=chunk_rows) if chunk_rows else None
    for k in range(before):
        _steps(recs, clock, list(range(first + 10 * k, first + 10 * k + 10)), first_lead=4.0 if k == 0 else None)
        recs[0].flush()
        recs[2].flush()  # rank 1's first rows (it began the first step) arrive after these ingests
        ingest_run(run, options=opts)
    _steps(recs, clock, list(range(first + 10 * before, 21)))
    _steps(recs, clock, list(range(21, 41)))
    flush_all(recs)
    res = ingest_run(run, options=opts)
    got = read_outputs(run)
    assert got[0]["step_time_s"][0] == pytest.approx(5.0)  # from rank 1's start of the first step
    assert_same(got, full_outputs(run, **({"chunk_rows": chunk_rows} if chunk_rows else {})))
    assert res.appended
    close_all(recs)
