"""Run detail preparation (heatmap, slowest ranks, memory, phases, non-finite, restarts) and export."""

import io

import numpy as np
import polars as pl
import pytest
from dash_fixtures import PHASES, write_run

from kforge_dash.browse import downloads as prep_export
from kforge_dash.browse import ranks as prep_ranks
from kforge_dash.browse.series import RunSource


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
    np.testing.assert_allclose(np.array(rel.z), expected / np.median(expected, axis=0), rtol=1e-12)
    assert min(rel.z[2]) > 1.3  # the straggler stands out in every window


def test_heatmap_missing_cells_are_none(tmp_path, run):
    path = tmp_path / "ranks.parquet"
    pl.read_parquet(run / "ingested" / "ranks.parquet").filter(
        ~((pl.col("rank") == 3) & (pl.col("step") <= 100))).write_parquet(path)
    h = prep_ranks.rank_heatmap(path, windows=10)
    assert h.z[3][0] is None and h.z[3][1] is not None


def test_slowest_rank_counts(run):
    steps = pl.read_parquet(run / "ingested" / "steps.parquet")
    got = prep_ranks.slowest_rank_counts(run / "ingested" / "steps.parquet")
    counts = np.bincount(steps["slowest_rank"].to_numpy(), minlength=4)
    assert dict(zip(got["rank"], got["steps_slowest"])) == {r: c for r, c in enumerate(counts) if c}
    assert got["rank"][0] == 2 and got["share"].sum() == pytest.approx(1.0)


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
    totals = prep_ranks.phase_totals(b)
    assert totals["phase"][0] == "fwd_bwd" and totals["share"].sum() == pytest.approx(1.0)


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
    assert d.heatmap is None and d.memory is None and not d.slowest.is_empty()
    bad = tmp_path / "steps.parquet"
    bad.write_bytes(steps.read_bytes()[: 2000])  # truncated
    with pytest.raises(ValueError, match=f"{bad}: cannot be read"):
        prep_ranks.run_detail(bad, tmp_path / "absent.parquet", {})


def test_phase_per_rank_with_a_phase_named_like_a_column(tmp_path):
    path = tmp_path / "ranks.parquet"
    pl.DataFrame({"step": [1, 1, 2, 2], "rank": [0, 1, 0, 1], "step_time_s": [1.0, 1.0, 3.0, 3.0],
                  "time/step_s": [0.5, 0.25, 0.5, 0.75], "time/data_s": [0.1, 0.4, 0.1, 0.6]}).write_parquet(path)
    got = prep_ranks.phase_per_rank(path)
    assert got["rank"].to_list() == [0, 1]
    assert got["time/step_s"].to_list() == [0.5, 0.5]
    assert got["time/data_s"].to_list() == pytest.approx([0.1, 0.5])
    assert got["step_time_s"].to_list() == [2.0, 2.0]
    metrics = prep_ranks.rank_metrics(path)
    assert metrics[0] == "step_time_s" and set(metrics) == {"step_time_s", "time/data_s", "time/step_s"}
