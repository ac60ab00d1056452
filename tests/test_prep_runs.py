"""Run discovery, ingest status, path confinement, runs table and config diff."""

import json
import os
import time

import pytest
from dash_fixtures import write_run, write_shards_only

from kforge_dash.browse import runs as prep_runs
from kforge_dash.browse import runs_table
from kforge_dash.browse.runs import BROKEN, INGESTED, NOT_INGESTED, STALE, RunPathError, run_dir


@pytest.mark.parametrize("name", ["../x", "..", ".", "/etc", "/etc/passwd", "a/b", "a\\b", ".hidden", "", "x\x00y"])
def test_run_names_that_leave_the_root_are_refused(tmp_path, name):
    with pytest.raises(RunPathError):
        run_dir(tmp_path, name)


def test_symlink_out_of_the_root_is_refused_and_not_listed(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    write_run(root, "ok", n=10)
    write_run(outside, "secret", n=10)
    os.symlink(outside / "secret", root / "link")
    assert run_dir(root, "ok") == (root / "ok").resolve()
    with pytest.raises(RunPathError, match="outside the runs root"):
        run_dir(root, "link")
    assert [r.name for r in prep_runs.list_runs(root)] == ["ok"]


def test_symlinked_ingested_folder_leading_out_of_the_run_is_not_read(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    write_run(root, "ok", n=10)
    secret = write_run(outside, "secret", n=10)
    (root / "sneaky").mkdir()
    os.symlink(secret / "ingested", root / "sneaky" / "ingested")
    assert [r.name for r in prep_runs.list_runs(root)] == ["ok"]
    with pytest.raises(RunPathError, match="outside the run directory"):
        prep_runs.ingested_file(root / "sneaky", "steps.parquet")


def test_list_runs_statuses(tmp_path):
    write_run(tmp_path, "done", n=10)
    stale = write_run(tmp_path, "stale", n=10)
    shard = write_shards_only(tmp_path, "stale") / "rank-00000"
    later = time.time() + 10  # a shard written after the ingest
    for f in shard.rglob("*"):
        os.utime(f, (later, later))
    write_shards_only(tmp_path, "fresh")
    broken = write_run(tmp_path, "broken", n=10)
    (broken / "ingested" / "summary.json").write_text("{not json")
    (tmp_path / "notes").mkdir()  # neither shards nor ingest: not a run
    runs = {r.name: r for r in prep_runs.list_runs(tmp_path)}
    assert set(runs) == {"done", "stale", "fresh", "broken"}
    assert runs["done"].status == INGESTED and runs["stale"].status == STALE
    assert runs["fresh"].status == NOT_INGESTED and not runs["fresh"].ingested
    assert runs["broken"].status == BROKEN
    assert str(broken / "ingested" / "summary.json") in runs["broken"].error
    assert stale.exists()


def test_runs_table_values_come_from_the_summaries(tmp_path):
    write_run(tmp_path, "a", n=100, world_size=8, restart_at=50, tags=["x", "y"],
              warnings=["w1", "w2"], peak_mem_bytes=3 * 2**30, mean_mfu=0.41)
    write_run(tmp_path, "b", n=20, peak_mem_bytes=None, mean_mfu=None)
    write_shards_only(tmp_path, "c")
    rows = {r["run"]: r for r in runs_table.runs_table(prep_runs.list_runs(tmp_path)).iter_rows(named=True)}
    sa = json.loads((tmp_path / "a" / "ingested" / "summary.json").read_text())
    a = rows["a"]
    assert (a["steps"], a["world_size"], a["restarts"], a["warnings"], a["tags"]) == (100, 8, 1, 2, "x, y")
    assert a["peak_mem_bytes"] == 3 * 2**30 and a["mean_mfu"] == 0.41 and a["tokens"] == sa["tokens"]
    assert a["wall_time_s"] == pytest.approx(sa["wall_time_s"])
    assert a["final_loss"] == sa["final_loss"] and a["best_loss"] == sa["best_loss"]
    assert a["device"] == "NVIDIA H100 80GB HBM3"
    # Missing is null, never 0.
    assert rows["b"]["peak_mem_bytes"] is None and rows["b"]["mean_mfu"] is None
    assert rows["c"]["status"] == NOT_INGESTED and rows["c"]["steps"] is None and rows["c"]["restarts"] is None


def test_config_diff_shows_only_differing_keys(tmp_path):
    write_run(tmp_path, "a", n=5, hparams={"lr": 3e-4, "bs": 8, "opt": {"beta2": 0.95, "eps": 1e-8}}, tags=["t"])
    write_run(tmp_path, "b", n=5, hparams={"lr": 1e-3, "bs": 8, "opt": {"beta2": 0.99, "eps": 1e-8}, "warm": 10}, tags=["t"])
    write_run(tmp_path, "c", n=5, hparams={"lr": 3e-4, "bs": 8, "opt": {"beta2": 0.95, "eps": 1e-8}}, tags=["t"])
    runs = {r.name: r for r in prep_runs.list_runs(tmp_path)}
    diff = prep_runs.config_diff([runs["a"], runs["b"]])
    assert diff.columns == ["key", "a", "b"]
    got = {r["key"]: (r["a"], r["b"]) for r in diff.iter_rows(named=True)}
    assert got == {"hparams.lr": ("0.0003", "0.001"), "hparams.opt.beta2": ("0.95", "0.99"), "hparams.warm": (None, "10")}
    assert prep_runs.config_diff([runs["a"], runs["c"]]).is_empty()


def test_filter_runs_by_name_and_tag_and_stable_colours(tmp_path):
    write_run(tmp_path, "baseline-1", n=5, tags=["sweep"])
    write_run(tmp_path, "moe-1", n=5, tags=["moe", "sweep"])
    write_run(tmp_path, "other", n=5)
    runs = prep_runs.list_runs(tmp_path)
    names = lambda rs: [r.name for r in rs]  # noqa: E731
    assert names(prep_runs.filter_runs(runs, query="BASE")) == ["baseline-1"]
    assert names(prep_runs.filter_runs(runs, query="moe")) == ["moe-1"]  # by tag text too
    assert names(prep_runs.filter_runs(runs, tags=["sweep"])) == ["baseline-1", "moe-1"]
    colours = prep_runs.run_colours(prep_runs.claim_order(runs))
    assert len(set(colours.values())) == 3
    assert prep_runs.run_colours(prep_runs.claim_order(list(reversed(runs)))) == colours  # the runs' order, not the list's


def test_load_summary_errors_name_the_file(tmp_path):
    p = tmp_path / "summary.json"
    p.write_text("[1, 2]")
    with pytest.raises(ValueError, match=f"{p}: expected a JSON object"):
        prep_runs.load_summary(p)
    with pytest.raises(ValueError, match="cannot be read"):
        prep_runs.load_summary(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="is not a directory"):
        prep_runs.list_runs(tmp_path / "nope")


def test_selectable_keeps_selected_runs_hidden_by_a_search():
    assert prep_runs.selectable(["a"], ["b", "gone", "a"], ["a", "b", "c"]) == ["a", "b"]


def test_a_new_part_file_makes_an_ingested_run_stale(tmp_path):
    run = write_run(tmp_path, "r", n=10)
    attempt = write_shards_only(tmp_path / "other", "r").parent  # a shard layout to move in
    summary = run / "ingested" / "summary.json"
    os.utime(summary, (time.time() - 100, time.time() - 100))
    os.rename(attempt / "r" / "rank-00000", run / "rank-00000")
    (rank_attempt,) = (run / "rank-00000").iterdir()
    old = time.time() - 200
    for p in (run / "rank-00000", rank_attempt, rank_attempt / "meta.json"):
        os.utime(p, (old, old))
    assert prep_runs.list_runs(tmp_path)[0].status == INGESTED
    (rank_attempt / ".part-000000.parquet.tmp").write_bytes(b"x")  # written, then renamed in
    os.rename(rank_attempt / ".part-000000.parquet.tmp", rank_attempt / "part-000000.parquet")
    assert prep_runs.list_runs(tmp_path)[0].status == STALE


def test_runs_table_columns_say_once_what_every_run_shares(tmp_path):
    write_run(tmp_path, "a", n=20, tags=["x"])
    write_run(tmp_path, "b", n=20)
    runs = prep_runs.list_runs(tmp_path)
    table = runs_table.runs_table(runs)
    shown = runs_table.table_columns(table)
    assert shown[:4] == ["run", "findings", "warnings", "goodput.fraction"]  # on screen whatever the width
    assert "status" not in shown and "device" not in shown and "tags" in shown
    assert runs_table.runs_table_note(table) == "Every run: ingested · device NVIDIA H100 80GB HBM3"
    runs[1].status = prep_runs.STALE
    assert "status" in runs_table.table_columns(runs_table.runs_table(runs))
