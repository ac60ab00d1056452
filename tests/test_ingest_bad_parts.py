"""One bad part file (truncated, garbage, a corrupt page behind a good footer, a null step, a NUL in a
column name, an unreadable merged part) is skipped with a warning naming it; every other row is kept.
A foreign part with an untyped column is read."""

import os

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from ingest_fixtures import part_files, read_outputs, warns_each
from parts_fixtures import make_run, read_outputs_by_path, rewrite_part

from kforge_dash.ingest.options import IngestOptions, IngestWarning
from kforge_dash.ingest.run import ingest_run


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


@pytest.mark.parametrize("statistics", [True, False])
def test_a_part_with_a_null_step_is_skipped_with_a_warning_naming_it(tmp_path, monkeypatch, statistics):
    run = make_run(tmp_path / "run", monkeypatch, world=1)
    victim = sorted(part_files(run))[1]  # steps 6..10

    def null_step(t):
        steps = t.column("step").to_pylist()
        steps[2] = None
        return t.set_column(t.schema.get_field_index("step"), "step", pa.array(steps, pa.int64()))

    rewrite_part(victim, null_step, write_statistics=statistics)
    with pytest.warns(IngestWarning, match="have no step"):
        res = ingest_run(run)
    steps, ranks, summary = read_outputs_by_path(run)
    assert steps["step"].to_list() == [*range(1, 6), *range(11, 21)]
    assert steps["loss"].to_list() == [float(s) for s in [*range(1, 6), *range(11, 21)]]
    [warning] = [w for w in summary["warnings"] if victim in w]
    assert "no step" in warning and "skipped" in warning
    assert res.summary["steps"] == 15


def test_a_nul_in_a_column_name_skips_that_part_with_a_warning(tmp_path, monkeypatch):
    run = make_run(tmp_path / "run", monkeypatch, world=1)
    victim = sorted(part_files(run))[3]  # steps 16..20
    rewrite_part(victim, lambda t: t.append_column("eval\x00loss", pa.array([1.0] * t.num_rows)))
    with warns_each("NUL", "steps 16–20 were trained but not recorded"):  # its heartbeat got to step 20
        res = ingest_run(run)
    assert res.summary["last_step"] == 15
    [warning] = [w for w in res.summary["warnings"] if victim in w]
    assert "NUL" in warning


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
