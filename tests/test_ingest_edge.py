"""Edge cases found in review: log rows vs restarts, rollbacks inside one attempt, log-only
windows, stray attempt folders, export fallbacks. Shards come from the real Recorder."""

import os

import polars as pl
import pytest
from ingest_fixtures import close_all, open_ranks, read_outputs, run_steps

import kforge_dash.ingest.run as ingest_mod
from kforge_dash.ingest.options import IngestOptions, IngestWarning
from kforge_dash.ingest.run import ingest_run
from kforge_dash.pipeline import ingest_path


def test_a_window_of_log_rows_only_is_ingested(tmp_path, monkeypatch):
    run = str(tmp_path / "logtail")
    recs = open_ranks(run, 1, flush_every_steps=1000)
    run_steps(monkeypatch, recs, range(1, 11), step_time=lambda r, s: 1.0,
              values=lambda r, s: {"loss": float(s), "tokens": 10}, flush_every=5)
    recs[0].log(11, eval_loss=0.5)  # a final eval, past the last ended step: its own part file
    close_all(recs)
    ingest_run(run, options=IngestOptions(chunk_rows=5))  # windows [1,6) [6,11) [11,12): the last holds the log row only
    steps, ranks, summary = read_outputs(run)
    assert steps["step"].to_list() == list(range(1, 12))
    last = steps.row(10, named=True)
    assert last["eval_loss"] == 0.5 and last["step_time_s"] is None and last["tokens"] is None
    assert steps["eval_loss"].null_count() == 10
    assert summary["tokens"] == 10 * 10 and summary["wall_time_s"] == 10 * 1.0
    assert ranks.height == 11


def test_a_run_of_log_rows_only_is_ingested(tmp_path, monkeypatch):
    run = str(tmp_path / "logonly")
    recs = open_ranks(run, 1)
    recs[0].log(10, eval_loss=1.5)  # e.g. an eval-only process
    close_all(recs)
    ingest_run(run)
    steps, _, summary = read_outputs(run)
    assert steps["step"].to_list() == [10] and steps["eval_loss"].to_list() == [1.5]
    assert summary["tokens"] is None and summary["wall_time_s"] is None


def test_an_unexpected_error_in_one_run_does_not_stop_the_others(tmp_path, monkeypatch):
    root = tmp_path / "root"
    for name in ("a", "b"):
        recs = open_ranks(str(root / name), 1)
        run_steps(monkeypatch, recs, range(1, 6), step_time=lambda r, s: 1.0)
        close_all(recs)
    real = ingest_mod._ingest_locked

    def buggy(run_dir, *a):  # a bug of ours that run "a" hits
        if run_dir == str(root / "a"):
            raise TypeError("'>=' not supported between instances of 'NoneType' and 'int'")
        return real(run_dir, *a)

    monkeypatch.setattr(ingest_mod, "_ingest_locked", buggy)
    out = ingest_path(str(root), tensorboard=False, wandb=False)
    by_name = {os.path.basename(r.run_dir): r for r in out}
    assert by_name["b"].summary["steps"] == 5
    err = by_name["a"].error
    assert str(root / "a") in err and "TypeError" in err and "NoneType" in err


def _two_launches(run, monkeypatch, *, log0=None, log1=None):
    """Launch 0 ends steps 1..20 (loss = step), launch 1 ends 21..30 (loss = 100 + step); each may
    first call Recorder.log(step, **scalars) with ``log0``/``log1`` = (step, scalars)."""
    a0 = open_ranks(run, 1)
    if log0:
        a0[0].log(log0[0], **log0[1])
    clock = run_steps(monkeypatch, a0, range(1, 21), step_time=lambda r, s: 1.0,
                      values=lambda r, s: {"loss": float(s), "tokens": 10})
    close_all(a0)
    a1 = open_ranks(run, 1)
    if log1:
        a1[0].log(log1[0], **log1[1])
    run_steps(monkeypatch, a1, range(21, 31), step_time=lambda r, s: 2.0,
              values=lambda r, s: {"loss": 100.0 + s, "tokens": 10}, clock=clock)
    close_all(a1)


def _check_no_step_lost(steps, summary):
    ended = steps.filter(pl.col("step_time_s").is_not_null())
    assert ended["step"].to_list() == list(range(1, 31))
    assert ended["attempt"].to_list() == [0] * 20 + [1] * 10
    assert ended["loss"].to_list() == [float(s) for s in range(1, 21)] + [100.0 + s for s in range(21, 31)]
    assert summary["tokens"] == 30 * 10 and summary["wall_time_s"] == 20 * 1.0 + 10 * 2.0
    assert summary["restarts"] == [{"attempt": 1, "resumed_at_step": 21, "previous_last_step": 20,
                                    "superseded_steps": 0, "time": summary["attempts"][1]["start_time"]}]


def test_an_eval_logged_at_the_resume_step_does_not_supersede_it(tmp_path, monkeypatch):
    run = str(tmp_path / "resume_eval")
    _two_launches(run, monkeypatch, log1=(20, {"eval/loss": 0.5}))  # eval of the checkpoint at 20
    ingest_run(run)
    steps, ranks, summary = read_outputs(run)
    _check_no_step_lost(steps, summary)
    assert steps.height == 30 and ranks.height == 30
    row = steps.row(19, named=True)
    assert (row["step"], row["attempt"], row["loss"], row["eval/loss"]) == (20, 0, 20.0, 0.5)


def test_a_log_at_step_0_of_every_launch_does_not_drop_earlier_launches(tmp_path, monkeypatch):
    run = str(tmp_path / "log0")
    _two_launches(run, monkeypatch, log0=(0, {"setup/params_m": 7.0}), log1=(0, {"setup/params_m": 8.0}))
    with pytest.warns(IngestWarning, match="'setup/params_m' logged with different values"):
        ingest_run(run)
    steps, ranks, summary = read_outputs(run)
    _check_no_step_lost(steps, summary)
    assert steps["step"].to_list() == list(range(0, 31)) and ranks.height == 31
    assert steps.row(0, named=True)["setup/params_m"] == 8.0  # the later launch's value
    assert [(a["first_step"], a["last_step"]) for a in summary["attempts"]] == [(1, 20), (21, 30)]


@pytest.mark.parametrize("chunk_rows", [4_000_000, 5])
def test_an_in_process_rollback_keeps_the_last_row_of_each_step(tmp_path, monkeypatch, chunk_rows):
    """Steps 1..10, then the process reloads the checkpoint of step 5 and redoes 6..12."""
    run = str(tmp_path / "rollback")
    recs = open_ranks(run, 2)
    calls = {0: 0, 1: 0}  # per rank: end_step calls so far (the first 10 are the first pass)

    def values(r, s):
        calls[r] += 1
        return {"loss": (0.0 if calls[r] <= 10 else 100.0) + s, "tokens": 10}

    # step_time is asked just before values, so calls[r] still counts the earlier steps there
    run_steps(monkeypatch, recs, list(range(1, 11)) + list(range(6, 13)), values=values,
              step_time=lambda r, s: 1.0 if calls[r] < 10 else 2.0)
    close_all(recs)
    with pytest.warns(IngestWarning, match="5 steps recorded more than once"):
        out = ingest_path(run, tensorboard=True, wandb=False, chunk_rows=chunk_rows)[0]
    steps, ranks, summary = read_outputs(run)
    assert steps["step"].to_list() == list(range(1, 13))
    assert steps["loss"].to_list() == [float(s) for s in range(1, 6)] + [100.0 + s for s in range(6, 13)]
    assert steps["tokens"].to_list() == [20] * 12 and summary["tokens"] == 12 * 20
    assert steps["step_time_s"].to_list() == [1.0] * 5 + [2.0] * 7 and summary["wall_time_s"] == 5 + 7 * 2.0
    assert ranks.height == 24 and steps["n_ranks"].to_list() == [2] * 12
    for r in (0, 1):
        assert ranks.filter(pl.col("rank") == r)["step"].to_list() == list(range(1, 13))
        assert sum(w == f"rank {r}: 5 steps recorded more than once in attempt 0; the last kept"
                   for w in summary["warnings"]) == 1
    assert out.summary["exports"]["tensorboard"]["ok"] is True  # steps strictly increase


def test_a_rollback_that_redoes_only_some_steps_is_put_back_in_step_order(tmp_path, monkeypatch):
    run = str(tmp_path / "partial")
    recs = open_ranks(run, 1)
    n = [0]

    def values(r, s):
        n[0] += 1
        return {"loss": (0.0 if n[0] <= 10 else 100.0) + s, "tokens": 10}

    run_steps(monkeypatch, recs, list(range(1, 11)) + [3, 4, 5], step_time=lambda r, s: 1.0, values=values)
    close_all(recs)
    with pytest.warns(IngestWarning, match="3 steps recorded more than once"):
        ingest_run(run)
    steps, ranks, summary = read_outputs(run)
    want = [100.0 + s if s in (3, 4, 5) else float(s) for s in range(1, 11)]
    assert steps["loss"].to_list() == want and ranks["loss"].to_list() == want
    assert ranks["step"].to_list() == list(range(1, 11)) and summary["tokens"] == 100
    assert "rank 0: 3 steps recorded more than once in attempt 0; the last kept" in summary["warnings"]


def _small_run(run, monkeypatch, world=2):
    recs = open_ranks(run, world)
    run_steps(monkeypatch, recs, range(1, 6), step_time=lambda r, s: 1.0,
              values=lambda r, s: {"loss": float(s), "tokens": 10})
    close_all(recs)
    return run


def test_a_stray_folder_under_a_rank_is_not_an_attempt(tmp_path, monkeypatch):
    run = _small_run(str(tmp_path / "stray"), monkeypatch)
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


def test_an_unknown_start_is_none_and_ordered_last_by_attempt_id(tmp_path, monkeypatch):
    import dataclasses

    from kforge_dash.ingest import shards as shards
    from kforge_dash.ingest.launches import group_launches

    run = str(tmp_path / "starts")
    for _ in range(3):  # three launches of one rank
        _small_run(run, monkeypatch, world=1)
    w = []
    got = [shards.read_attempt(af, w) for af in shards.list_attempts(run, w)]
    assert all(a.start_time is not None for a in got) and not w
    # the two later launches lose their start: they follow the known one, by attempt id
    unknown = [dataclasses.replace(a, start_time=None) for a in got[1:]]
    launches = group_launches([unknown[1], got[0], unknown[0]], w)
    assert [[a.attempt_id for a in L.attempts] for L in launches] == [[a.attempt_id] for a in got]


def test_a_missing_meta_says_tokens_are_assumed_counted(tmp_path, monkeypatch):
    run = _small_run(str(tmp_path / "nometa"), monkeypatch)
    d = os.path.join(run, "rank-00001")
    meta = os.path.join(d, os.listdir(d)[0], "meta.json")
    os.remove(meta)
    with pytest.warns(IngestWarning, match="meta.json: missing"):
        ingest_run(run)
    steps, _, summary = read_outputs(run)
    assert steps["tokens"].to_list() == [20] * 5  # rank 1's tokens still counted
    said = [w for w in summary["warnings"] if meta in w]
    assert len(said) == 1 and "missing" in said[0] and "assumed counts_tokens=True" in said[0]


class _RaisingExporter:
    """An exporter with a bug of its own: it raises instead of reporting an outcome."""

    needs = None

    def __init__(self, name):
        self.name = name

    def export(self, history):
        raise RuntimeError("boom")


@pytest.mark.parametrize("how", ["raises", "unavailable"])
@pytest.mark.parametrize("asked", [{"tensorboard": True, "wandb": False, "upload": False},
                                   {"tensorboard": False, "wandb": False, "upload": True}])
def test_export_fallbacks_have_the_shape_of_export_result(tmp_path, monkeypatch, how, asked):
    import sys

    from kforge_dash.export.exporters import choose_exporters
    from kforge_dash.export.run import ExporterOutcome, ExportResult

    run = _small_run(str(tmp_path / "run"), monkeypatch)
    exporters = choose_exporters(**asked)
    if how == "raises":
        exporters = [_RaisingExporter(x.name) for x in exporters]
        error = "RuntimeError: boom"
    else:  # the exporters' packages are not installed
        for mod in ("tensorboard.compat.proto.event_pb2", "tensorboard.summary.writer.record_writer", "wandb"):
            monkeypatch.setitem(sys.modules, mod, None)
        error = None
    out = ingest_path(run, exporters=exporters)[0]
    # what ExportResult.to_dict gives when every asked-for exporter failed
    bad = ExporterOutcome(ok=False, error="x")
    wandb = asked["wandb"] or asked["upload"]
    want = ExportResult(run_dir=run, tensorboard=bad if asked["tensorboard"] else None, wandb=bad if wandb else None,
                        upload=bad if asked["upload"] else None).to_dict()
    got = read_outputs(run)[2]["exports"]
    assert got == out.summary["exports"]
    assert got.keys() == want.keys()
    for k, v in want.items():
        if v is None:
            assert got[k] is None
        else:
            assert got[k].keys() == v.keys() and got[k]["ok"] is False and got[k]["path"] is None
            if error:
                assert got[k]["error"] == error
            elif k == "upload":
                assert got[k]["error"] == "not run: the wandb export failed"
            else:
                assert "pip install 'kforge[ingest]'" in got[k]["error"]


def test_ranks_parquet_order_is_as_documented(tmp_path, monkeypatch):
    """docs/CONTRACT.md: by window, then attempt, then rank, then step (here: one window)."""
    run = str(tmp_path / "order")
    a0 = open_ranks(run, 2)
    clock = run_steps(monkeypatch, a0, range(1, 31), step_time=lambda r, s: 1.0)
    for rec in a0.values():
        rec.flush()
    a1 = open_ranks(run, 2)  # resumes at 21
    run_steps(monkeypatch, a1, range(21, 41), step_time=lambda r, s: 1.0, clock=clock)
    close_all(a1)
    close_all(a0)
    ingest_run(run)
    _, ranks, _ = read_outputs(run)
    want = [(0, r, s) for r in (0, 1) for s in range(1, 21)] + [(1, r, s) for r in (0, 1) for s in range(21, 41)]
    assert list(zip(ranks["attempt"], ranks["rank"], ranks["step"])) == want
