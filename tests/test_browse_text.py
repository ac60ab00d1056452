"""Sentences on the pages read as English: a count of one in the singular, no dash standing for a
value inside a sentence."""

from __future__ import annotations

import json

import polars as pl
from dash_fixtures import write_run

from kforge_dash import text
from kforge_dash.browse import series as prep_series


def test_mfu_inputs_say_unknown_rather_than_a_dash():
    line = text.flops_origin({"flops_per_token": None, "peak_tflops": None})
    assert line == "FLOPs/token unknown; peak TFLOPS unknown"
    line = text.flops_origin({"flops_per_token": 7.4e8, "flops_source": None, "peak_tflops": 989.0, "peak_source": None})
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
