"""Folders and names on disk: an empty run, a folder that is no run, a stray folder under a rank,
self-loop symlinks, run folders named like glob patterns (ingested, appended and exported as names)."""

import os

import pytest
from ingest_fixtures import close_all, flush_all, open_ranks, read_outputs, run_steps
from parts_fixtures import make_run, read_outputs_by_path, small_run

from kforge_dash.ingest.options import IngestError, IngestResult, IngestWarning
from kforge_dash.ingest.run import ingest_run
from kforge_dash.pipeline import ingest_path


def test_empty_run_and_non_run_directory(tmp_path, monkeypatch):
    empty = tmp_path / "empty"
    recs = open_ranks(str(empty), 1)
    close_all(recs)  # meta.json and end.json, no part file
    with pytest.raises(IngestError, match="no readable rows"):
        ingest_run(str(empty))
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "notes.txt").write_text("hi")
    with pytest.raises(IngestError, match=f"{plain}: not a kforge run"):
        ingest_run(str(plain))
    with pytest.raises(IngestError, match="no kforge runs found"):
        ingest_path(str(plain), tensorboard=False, wandb=False)
    with pytest.raises(IngestError, match="no such"):
        ingest_run(str(tmp_path / "nope"))
    with pytest.raises(IngestError, match=f"{plain / 'notes.txt'}: not a directory"):
        ingest_run(str(plain / "notes.txt"))


def test_a_stray_folder_under_a_rank_is_not_an_attempt(tmp_path, monkeypatch):
    run = small_run(str(tmp_path / "stray"), monkeypatch)
    ids = sorted(os.listdir(os.path.join(run, "rank-00000")) + os.listdir(os.path.join(run, "rank-00001")))
    empty = os.path.join(run, "rank-00000", "old-copy")
    os.makedirs(empty)
    junk = os.path.join(run, "rank-00001", "notes")
    os.makedirs(junk)
    with open(os.path.join(junk, "readme.txt"), "w") as f:
        f.write("not a shard")
    with pytest.warns(IngestWarning, match="neither meta.json nor part files"):
        ingest_run(run)
    steps, ranks, summary = read_outputs(run)
    assert [a["attempt_ids"] for a in summary["attempts"]] == [ids] and summary["restarts"] == []
    assert steps["step"].to_list() == [1, 2, 3, 4, 5] and ranks.height == 10 and summary["tokens"] == 100
    for folder in (empty, junk):
        assert sum(folder in w and "neither meta.json nor part files" in w for w in summary["warnings"]) == 1


def test_self_loop_symlinks_are_skipped_with_a_warning(tmp_path, monkeypatch):
    run = make_run(tmp_path / "run", monkeypatch, world=1)
    loop_rank = os.path.join(run, "rank-00004")
    os.symlink("rank-00004", loop_rank)
    rank0 = os.path.join(run, "rank-00000")
    loop_attempt = os.path.join(rank0, "loop")
    os.symlink("loop", loop_attempt)
    [attempt] = [e.path for e in os.scandir(rank0) if e.name != "loop"]
    loop_part = os.path.join(attempt, "part-000099.parquet")
    os.symlink("part-000099.parquet", loop_part)
    with pytest.warns(IngestWarning, match="Too many levels of symbolic links"):
        res = ingest_run(run)
    assert res.summary["steps"] == 20
    for path in (loop_rank, loop_attempt, loop_part):
        assert [w for w in res.summary["warnings"] if path in w and "skipped" in w], path
    out = ingest_path(str(tmp_path), tensorboard=False, wandb=False)  # a runs root with the loops in it
    assert [type(r) for r in out] == [IngestResult]


@pytest.mark.parametrize("name", ["sweep[lr=3e-4]", "**bold**", "a?b{c,d}"])
def test_run_dirs_named_like_glob_patterns_ingest_append_and_export(tmp_path, monkeypatch, name):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = str(tmp_path / name)
    recs = open_ranks(run, 2, flush_every_steps=1000)
    clock = run_steps(monkeypatch, recs, range(1, 11), step_time=lambda r, s: 1.0)
    flush_all(recs)
    first = ingest_path(run, wandb=False)
    run_steps(monkeypatch, recs, range(11, 16), step_time=lambda r, s: 1.0, clock=clock)
    flush_all(recs)
    [res] = ingest_path(run, wandb=False)  # an append: reads the old outputs back
    close_all(recs)
    assert isinstance(first[0], IngestResult) and isinstance(res, IngestResult) and res.appended
    steps, ranks, summary = read_outputs_by_path(run)
    assert steps["step"].to_list() == list(range(1, 16)) and ranks.height == 30
    tb = summary["exports"]["tensorboard"]
    assert tb["ok"], tb
    acc = EventAccumulator(os.path.dirname(tb["path"]))
    acc.Reload()
    assert [e.step for e in acc.Scalars("1_train/loss")] == list(range(1, 16))
    # the findings read ranks.parquet too: no warning that they could not
    assert not [w for w in summary["warnings"] if "finding" in w.lower()], summary["warnings"]
