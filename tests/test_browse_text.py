"""Sentences on the pages read as English: a count of one in the singular, no dash standing for a
value inside a sentence."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
from dash_fixtures import write_run

from kforge_dash import column_registry as reg
from kforge_dash import run_view, text
from kforge_dash.browse import series as prep_series


def test_mfu_inputs_say_unknown_rather_than_a_dash():
    line = run_view.flops_origin({"flops_per_token": None, "peak_tflops": None})
    assert line == "FLOPs/token unknown; peak TFLOPS unknown"
    line = run_view.flops_origin({"flops_per_token": 7.4e8, "flops_source": None, "peak_tflops": 989.0, "peak_source": None})
    assert line == "7.4e+08 FLOPs/token; peak 989 TFLOPS/GPU"


def test_counts_of_one_are_singular():
    assert [text.counted(n, "run") for n in (0, 1, 2)] == ["0 runs", "1 run", "2 runs"]


def test_a_single_nan_marker_does_not_say_1_such_steps(tmp_path):
    run = write_run(tmp_path, "a", n=50, nan_steps=(20,))
    src = prep_series.RunSource("a", run / "ingested" / "steps.parquet",
                                json.loads((run / "ingested" / "summary.json").read_text()))
    data = prep_series.prepare_compare([src], ["loss"], smoothing=0.0)
    (nan,) = [m for m in data.markers if m.kind == "nan"]
    assert nan.text == ["loss = nan at step 20"]
    assert pl.Series(nan.step).to_list() == [20]


def test_small_percents_keep_two_significant_digits():
    """MFU 0.0049 % read "0.0 %" (issue 27, point 5)."""
    assert [text.percent(f) for f in (4.9e-5, 0.0049, 0.1234, 0.0, 1.0, None)] == [
        "0.0049 %", "0.49 %", "12.3 %", "0.0 %", "100.0 %", text.MISSING]


def test_durations_have_one_format_small_ones_included():
    assert [text.duration(s) for s in (0.042, 0.5, 44.24, 99.9, 3725.0, None)] == [
        "0.042 s", "0.50 s", "44.2 s", "99.9 s", "1:02:05", text.MISSING]


def test_rank_lists_and_step_ranges():
    assert text.rank_list([1]) == "rank 1"
    assert text.rank_list([3, 1]) == "ranks 1, 3"
    assert text.rank_list([0, 1, 2, 3, 7, 8]) == "ranks 0–3, 7, 8"
    assert text.rank_list([]) is None
    assert (text.step_range(5), text.step_range(151, 400), text.step_range(None)) == ("step 5", "steps 151–400", None)
    assert text.counted(1024, "rank") == "1,024 ranks" and text.count(1234.0) == "1,234"


def test_the_mean_mfu_help_says_what_the_contract_says():
    """The tooltip called the mean MFU a mean of the steps' MFU (unweighted); docs/CONTRACT.md: time-weighted."""
    from pathlib import Path

    contract = (Path(__file__).resolve().parent.parent / "docs" / "CONTRACT.md").read_text()
    assert "`mean_mfu` is time-weighted" in contract
    assert reg.MFU_HELP.startswith("mean MFU: time-weighted") and "achieved MFU" in reg.MFU_HELP
    assert "mean over the ranks" in reg.LOSS_HELP


def test_the_unified_hover_has_one_row_per_run_with_raw_beside_smoothed(tmp_path):
    """8 smoothed runs gave 16 hover rows (each run's raw and smoothed line)."""
    from kforge_dash.browse import figures as prep_figures

    sources = []
    for i in range(8):
        run = write_run(tmp_path, f"r{i}", n=200, seed=i)
        sources.append(prep_series.RunSource(f"r{i}", run / "ingested" / "steps.parquet",
                                             json.loads((run / "ingested" / "summary.json").read_text())))
    for x_axis in ("step", "tokens"):
        data = prep_series.prepare_compare(sources, ["loss"], smoothing=0.9, x_axis=x_axis)
        fig = prep_figures.metric_figure(data, "loss", {s.name: "#000000" for s in sources})
        assert fig.layout.hovermode == "x unified"
        rows = [t for t in fig.data if t.mode == "lines" and t.hoverinfo != "skip"]
        assert len(rows) == 8 and all("(smoothed; raw %{customdata" in t.hovertemplate for t in rows)
        for t, s in zip(rows, [s for s in data.series if s.kind == "smoothed"]):
            raw = np.asarray(t.customdata)[:, -1]
            full = pl.read_parquet(sources[int(s.run[1:])].steps_path)
            want = dict(zip(full["step"].to_list(), full["loss"].to_list()))
            assert raw.tolist() == [want[int(st)] for st in s.step]  # the raw value at that very step
