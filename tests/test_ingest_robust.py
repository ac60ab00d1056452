"""Bad input: each case is skipped with a warning naming the file, or a clear error; nothing lost."""

import json
import os
import shutil
import threading

import polars as pl
import pyarrow.parquet as pq
import pytest
from filelock import FileLock
from ingest_fixtures import close_all, open_ranks, part_files, read_outputs, run_steps, warns_each

from kforge_dash.ingest.options import IngestError, IngestOptions
from kforge_dash.ingest.run import ingest_run
from kforge_dash.pipeline import ingest_path
from kforge_dash.progress import NullProgress


def make_run(path, monkeypatch, *, world=2, steps=20):
    """Part files of exactly 5 steps each."""
    recs = open_ranks(str(path), world, flush_every_steps=1000)
    run_steps(monkeypatch, recs, range(1, steps + 1), step_time=lambda r, s: 1.0,
              values=lambda r, s: {"loss": float(s), "tokens": 10}, flush_every=5)
    close_all(recs)
    return str(path)


def test_truncated_and_garbage_parts_are_skipped_with_a_warning(tmp_path, monkeypatch):
    run = make_run(tmp_path / "run", monkeypatch)
    parts = [p for p in part_files(run) if "rank-00001" in p]
    lost = sum(pq.read_metadata(p).num_rows for p in parts[:2])
    assert lost == 10
    with open(parts[0], "r+b") as f:  # truncated: the footer is gone
        f.truncate(os.path.getsize(parts[0]) // 2)
    with open(parts[1], "wb") as f:
        f.write(b"this is not parquet at all")
    with pytest.warns(UserWarning, match="corrupt"):
        res = ingest_run(run)
    steps, ranks, summary = read_outputs(run)
    bad = [w for w in summary["warnings"] if "corrupt" in w]
    assert len(bad) == 2 and any(parts[0] in w for w in bad) and any(parts[1] in w for w in bad)
    # Rank 0 is whole; rank 1 lost exactly the rows of its two bad parts.
    assert ranks.filter(pl.col("rank") == 0).height == 20
    assert 0 < lost < 20 and ranks.filter(pl.col("rank") == 1).height == 20 - lost
    assert steps.height == 20 and res.summary["steps"] == 20


def test_corrupt_page_with_a_valid_footer_is_found_at_read_time(tmp_path, monkeypatch):
    run = make_run(tmp_path / "run", monkeypatch)
    victim = part_files(run)[0]
    lost = pq.read_metadata(victim).num_rows
    assert lost == 5
    data = bytearray(open(victim, "rb").read())
    for i in range(4, 200):  # scribble over the first data pages, keep the footer
        data[i] = 0xFF
    open(victim, "wb").write(bytes(data))
    with pytest.warns(UserWarning):
        ingest_run(run)
    _, ranks, summary = read_outputs(run)
    # the footer was fine, so the problem is found when the rows are read, not when planning
    assert any(victim in w and "corrupt part file" in w and "truncated" not in w for w in summary["warnings"])
    assert ranks.height == 2 * 20 - lost


def test_missing_and_unreadable_meta_keep_rows(tmp_path, monkeypatch):
    run = make_run(tmp_path / "run", monkeypatch, world=3)
    metas = sorted(os.path.join(d, "meta.json") for d, _, f in os.walk(run) if "meta.json" in f)
    os.remove(metas[1])
    open(metas[2], "w").write("{not json")
    with pytest.warns(UserWarning, match="meta.json"):
        ingest_run(run)
    steps, ranks, summary = read_outputs(run)
    assert ranks.height == 3 * 20 and steps["n_ranks"].to_list() == [3] * 20
    assert sum(metas[1] in w and "missing" in w for w in summary["warnings"]) == 1
    assert sum(metas[2] in w and "unreadable" in w for w in summary["warnings"]) == 1
    assert len(summary["attempts"]) == 1  # still recognised as one launch (start time from the attempt id)


def test_newer_schema_meta_is_refused_with_a_clear_message(tmp_path, monkeypatch):
    run = make_run(tmp_path / "run", monkeypatch)
    meta_path = next(os.path.join(d, "meta.json") for d, _, f in os.walk(run) if "meta.json" in f and "rank-00001" in d)
    meta = json.load(open(meta_path))
    meta["schema_version"] = "2.0"
    json.dump(meta, open(meta_path, "w"))
    with pytest.warns(UserWarning, match="newer"):
        ingest_run(run)
    _, ranks, summary = read_outputs(run)
    assert ranks["rank"].unique().to_list() == [0]
    assert any(meta_path in w and "schema 2.0" in w and "upgrade kforge" in w for w in summary["warnings"])
    # all attempts newer: nothing to ingest -> an error naming the run
    meta0 = meta_path.replace("rank-00001", "rank-00000")
    d0 = os.path.dirname(os.path.dirname(meta0))
    m0 = os.path.join(d0, os.listdir(d0)[0], "meta.json")
    meta = json.load(open(m0))
    meta["schema_version"] = "2.0"
    json.dump(meta, open(m0, "w"))
    with pytest.raises(IngestError, match=f"{run}: no readable rows"):
        ingest_run(run)


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


def test_failed_ingest_keeps_the_previous_outputs(tmp_path, monkeypatch):
    run = make_run(tmp_path / "run", monkeypatch, world=1)
    ingest_run(run)
    before = {n: open(os.path.join(run, "ingested", n), "rb").read() for n in ("steps.parquet", "ranks.parquet", "summary.json")}
    for p in part_files(run):
        open(p, "wb").write(b"garbage")
    with pytest.raises(IngestError, match="no readable rows"):
        ingest_run(run)
    after = {n: open(os.path.join(run, "ingested", n), "rb").read() for n in before}
    assert after == before
    assert not [n for n in os.listdir(os.path.join(run, "ingested")) if n.endswith(".tmp")]


def test_idempotent_and_incremental(tmp_path, monkeypatch):
    run = str(tmp_path / "run")
    recs = open_ranks(run, 2)
    clock = run_steps(monkeypatch, recs, range(1, 15), step_time=lambda r, s: 1.0)
    for rec in recs.values():
        rec.flush()
    first = ingest_run(run)
    steps1 = pl.read_parquet(os.path.join(run, "ingested", "steps.parquet"))
    ranks1 = pl.read_parquet(os.path.join(run, "ingested", "ranks.parquet"))
    again = ingest_run(run)
    assert again.skipped and not first.skipped  # unchanged shards: no work
    forced = ingest_run(run, options=IngestOptions(force=True))
    assert not forced.skipped
    steps2, ranks2, _ = read_outputs(run)
    assert steps2.equals(steps1) and ranks2.equals(ranks1)  # same shards, same data, same row order
    # the job goes on: new part files are picked up on the next ingest
    run_steps(monkeypatch, recs, range(15, 22), step_time=lambda r, s: 1.0, clock=clock)
    close_all(recs)
    third = ingest_run(run)
    assert not third.skipped
    steps3, ranks3, _ = read_outputs(run)
    assert steps3["step"].to_list() == list(range(1, 22)) and ranks3.height == 2 * 21
    assert steps3.head(14).select(steps1.columns).equals(steps1)
    # a different option is a different output: not skipped
    assert not ingest_run(run, options=IngestOptions(alpha=0.5)).skipped


class Events(NullProgress):
    """Progress that notes the events' names."""

    def __init__(self, events: list):
        self.events = events

    def lock_wait(self, run_dir):
        self.events.append("lock-wait")


def test_concurrent_ingests_wait_for_the_lock(tmp_path, monkeypatch):
    run = make_run(tmp_path / "run", monkeypatch)
    lock = FileLock(os.path.join(run, "ingested", ".ingest.lock"))
    events = []
    with lock:  # another ingest is writing this run
        with pytest.raises(IngestError, match="another kforge-ingest"):
            ingest_run(run, options=IngestOptions(lock_timeout_s=0.2), progress=Events(events))
    assert events == ["lock-wait"]
    # two at once: both succeed, one after the other, and the outputs are whole
    results, errors = [], []

    def go():
        try:
            results.append(ingest_run(run, options=IngestOptions(force=True)))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=go) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 2
    steps, ranks, _ = read_outputs(run)
    assert steps.height == 20 and ranks.height == 40


def test_runs_root_with_one_bad_run(tmp_path, monkeypatch):
    make_run(tmp_path / "root" / "good", monkeypatch)
    bad = tmp_path / "root" / "bad"
    make_run(bad, monkeypatch, world=1)
    for p in part_files(str(bad)):
        os.remove(p)
    out = ingest_path(str(tmp_path / "root"), tensorboard=False, wandb=False)
    by_name = {os.path.basename(r.run_dir): r for r in out}
    assert by_name["good"].summary["steps"] == 20
    assert "no readable rows" in by_name["bad"].error and str(bad) in by_name["bad"].error


def test_duplicate_end_step_keeps_the_last_with_a_warning(tmp_path, monkeypatch):
    run = str(tmp_path / "dup")
    recs = open_ranks(run, 1)
    run_steps(monkeypatch, recs, [1, 2, 2, 3], step_time=lambda r, s: 1.0,
              values=lambda r, s: {"loss": float(s), "tokens": 10})
    close_all(recs)
    with pytest.warns(UserWarning, match="recorded more than once"):
        ingest_run(run)
    steps, ranks, _ = read_outputs(run)
    assert ranks.height == 3 and steps["tokens"].to_list() == [10, 10, 10]


def test_copy_of_run_reads_back_with_pyarrow(tmp_path, monkeypatch):
    run = make_run(tmp_path / "run", monkeypatch)
    ingest_run(run)
    copy = shutil.copytree(run, tmp_path / "copy")
    t = pq.read_table(os.path.join(copy, "ingested", "ranks.parquet"))
    assert t.schema.field("step").type == "int64" and t.schema.field("rank").type == "int64"
    assert t.num_rows == 40


def test_a_foreign_part_with_an_all_null_column_is_read(tmp_path, monkeypatch):
    """A part written by another tool, with an untyped (Arrow null) scalar column: rows are kept."""
    import pyarrow as pa

    run = make_run(tmp_path / "run", monkeypatch, world=1, steps=5)
    attempt_dir = os.path.dirname(part_files(run)[0])
    src = pq.read_table(part_files(run)[0])
    extra = src.slice(0, 1).set_column(0, "step", pa.array([99], pa.int64()))
    extra = extra.append_column("eval/acc", pa.nulls(1))  # type "null"
    pq.write_table(extra.replace_schema_metadata(src.schema.metadata), os.path.join(attempt_dir, "part-000099.parquet"))
    ingest_run(run)
    steps, ranks, _ = read_outputs(run)
    assert steps["step"].to_list() == [1, 2, 3, 4, 5, 99]
    assert steps["eval/acc"].null_count() == 6 and steps.schema["eval/acc"] == pl.Float64


@pytest.mark.parametrize("damage", ["empty", "garbage"])
def test_an_unreadable_merged_part_gives_way_to_the_parts_it_replaces(tmp_path, monkeypatch, damage):
    """A kill between claiming a merged part's name and filling it (a filesystem without hard
    links) leaves an empty part-A-B beside the parts it was to replace: their rows are read, not lost."""
    run = make_run(tmp_path / "run", monkeypatch)
    ingest_run(run)
    want_steps, want_ranks, _ = read_outputs(run)
    parts = [p for p in part_files(run) if "rank-00001" in p]
    assert [os.path.basename(p) for p in parts] == [f"part-{i:06d}.parquet" for i in range(4)]
    merged = os.path.join(os.path.dirname(parts[0]), "part-000000-000002.parquet")  # names flushes 0..2
    with open(merged, "wb") as f:
        f.write(b"" if damage == "empty" else b"not parquet")
    with warns_each("a merged part that cannot be read", "corrupt or truncated part file") as caught:
        ingest_run(run, options=IngestOptions(force=True))
    assert any(merged in str(w.message) for w in caught)
    steps, ranks, summary = read_outputs(run)
    assert ranks.sort("rank", "step").equals(want_ranks.sort("rank", "step"))
    assert steps.drop(pl.selectors.ends_with("_ema")).equals(want_steps.drop(pl.selectors.ends_with("_ema")))
