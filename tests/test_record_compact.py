"""The recorder merges its part files as the run goes (kforge_record/compact.py): a bounded number
of files per rank, merged contents equal to the parts they replace, and a SIGKILL at any point of
a merge loses and duplicates nothing that ingest reads."""

import json
import os
import shutil
import subprocess
import sys

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from ingest_fixtures import close_all, flush_all, open_ranks, read_outputs, run_steps
from polars.testing import assert_frame_equal

import kforge_dash.ingest.inputs.shards as shards
import kforge_record.compact as compact
from kforge_dash.ingest.options import IngestOptions
from kforge_dash.ingest.run import ingest_run
from kforge_record import Recorder
from kforge_record.schema import PARQUET_META_KEY, live_parts, part_span

CHILD = os.path.join(os.path.dirname(__file__), "record_child.py")


def attempt_dir(run):
    (d,) = [os.path.dirname(p) for p in map(str, run.glob("rank-*/*/meta.json"))]
    return d


def parquet_files(d):
    return sorted(n for n in os.listdir(d) if n.endswith(".parquet"))


def rows_of(d, names):
    """Every row of the part files ``names`` in order, one table (columns a part lacks null)."""
    tables = [pq.read_table(os.path.join(d, n)) for n in names]
    return pa.concat_tables([t.replace_schema_metadata(None) for t in tables], promote_options="default")


def test_a_rank_folder_holds_at_most_20_files_after_200_flushes(tmp_path):
    rec = Recorder(tmp_path / "run", rank=0, world_size=1, flush_every_steps=1, install_sigterm_handler=False)
    d = attempt_dir(tmp_path / "run")
    most = 0
    for step in range(1, 201):
        rec.end_step(step, loss=1.0 / step, tokens=8)
        rec.flush()  # returns once the part is written and the merges it made due are done
        most = max(most, len(parquet_files(d)))
    rec.close()
    assert most <= 20
    assert parquet_files(d) == ["part-000000-000099.parquet", "part-000100-000199.parquet"]
    assert rows_of(d, parquet_files(d)).column("step").to_pylist() == list(range(1, 201))


def test_the_tiers_bound_files_and_rewrites_over_10000_flushes(monkeypatch, tmp_path):
    """The real tiering over 10,000 flushes, with each merge's disk work stubbed out: the folder
    holds at most 40 files at any time, and no row is rewritten more than MAX_TIER times."""
    files: dict[str, int] = {}  # name -> times its rows were rewritten

    def fake_merge(self, group):
        rewrites = max(files.pop(p.name) for p in group) + 1
        merged = compact.Part(f"part-{group[0].first:06d}-{group[-1].last:06d}.parquet", group[0].first,
                              group[-1].last, tuple(n for p in group for n in p.flush_rows))
        files[merged.name] = rewrites
        return merged

    monkeypatch.setattr(compact.Compactor, "_merge", fake_merge)
    c = compact.Compactor(str(tmp_path), warn=None)
    most = 0
    for i in range(10_000):
        files[f"part-{i:06d}.parquet"] = 0
        c.part_written(i, 100)
        most = max(most, len(files))
    assert most <= 40 and max(files.values()) == compact.MAX_TIER
    assert sorted(files) == [f"part-{i:06d}-{i + 999:06d}.parquet" for i in range(0, 10_000, 1000)]


def test_merged_parts_hold_exactly_the_rows_of_the_parts_they_replace(tmp_path, monkeypatch):
    run, live = tmp_path / "plain", tmp_path / "live"
    # The same rows twice: unmerged, and merged by the writer thread as it goes (the default).
    recs = {0: open_ranks(str(run), 1, flush_every_steps=1, merge_parts=False)[0],
            1: open_ranks(str(live), 1, flush_every_steps=1)[0]}

    def vals(r, s):  # a scalar that appears mid-run, NaN, a missing value, a log row for an earlier step
        return {"loss": float("nan") if s == 7 else 1.0 / s, "tokens": None if s == 3 else 16,
                **({"moe/aux": s * 0.5} if s > 40 else {})}
    clock = run_steps(monkeypatch, recs, range(1, 31), step_time=lambda r, s: 0.1, values=vals, flush_every=1)
    for rec in recs.values():
        rec.log(12, **{"eval/loss": 2.5})
        rec.flush()
    run_steps(monkeypatch, recs, range(31, 111), step_time=lambda r, s: 0.2, values=vals, flush_every=1, clock=clock)
    close_all(recs)
    d = attempt_dir(run)
    plain = parquet_files(d)
    assert len(plain) == 111
    by_writer = attempt_dir(live)
    assert parquet_files(by_writer) == ["part-000000-000099.parquet", "part-000100-000109.parquet", "part-000110.parquet"]
    assert_frame_equal(pl.from_arrow(rows_of(by_writer, parquet_files(by_writer))).drop("time"),
                       pl.from_arrow(rows_of(d, plain)).drop("time"), check_exact=True)
    # And merged from the files on disk (what a writer does with a flush too big to keep).
    merged_run = tmp_path / "merged"
    shutil.copytree(run, merged_run)
    md = attempt_dir(merged_run)
    c = compact.Compactor(md, warn=None)
    for name in plain:  # what the writer thread does after each part it wrote
        c.part_written(part_span(name).first, pq.read_metadata(os.path.join(md, name)).num_rows)
    assert parquet_files(md) == ["part-000000-000099.parquet", "part-000100-000109.parquet", "part-000110.parquet"]
    assert pq.read_metadata(os.path.join(md, "part-000000-000099.parquet")).num_row_groups == 1
    assert_frame_equal(pl.from_arrow(rows_of(md, parquet_files(md))), pl.from_arrow(rows_of(d, plain)), check_exact=True)
    kv = json.loads(pq.read_schema(os.path.join(md, "part-000100-000109.parquet")).metadata[PARQUET_META_KEY])
    assert kv["replaces"] == [f"part-{i:06d}.parquet" for i in range(100, 110)] and kv["flush_rows"] == [1] * 10
    # Ingest reads the same run from either layout.
    ingest_run(run)
    ingest_run(merged_run)
    a, b = read_outputs(str(run)), read_outputs(str(merged_run))
    assert_frame_equal(a[0], b[0], check_exact=True)
    assert_frame_equal(a[1], b[1], check_exact=True)
    assert b[1].filter(pl.col("step") == 12)["eval/loss"].to_list() == [2.5]


def test_a_reader_keeps_the_merged_part_while_the_replaced_ones_are_still_there():
    names = ["part-000000.parquet", "part-000003.parquet", "part-000000-000009.parquet", "part-000010.parquet",
             "part-000005-000007.parquet", "part-000000-000099.parquet", "part-000100.parquet", "part-notours.parquet"]
    assert live_parts(names) == ["part-000000-000099.parquet", "part-000100.parquet", "part-notours.parquet"]
    assert live_parts(["part-000000.parquet", "part-000001.parquet"]) == ["part-000000.parquet", "part-000001.parquet"]


# Kill points of a merge of ten 1-row parts (compact.Compactor._point): 1-10 temp file being
# written, 11 written, 12 published with all inputs left, 13-22 after each input deleted. The
# first tier-1 merge is at points 1-22 (flush 10), the tier-2 merge at 221-242 (flush 100).
KILL_POINTS = [1, 6, 11, 12, 13, 18, 22, 34, 221, 232, 233, 240]


def _kill_at(run, point):
    env = dict(os.environ, **{compact.KILL_AT_ENV: str(point)})
    args = [sys.executable, CHILD, str(run), "flush-each", "steps=400", "sleep=0", "flush_every_steps=1"]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


RESUMED_STEPS = 5
ROW_COLUMNS = ["step", "loss", "lr", "tokens"]


def test_sigkill_at_every_point_of_a_merge_loses_and_duplicates_nothing(tmp_path):
    """Kills at many points of a merge; then the job resumes (a new attempt folder of the same
    rank), whose recorder removes what the kill left (kforge_record/leftovers.py): the killed
    folder's files are bounded again, and ingest reads exactly the rows of an unkilled run."""
    runs = {k: tmp_path / f"kill{k}" for k in KILL_POINTS}
    states, cleaned = set(), set()
    unkilled = _unkilled_rows(tmp_path / "unkilled", 400 + RESUMED_STEPS)
    for batch in range(0, len(KILL_POINTS), 4):  # four children at a time: the machine is small
        procs = {k: _kill_at(runs[k], k) for k in KILL_POINTS[batch:batch + 4]}
        for k, proc in procs.items():
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == -9, f"kill point {k} never reached: {err}"
            flushed = max((int(line.split()[1]) for line in out.splitlines() if line.startswith("flushed ")), default=0)
            last = max(int(line.split()[1]) for line in out.splitlines() if line.startswith("step "))
            d = attempt_dir(runs[k])
            states.add(_state(d))
            steps, ranks, summary = _ingested(runs[k])
            got = ranks["step"].to_list()
            # Nothing a returned flush() wrote is lost, nothing is there twice, nothing made up.
            assert got == list(range(1, len(got) + 1)) and flushed <= len(got) <= last, (k, flushed, last, os.listdir(d))
            assert ranks["loss"].to_list() == [1.0 / s for s in got]
            assert steps["step"].to_list() == got
            # The job resumes after its last step on disk; its recorder cleans the killed folder.
            _resume(runs[k], len(got) + 1)
            cleaned.add(_state(d))
            parts = [n for n in os.listdir(d) if n.endswith(".parquet")]
            assert sorted(parts) == live_parts(parts) and len(parts) <= 20, (k, parts)
            steps, ranks, _ = _ingested(runs[k])
            n = len(got) + RESUMED_STEPS
            assert_frame_equal(ranks.select(ROW_COLUMNS), unkilled[1].head(n), check_exact=True)
            assert_frame_equal(steps.select(ROW_COLUMNS), unkilled[0].head(n), check_exact=True)
    # The kills met every kind of state a merge leaves behind, and the clean-up left none.
    assert states >= {("temp file left", "clean"), ("no temp", "replaced parts left"), ("no temp", "clean")}
    assert cleaned == {("no temp", "clean")}


def _state(d):
    names = os.listdir(d)
    parts = [n for n in names if n.endswith(".parquet")]
    return ("temp file left" if any(n.endswith(".tmp") for n in names) else "no temp",
            "replaced parts left" if len(parts) > len(live_parts(parts)) else "clean")


def _step_values(step):  # what record_child.py records at each step
    return {"loss": 1.0 / step, "lr": 1e-3, "tokens": 128}


def _resume(run, first):
    rec = Recorder(run, rank=0, world_size=1, install_sigterm_handler=False)
    for step in range(first, first + RESUMED_STEPS):
        rec.end_step(step, **_step_values(step))
    rec.close()


def _unkilled_rows(run, n):
    rec = Recorder(run, rank=0, world_size=1, install_sigterm_handler=False)
    for step in range(1, n + 1):
        rec.end_step(step, **_step_values(step))
    rec.close()
    steps, ranks, _ = _ingested(run)
    return steps.select(ROW_COLUMNS), ranks.select(ROW_COLUMNS)


def _ingested(run):
    ingest_run(run)
    return read_outputs(str(run))


def test_ingest_lists_again_when_a_part_is_merged_under_it(tmp_path, monkeypatch):
    run = tmp_path / "run"
    recs = open_ranks(str(run), 2, flush_every_steps=2, merge_parts=False)
    run_steps(monkeypatch, recs, range(1, 21), step_time=lambda r, s: 0.1, flush_every=2)
    flush_all(recs)
    want = ingest_run(run, options=IngestOptions(force=True)).summary
    real = shards.stat_inputs
    merged = []

    def stat_then_merge(listing):  # the recorder merges right after ingest listed the folders
        out = real(listing)
        if not merged:
            for af in listing:
                c = compact.Compactor(af.dir, warn=None)
                for p in af.parts:
                    c.part_written(part_span(os.path.basename(p)).first, pq.read_metadata(p).num_rows)
            merged.append(True)
        return out

    monkeypatch.setattr(shards, "stat_inputs", stat_then_merge)
    got = ingest_run(run, options=IngestOptions(force=True)).summary
    close_all(recs)
    assert merged and parquet_files(attempt_dir_of(run, 0)) == ["part-000000-000009.parquet"]
    assert got["steps"] == want["steps"] == 20 and got["ranks"] == [0, 1]
    assert not [w for w in got["warnings"] if "part" in w]
    assert read_outputs(str(run))[1].height == 40


def attempt_dir_of(run, rank):
    (d,) = [os.path.dirname(p) for p in map(str, run.glob(f"rank-{rank:05d}/*/meta.json"))]
    return d


@pytest.mark.parametrize("merge_parts", ["yes", 1])
def test_merge_parts_must_be_a_bool(tmp_path, merge_parts):
    with pytest.raises(TypeError, match="merge_parts"):
        Recorder(tmp_path / "r", rank=0, world_size=1, merge_parts=merge_parts, install_sigterm_handler=False)


def test_the_contract_checker_accepts_merged_parts_and_checks_their_flush_rows(tmp_path):
    from kforge_record.check import check_run

    rec = Recorder(tmp_path / "run", rank=0, world_size=1, flush_every_steps=1, install_sigterm_handler=False)
    for step in range(1, 13):
        rec.end_step(step, loss=1.0, tokens=8)
        rec.flush()
    rec.close()
    d = attempt_dir(tmp_path / "run")
    assert parquet_files(d) == ["part-000000-000009.parquet", "part-000010.parquet", "part-000011.parquet"]
    assert check_run(tmp_path / "run") == []
    t = pq.read_table(os.path.join(d, "part-000000-000009.parquet"))
    kv = json.loads(t.schema.metadata[PARQUET_META_KEY])
    kv["flush_rows"] = kv["flush_rows"][:-1]  # one flush short
    pq.write_table(t.replace_schema_metadata({PARQUET_META_KEY: json.dumps(kv)}), os.path.join(d, "part-000000-000009.parquet"))
    (problem,) = check_run(tmp_path / "run")
    assert "part-000000-000009.parquet" in problem and "flush_rows" in problem


def test_parts_around_a_skipped_flush_index_are_not_merged(tmp_path):
    """A part name taken by another writer makes the writer skip an index (writer.py): a merged
    name spanning it would hide that file from readers, so such a group stays unmerged."""
    import pyarrow as pa

    d = str(tmp_path)
    indexes = [0, 1, 2, 3, 4, 6, 7, 8, 9, 10] + list(range(11, 21))
    c = compact.Compactor(d, warn=None)
    for i in indexes:
        t = pa.table({"step": pa.array([i], pa.int64())})
        pq.write_table(t, os.path.join(d, f"part-{i:06d}.parquet"))
        c.part_written(i, 1, t)
    assert parquet_files(d) == [f"part-{i:06d}.parquet" for i in indexes[:10]] + ["part-000011-000020.parquet"]
