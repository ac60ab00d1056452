"""The y axis of a line chart whose series is constant sits around its value, not around 0: plotly
pads a flat line by ±1, so lr = 1e-3 was drawn on an axis from -1 to 1 and read as "lr = 0"."""

from __future__ import annotations

import json

import plotly.io
import polars as pl
from dash_fixtures import write_run

from kforge_dash.browse import figures as prep_figures
from kforge_dash.browse import series as prep_series


def _source(tmp_path, name: str, lr) -> prep_series.RunSource:
    run = write_run(tmp_path, name, n=200)
    steps = run / "ingested" / "steps.parquet"
    pl.read_parquet(steps).with_columns(lr=lr).write_parquet(steps)
    return prep_series.RunSource(name, steps, json.loads((run / "ingested" / "summary.json").read_text()))


def _y_range(fig) -> list[float] | None:
    """The y range as the browser gets it (the figure's JSON), None when plotly picks its own."""
    return json.loads(plotly.io.to_json(fig))["layout"].get("yaxis", {}).get("range")


def test_a_constant_series_is_drawn_around_its_value(tmp_path):
    data = prep_series.prepare_compare([_source(tmp_path, "a", pl.lit(1e-3))], ["lr", "loss"], smoothing=0.6)
    lo, hi = _y_range(prep_figures.metric_figure(data, "lr", {"a": "#0072B2"}))
    assert lo < 1e-3 < hi and lo > 0  # the value on the axis, 0 not
    lo, hi = _y_range(prep_figures.metric_figure(data, "lr", {"a": "#0072B2"}, log_y=True))
    assert lo < -3 < hi  # log10(1e-3) on a log axis
    assert _y_range(prep_figures.metric_figure(data, "loss", {"a": "#0072B2"})) is None  # a moving one: plotly's own


def test_two_runs_at_different_constants_keep_plotly_range(tmp_path):
    data = prep_series.prepare_compare([_source(tmp_path, "a", pl.lit(1e-3)), _source(tmp_path, "b", pl.lit(3e-3))],
                                       ["lr"], smoothing=0.0)
    assert _y_range(prep_figures.metric_figure(data, "lr", {"a": "#0072B2", "b": "#E69F00"})) is None
