"""Run detail preparation (heatmap, slowest ranks, memory, phases, non-finite, restarts) and export."""

import io

import numpy as np
import polars as pl
import pytest
from dash_fixtures import PHASES, write_run

from kforge_dash.browse import downloads as prep_export
from kforge_dash.browse import ranks as prep_ranks
from kforge_dash.browse.rank_metrics import phase_label
from kforge_dash.browse.series import RunSource
from kforge_dash.findings.finding import Phases, classify_phases
from kforge_dash.findings.thresholds import FindingsOptions


def _as_ingest_would(path) -> Phases:
    """The phase classes a default ingest records in summary.json (the pages read them from there)."""
    return classify_phases(pl.read_parquet_schema(path).names(), FindingsOptions())


@pytest.fixture
def run(tmp_path):
    return write_run(tmp_path, "r", n=1000, world_size=4, slow_rank=2, restart_at=600, nan_steps=(7, 300))


def test_heatmap_is_mean_step_time_per_rank_and_window(run):
    ranks = pl.read_parquet(run / "ingested" / "ranks.parquet")
    h = prep_ranks.rank_heatmap(run / "ingested" / "ranks.parquet", windows=10)
    assert h.ranks == [0, 1, 2, 3] and h.window_start == list(range(1, 1000, 100))
    assert h.window_end[-1] == 1000
    t = ranks.sort("step", "rank")["step_time_s"].to_numpy().reshape(1000, 4)
    expected = t.reshape(10, 100, 4).mean(axis=1).T  # ranks × windows
    np.testing.assert_allclose(np.array(h.z), expected, rtol=1e-12)
    rel = prep_ranks.rank_heatmap(run / "ingested" / "ranks.parquet", windows=10, relative=True)
    lower_median = np.sort(expected, axis=0)[(len(expected) - 1) // 2]  # the median rank: an actual rank's value
    np.testing.assert_allclose(np.array(rel.z), expected / lower_median, rtol=1e-12)
    assert min(rel.z[2]) > 1.3  # the straggler stands out in every window


def test_heatmap_missing_cells_are_none(tmp_path, run):
    path = tmp_path / "ranks.parquet"
    pl.read_parquet(run / "ingested" / "ranks.parquet").filter(
        ~((pl.col("rank") == 3) & (pl.col("step") <= 100))).write_parquet(path)
    h = prep_ranks.rank_heatmap(path, windows=10)
    assert h.z[3][0] is None and h.z[3][1] is not None


def test_slowest_rank_is_the_one_whose_own_work_is_longest_not_the_step_times_argmax(tmp_path):
    """Under DDP every rank waits in the collective, so step time's argmax is noise (issue 21, item 3):
    here rank 1's data phase is 40 ms longer on every step, while the step time's argmax is rank 0
    on most steps (it waits longest in fwd_bwd, a wait phase). The count follows the own work."""
    rng = np.random.default_rng(0)
    n, rows = 200, []
    for step in range(1, n + 1):
        for rank in (0, 1):
            data = 0.001 + (0.040 if rank == 1 else 0.0) + 0.0005 * rng.random()
            opt = 0.003 + 0.0005 * rng.random()
            fwd_bwd = 0.150 + (0.041 if rank == 0 else 0.0)  # rank 0 waits for rank 1 in the all-reduce
            rows.append({"step": step, "rank": rank, "step_time_s": data + fwd_bwd + opt, "time/data_s": data,
                         "time/fwd_bwd_s": fwd_bwd, "time/optimizer_s": opt,
                         "time/checkpoint_s": 0.5 if (rank == 0 and step % 50 == 0) else None})
    path = tmp_path / "ranks.parquet"
    frame = pl.DataFrame(rows)
    frame.write_parquet(path)
    by_step_time = frame.sort("step_time_s").group_by("step").agg(pl.col("rank").last())["rank"].value_counts()
    assert dict(by_step_time.iter_rows())[0] > n // 2  # the old chart's answer: rank 0
    got = prep_ranks.slowest_own_work(path, _as_ingest_would(path))
    assert got.phases == ("time/data_s", "time/optimizer_s")  # not fwd_bwd (wait), not checkpoint
    assert got.counts.rows() == [(1, n, 1.0)]
    no_own = tmp_path / "no_own.parquet"
    frame.select("step", "rank", "step_time_s", "time/fwd_bwd_s").write_parquet(no_own)
    assert prep_ranks.slowest_own_work(no_own, _as_ingest_would(no_own)) is None


def test_slowest_rank_of_the_straggler_sample_run_is_the_findings_rank(sample_runs_copy):
    """sample_runs/straggler: rank 1 sleeps 40 ms in its data phase; its straggler finding names rank 1."""
    import json

    run = sample_runs_copy / "straggler" / "ingested"
    finding = next(f for f in json.loads((run / "summary.json").read_text())["findings"] if f["kind"] == "straggler")
    got = prep_ranks.slowest_own_work(run / "ranks.parquet",
                                      Phases.from_summary(json.loads((run / "summary.json").read_text())))
    assert got.counts["rank"][0] == finding["ranks"][0] == 1 and got.counts["share"][0] > 0.9


def test_memory_per_rank_max_and_null_without_samples(tmp_path, run):
    mem = prep_ranks.memory_per_rank(run / "ingested" / "ranks.parquet")
    assert mem["max_mem_peak_bytes"].to_list() == [2**31 + r * 2**20 for r in range(4)]
    path = tmp_path / "cpu.parquet"
    pl.DataFrame({"step": [1, 1], "rank": [0, 1], "mem_peak_bytes": pl.Series([None, None], dtype=pl.Int64)}
                 ).write_parquet(path)
    assert prep_ranks.memory_per_rank(path)["max_mem_peak_bytes"].to_list() == [None, None]


def test_phase_breakdown_means_and_other(run):
    steps = pl.read_parquet(run / "ingested" / "steps.parquet")
    b = prep_ranks.phase_breakdown(run / "ingested" / "steps.parquet", windows=4)
    assert set(b["phase"]) == {*PHASES, "other"}
    first = b.filter(pl.col("window_start") == 1)
    w = steps.filter(pl.col("step") <= 250)
    for p in PHASES:
        assert first.filter(pl.col("phase") == p)["seconds"][0] == pytest.approx(w[f"time/{p}_s"].mean())
    other = (w["step_time_s"] - sum(w[f"time/{p}_s"] for p in PHASES)).mean()
    assert first.filter(pl.col("phase") == "other")["seconds"][0] == pytest.approx(other)
    totals = prep_ranks.phase_totals(run / "ingested" / "steps.parquet")
    assert totals.table["phase"][0] == "fwd_bwd" and totals.table["share"].sum() == pytest.approx(1.0)
    assert totals.note is None


def test_a_sparse_phase_counts_zero_where_it_did_not_run_and_other_is_never_negative(tmp_path):
    """A checkpoint in 2 of 100 steps (null elsewhere: not timed there) is 2 steps' worth of time,
    not a mean over its 2 steps shared out as if it ran every step (issue 21, item 2)."""
    n = 100
    path = tmp_path / "steps.parquet"
    pl.DataFrame({"step": np.arange(1, n + 1), "step_time_s": np.full(n, 1.0),
                  "time/fwd_bwd_s": np.full(n, 0.9),
                  "time/checkpoint_s": [0.1 if s in (50, 100) else None for s in range(1, n + 1)]}).write_parquet(path)
    t = prep_ranks.phase_totals(path)
    share = dict(zip(t.table["phase"], t.table["share"]))
    assert share["checkpoint"] == pytest.approx(0.2 / 100) and share["fwd_bwd"] == pytest.approx(0.9)
    assert share["other"] == pytest.approx(0.1 * 98 / 100) and sum(share.values()) == pytest.approx(1.0)
    assert dict(zip(t.table["phase"], t.table["steps_ran"]))["checkpoint"] == 2 and t.note is None
    b = prep_ranks.phase_breakdown(path, windows=1)
    assert b.filter(pl.col("phase") == "checkpoint")["seconds"][0] == pytest.approx(0.002)
    # Nested timers (a phase inside another): 'other' is clipped at 0 and the page is told why.
    pl.DataFrame({"step": [1, 2], "step_time_s": [1.0, 1.0], "time/fwd_bwd_s": [0.9, 0.9],
                  "time/allreduce_s": [0.5, 0.05]}).write_parquet(path)
    t = prep_ranks.phase_totals(path)
    share = dict(zip(t.table["phase"], t.table["share"]))
    assert min(share.values()) >= 0 and share["other"] == pytest.approx(0.05 / 2.4) and sum(share.values()) == pytest.approx(1)
    assert "1 of 2 steps" in t.note and "overlap or nest" in t.note
    assert (prep_ranks.phase_breakdown(path, windows=1)["seconds"] >= 0).all()


def test_phase_shares_of_the_straggler_sample_run_add_to_100_percent(sample_runs_copy):
    """The issue's case: checkpoint was 8.14 % of the step time and 'other' -0.48 %; 5 checkpoints
    take about 0.2 % of the run."""
    run = sample_runs_copy / "straggler" / "ingested"
    d = prep_ranks.run_detail(run / "steps.parquet", run / "ranks.parquet", {}, relative=False)
    share = dict(zip(d.phase_totals.table["phase"], d.phase_totals.table["share"]))
    assert sum(share.values()) == pytest.approx(1.0) and min(share.values()) >= 0
    assert share["checkpoint"] < 0.01
    # Independently, from ranks.parquet with pyarrow: each rank's checkpoint time over all rank-steps' time.
    import pyarrow.parquet as pq

    t = pq.read_table(run / "ranks.parquet").to_pydict()
    ckpt = sum(v for v in t["time/checkpoint_s"] if v is not None)
    assert share["checkpoint"] == pytest.approx(ckpt / sum(t["step_time_s"]), rel=0.01)


def test_nonfinite_steps_lists_nan_and_inf_not_null(tmp_path):
    path = tmp_path / "steps.parquet"
    pl.DataFrame({"step": [1, 2, 3, 4], "loss": [1.0, float("nan"), None, float("-inf")],
                  "grad_norm": [float("inf"), 1.0, 1.0, 1.0], "loss_ema": [float("nan")] * 4}).write_parquet(path)
    got = prep_ranks.nonfinite_steps(path)
    assert got.rows() == [(1, "grad_norm", "inf"), (2, "loss", "nan"), (4, "loss", "-inf")]


def test_restart_timeline(run):
    import json
    summary = json.loads((run / "ingested" / "summary.json").read_text())
    t = prep_ranks.restart_timeline(summary)
    assert t["attempt"].to_list() == [0, 1]
    assert t["first_step"].to_list() == [1, 600] and t["resumed_at_step"].to_list() == [None, 600]


def test_restart_timeline_names_a_launchs_first_folder_and_counts_the_rest():
    ids = [f"20261130T232445.{i:06d}Z-node{i}-p{100 + i}" for i in range(4096)]
    t = prep_ranks.restart_timeline({"attempts": [{"attempt": 0, "attempt_ids": ids, "start_time": 0.0},
                                                  {"attempt": 1, "attempt_ids": ids[:1], "start_time": 1.0},
                                                  {"attempt": 2, "attempt_ids": [], "start_time": 2.0}]})
    assert t["attempt_ids"].to_list() == [f"{ids[0]} (+4095 more)", ids[0], None]


def test_export_csv_and_parquet_round_trip_full_resolution(tmp_path, run):
    other = write_run(tmp_path, "other", n=30)
    pl.read_parquet(other / "ingested" / "steps.parquet").drop("eval/loss").write_parquet(
        other / "ingested" / "steps.parquet")
    srcs = [RunSource("r", run / "ingested" / "steps.parquet", {}),
            RunSource("other", other / "ingested" / "steps.parquet", {})]
    df = prep_export.selected_series(srcs, ["loss", "eval/loss"])
    assert len(df) == 1030 and df.columns == ["run", "step", "time", "tokens", "loss", "eval/loss"]
    back = pl.read_parquet(io.BytesIO(prep_export.to_parquet_bytes(df)))
    assert back.equals(df)  # NaN loss at steps 7 and 300 exported as NaN
    csv = pl.read_csv(io.BytesIO(prep_export.to_csv_bytes(df)))
    r = csv.filter(pl.col("run") == "r")
    assert np.isnan(r.filter(pl.col("step") == 7)["loss"][0])
    assert csv.filter(pl.col("run") == "other")["eval/loss"].null_count() == 30  # missing, not 0


def test_memory_bars_pick_the_first_sampled_column():
    mem = pl.DataFrame({"rank": [0, 1], "max_mem_peak_bytes": pl.Series([None, None], dtype=pl.Int64),
                        "max_mem_allocated_bytes": [5, 7]})
    assert prep_ranks.memory_bars(mem) == ([0, 1], [5, 7], "mem_allocated_bytes")
    assert prep_ranks.memory_bars(mem.drop("max_mem_allocated_bytes")) is None


def test_run_detail_names_a_damaged_file_and_works_without_ranks(tmp_path, run):
    steps = run / "ingested" / "steps.parquet"
    d = prep_ranks.run_detail(steps, tmp_path / "absent.parquet", {"attempts": []})
    assert d.heatmap is None and d.memory is None and d.slowest is None  # per-rank views need ranks.parquet
    assert not d.phase_totals.table.is_empty()  # the phases come from steps.parquet then
    bad = tmp_path / "steps.parquet"
    bad.write_bytes(steps.read_bytes()[: 2000])  # truncated
    with pytest.raises(ValueError, match=f"{bad}: cannot be read"):
        prep_ranks.run_detail(bad, tmp_path / "absent.parquet", {})


def test_phase_per_rank_with_a_phase_named_like_a_column(tmp_path):
    path = tmp_path / "ranks.parquet"
    pl.DataFrame({"step": [1, 1, 2, 2], "rank": [0, 1, 0, 1], "step_time_s": [1.0, 1.0, 3.0, 3.0],
                  "time/step_s": [0.5, 0.25, 0.5, 0.75], "time/data_s": [0.1, 0.4, 0.1, 0.6],
                  "time/step time_s": [1.0] * 4, "time/fwd_bwd_s": [0.2] * 4}).write_parquet(path)
    got = prep_ranks.phase_per_rank(path, _as_ingest_would(path))
    assert got["rank"].to_list() == [0, 1]
    # Labelled for a person (issue 21, item 8), in the column registry's words: no raw column names; a wait
    # phase says it includes waiting; a phase named "step time" is not the step time.
    assert not {"time/step_s", "time/data_s", "step_time_s"} & set(got.columns)
    assert got[phase_label("time/step_s")].to_list() == [0.5, 0.5]
    assert got[phase_label("time/data_s")].to_list() == pytest.approx([0.1, 0.5])
    assert got[phase_label("step_time_s")].to_list() == [2.0, 2.0]
    assert got[phase_label("time/step time_s")].to_list() == [1.0, 1.0]
    assert got[phase_label("time/fwd_bwd_s", waiting=True)].to_list() == [0.2, 0.2]
    assert "incl. waiting" in phase_label("time/fwd_bwd_s", waiting=True)
    metrics = prep_ranks.rank_metrics(path)
    assert metrics[0] == "step_time_s" and set(metrics) == {"step_time_s", "time/data_s", "time/step_s",
                                                            "time/step time_s", "time/fwd_bwd_s"}


def test_a_killed_launch_is_drawn_to_the_step_it_reached_with_recomputed_and_unrecorded_steps_marked():
    """Issue 27.4: SIGKILL at step 250, rows flushed to 199, resumed at 200: launch 0 was drawn ending at 199 (a
    clean hand-off) beside a table saying 51 steps were run again."""
    from kforge_dash.browse.figures import timeline_figure
    from kforge_dash.browse.launch_segments import Segment, launch_segments

    summary = {"attempts": [{"attempt": 0, "first_step": 1, "last_step": 199, "reached_step": 250, "start_time": 0.0},
                            {"attempt": 1, "first_step": 200, "last_step": 400, "reached_step": 400, "start_time": 9.0}],
               "restarts": [{"attempt": 1, "resumed_at_step": 200, "previous_last_step": 250, "superseded_steps": 51}]}
    t = prep_ranks.restart_timeline(summary)
    assert t["reached_step"].to_list() == [250, 400]
    assert launch_segments(t) == [Segment(attempt=0, kind="kept", first=1, last=199),
                                  Segment(attempt=0, kind="recomputed", first=200, last=250),
                                  Segment(attempt=1, kind="kept", first=200, last=400)]
    fig = timeline_figure(t)
    bars = [(tr.y[0], tr.base[0], tr.base[0] + tr.x[0] - 1, tr.name) for tr in fig.data]
    assert ("attempt 0", 200, 250, "recomputed") in bars and max(b[2] for b in bars if b[0] == "attempt 0") == 250
    # resumed from an older checkpoint at 240: 200-239 trained, never recorded, never redone; 240-250 run twice
    summary["restarts"][0]["resumed_at_step"] = 240
    summary["attempts"][1]["first_step"] = 240
    assert launch_segments(prep_ranks.restart_timeline(summary))[:3] == [
        Segment(attempt=0, kind="kept", first=1, last=199), Segment(attempt=0, kind="unrecorded", first=200, last=239),
        Segment(attempt=0, kind="recomputed", first=240, last=250)]
