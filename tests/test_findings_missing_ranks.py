"""Steps that some ranks of their launch did not record (a part file skipped as unreadable, a rank
killed before its last flush) are a ``missing_ranks`` finding naming the steps and the ranks: their
step time, stragglers and goodput are over fewer ranks, which nothing else says."""

import pytest
from ingest_fixtures import part_files
from parts_fixtures import make_run

from kforge_dash.ingest.run import ingest_run


def _missing(summary):
    return [f for f in summary["findings"] if f["kind"] == "missing_ranks"]


def test_a_whole_run_has_no_missing_ranks_finding(tmp_path, monkeypatch):
    run = make_run(tmp_path / "run", monkeypatch, world=3)
    assert _missing(ingest_run(run).summary) == []


def test_unreadable_parts_of_one_rank_are_named_with_their_steps(tmp_path, monkeypatch):
    run = make_run(tmp_path / "run", monkeypatch, world=3)  # parts of 5 steps: 1-5, 6-10, 11-15, 16-20
    parts = sorted(p for p in part_files(run) if "rank-00001" in p)
    for victim in (parts[1], parts[3]):  # rank 1 loses steps 6-10 and 16-20
        with open(victim, "wb") as f:
            f.write(b"not parquet")
    with pytest.warns(UserWarning, match="corrupt"):
        summary = ingest_run(run).summary
    found = _missing(summary)
    assert [(f["first_step"], f["last_step"], f["ranks"], f["severity"]) for f in found] == [
        (6, 10, [1], "warning"), (16, 20, [1], "warning")]
    assert "recorded by as few as 2 of its 3 ranks" in found[0]["message"]
    assert "rank 1 has no rows for them" in found[0]["message"] and "tokens/s and MFU count only" in found[0]["message"]
    assert summary["steps"] == 20  # the steps stay, reduced over the ranks that recorded them
