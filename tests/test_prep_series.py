"""Compare-view preparation: downsampling keeps spikes, smoothing precedes it, x-axis conversions."""

import json

import numpy as np
import plotly.io
import polars as pl
import pytest
from reference_math import ema_loop as _ema

from kforge_dash.browse import figures as prep_figures
from kforge_dash.browse import series as prep_series
from kforge_dash.browse.series import RunSource, downsample_indices, prepare_compare

N_BIG = 1_000_000


def _write_steps(path, **cols):
    n = len(next(iter(cols.values())))
    base = {"step": np.arange(1, n + 1, dtype=np.int64), "time": 1.7e9 + np.arange(n, dtype=np.float64)}
    pl.DataFrame({**base, **cols}).write_parquet(path)
    return path


def _source(tmp_path, name="r", summary=None, **cols):
    return RunSource(name, _write_steps(tmp_path / f"{name}.parquet", **cols), summary or {})



# Not the first or last point: LTTB keeps both endpoints whatever they hold.
@pytest.mark.parametrize("pos", [1, 2, 123_457, 500_000, N_BIG - 3, N_BIG - 2])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_single_step_spike_in_1m_points_survives_downsampling(pos, sign):
    rng = np.random.default_rng(pos)
    y = 2.0 + 0.05 * rng.standard_normal(N_BIG)
    assert pos not in set(downsample_indices(y, 2000).tolist())  # without the spike, that point is dropped ...
    y[pos] = 2.0 + sign * 50.0
    idx = downsample_indices(y, 2000)
    assert len(idx) <= 2000
    assert pos in set(idx.tolist())  # ... so it is kept for the spike


def test_spike_survives_end_to_end_and_only_default_points_drawn(tmp_path):
    rng = np.random.default_rng(7)
    loss = 3.0 - np.linspace(0, 1, N_BIG) + 0.01 * rng.standard_normal(N_BIG)
    loss[654_321] = 40.0  # step 654_322
    src = _source(tmp_path, loss=loss)
    data = prepare_compare([src], ["loss"], smoothing=0.0)
    (raw,) = data.series
    assert raw.kind == "raw" and len(raw.x) <= prep_series.DEFAULT_POINTS and raw.n_total == N_BIG
    i = int(np.argmax(raw.y))
    assert raw.step[i] == 654_322 and raw.y[i] == 40.0
    # Every drawn point is an exact sample of the full series (not an average).
    np.testing.assert_array_equal(raw.y, loss[raw.step - 1])


def test_landing_chart_stays_under_its_point_and_byte_budget(tmp_path):
    """The landing page's cost in the browser is drawing (benchmarks/bench_dash_browser.py): a chart of
    8 runs, raw + smoothed, holds at most 16,000 line points (1,000 per line) and ~420 kB of JSON (2,000 per line: 840 kB)."""
    rng = np.random.default_rng(3)
    n = 200_000
    srcs = [_source(tmp_path, f"run{i}", loss=2.0 + 0.1 * rng.standard_normal(n)) for i in range(8)]
    data = prepare_compare(srcs, ["loss"], smoothing=0.6)
    assert len(data.series) == 16 and all(len(s.x) <= 1000 for s in data.series)
    fig = prep_figures.metric_figure(data, "loss", {}, select_zoom=True)
    lines = [t for t in fig.data if t.mode == "lines"]
    assert sum(len(t.y) for t in lines) <= 16_000
    # The smoothed line carries each point's raw value too (customdata: one hover row per run, raw beside it)
    assert len(plotly.io.to_json(fig, validate=False)) <= 430_000


def test_smoothing_is_applied_at_full_resolution_before_downsampling(tmp_path):
    n = 200_000
    rng = np.random.default_rng(1)
    loss = 2.0 + rng.standard_normal(n)  # heavy noise: smoothing the drawn subset would differ a lot
    loss[[10, 5000]] = np.nan
    loss[77_777] = np.inf
    src = _source(tmp_path, loss=loss)
    data = prepare_compare([src], ["loss"], smoothing=0.9, max_points=500)
    smooth = next(s for s in data.series if s.kind == "smoothed")
    expected = np.array(_ema(loss.tolist(), 0.1))
    assert len(smooth.x) <= 500
    np.testing.assert_allclose(smooth.y, expected[smooth.step - 1], rtol=1e-12)
    # Smoothing the downsampled raw points instead would give something else entirely.
    raw = next(s for s in data.series if s.kind == "raw")
    after = np.array(_ema(raw.y.tolist(), 0.1))
    assert np.max(np.abs(after - smooth.y)) > 0.1


def test_smoothing_matches_ingest_ema_on_contract_alpha(tmp_path):
    loss = [None, 5.0, float("nan"), 3.0, None, 1.0, float("inf"), 2.0] * 2
    src = _source(tmp_path, loss=pl.Series(loss, dtype=pl.Float64))
    data = prepare_compare([src], ["loss"], smoothing=0.9)
    smooth = next(s for s in data.series if s.kind == "smoothed")
    ref = _ema(loss, 0.1)
    # Nulls are "not reported": no point is drawn for them; non-finite steps hold the EMA.
    assert smooth.step.tolist() == [2, 3, 4, 6, 7, 8, 10, 11, 12, 14, 15, 16]
    assert smooth.y.tolist() == pytest.approx([ref[s - 1] for s in smooth.step])


def test_x_axis_conversions(tmp_path):
    tokens = pl.Series([None, 100, 100, None, 250, 50], dtype=pl.Int64)
    time = [1000.0, 1001.5, 1003.0, 1010.0, 1011.0, 1012.25]
    summary = {"attempts": [{"attempt": 0, "start_time": 999.0}, {"attempt": 1, "start_time": 1005.0}]}
    path = tmp_path / "s.parquet"
    pl.DataFrame({"step": [1, 2, 3, 4, 5, 6], "time": time, "tokens": tokens,
                  "loss": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]}).write_parquet(path)
    src = RunSource("r", path, summary)

    def x_of(axis):
        data = prepare_compare([src], ["loss"], x_axis=axis)
        (s,) = data.series
        return s.step.tolist(), list(s.x)

    steps, x = x_of("step")
    assert steps == [1, 2, 3, 4, 5, 6] and x == steps
    # Tokens: cumulative global tokens; an unknown count keeps the previous total, and steps
    # before the first known count have no position on this axis.
    steps, x = x_of("tokens")
    assert steps == [2, 3, 4, 5, 6] and x == [100, 200, 200, 450, 500]
    steps, x = x_of("wall time")
    assert [np.datetime64(v, "us").astype("int64") for v in x] == [round(t * 1e6) for t in time]
    steps, x = x_of("time since start")  # from the first launch's start, restarts included
    assert x == pytest.approx([t - 999.0 for t in time])


def test_tokens_axis_without_any_tokens_is_a_note_not_zeros(tmp_path):
    src = _source(tmp_path, loss=np.ones(5), tokens=pl.Series([None] * 5, dtype=pl.Int64))
    data = prepare_compare([src], ["loss"], x_axis="tokens")
    assert data.series == [] and any("no token counts" in n for n in data.notes)


def test_nonfinite_and_restart_markers(tmp_path):
    loss = np.array([4.0, 3.0, np.nan, 2.5, np.inf, 2.0, -np.inf, 1.5])
    summary = {"restarts": [{"attempt": 1, "resumed_at_step": 6, "previous_last_step": 7, "superseded_steps": 2}]}
    src = _source(tmp_path, summary=summary, loss=loss)
    data = prepare_compare([src], ["loss"])
    by_kind = {m.kind: m for m in data.markers}
    assert by_kind["nan"].step.tolist() == [3] and by_kind["nan"].y.tolist() == [3.0]
    assert by_kind["inf"].step.tolist() == [5] and by_kind["inf"].y.tolist() == [2.5]
    assert by_kind["-inf"].step.tolist() == [7]
    assert by_kind["restart"].step.tolist() == [6] and "resumed at step 6" in by_kind["restart"].text[0]
    # The drawn line itself holds only finite values; the markers carry the rest.
    (raw,) = data.series
    assert np.isfinite(raw.y).all() and raw.step.tolist() == [1, 2, 4, 6, 8]


def test_missing_metric_is_a_note_and_bad_arguments_are_refused(tmp_path):
    src = _source(tmp_path, loss=np.ones(3))
    data = prepare_compare([src], ["loss", "mfu"])
    assert [s.metric for s in data.series] == ["loss"] and data.notes == ["no mfu in r"]
    with pytest.raises(ValueError, match="x axis 'epoch'"):
        prepare_compare([src], ["loss"], x_axis="epoch")
    with pytest.raises(ValueError, match="smoothing"):
        prepare_compare([src], ["loss"], smoothing=1.0)


def test_unreadable_steps_file_names_the_file(tmp_path):
    bad = tmp_path / "steps.parquet"
    bad.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(ValueError, match=str(bad)):
        prepare_compare([RunSource("r", bad, {})], ["loss"])


def test_available_metrics_core_first_and_no_bookkeeping():
    schema = pl.Schema({"step": pl.Int64, "time": pl.Float64, "slowest_rank": pl.Int64, "loss": pl.Float64,
                        "loss_ema": pl.Float64, "eval/loss": pl.Float64, "mfu": pl.Float64,
                        "tokens": pl.Int64, "time/data_s": pl.Float64})
    assert prep_series.available_metrics([schema]) == ["loss", "mfu", "eval/loss", "time/data_s"]


def test_metric_figure_hover_markers_and_colours(tmp_path):
    loss = np.array([4.0, np.nan, 3.0, 2.0] * 5)
    summary = {"restarts": [{"attempt": 1, "resumed_at_step": 3}]}
    data = prepare_compare([_source(tmp_path, summary=summary, loss=loss)], ["loss"], smoothing=0.5)
    fig = prep_figures.metric_figure(data, "loss", {"r": "#123456"}, log_y=True)
    spec = json.loads(plotly.io.to_json(fig))
    lines = [t for t in spec["data"] if t["mode"] == "lines"]
    assert {t["line"]["color"] for t in lines} == {"#123456"}
    hovered = [t for t in lines if t.get("hoverinfo") != "skip"]  # one row per run: the faint raw line takes none
    assert len(hovered) == 1 and len(lines) == 2
    assert all("%{y:.8g}" in t["hovertemplate"] and "step %{x}" in t["hovertemplate"] and "raw" in t["hovertemplate"]
               for t in hovered)
    symbols = {t["marker"]["symbol"] for t in spec["data"] if t["mode"] == "markers"}
    assert symbols == {"x", "diamond"}
    assert spec["layout"]["yaxis"]["type"] == "log"
    assert [s["x0"] for s in spec["layout"]["shapes"]] == [3]


def test_all_null_metric_draws_nothing_and_says_so(tmp_path):
    src = _source(tmp_path, loss=np.ones(4), mem_peak_bytes=pl.Series([None] * 4, dtype=pl.Int64))
    data = prepare_compare([src], ["loss", "mem_peak_bytes"])
    assert [s.metric for s in data.series] == ["loss"]
    assert data.notes == ["no mem_peak_bytes in r"]


def test_unsorted_steps_file_is_smoothed_in_step_order(tmp_path):
    path = tmp_path / "s.parquet"
    order = [3, 1, 2, 6, 5, 4, 9, 7, 8, 12, 10, 11]
    pl.DataFrame({"step": order, "time": [float(s) for s in order], "loss": [10.0 * s for s in order]}).write_parquet(path)
    data = prepare_compare([RunSource("r", path, {})], ["loss"], smoothing=0.5)
    smooth = next(s for s in data.series if s.kind == "smoothed")
    assert smooth.step.tolist() == list(range(1, 13)) and smooth.y.tolist() == _ema([10.0 * s for s in range(1, 13)], 0.5)


def test_lr_and_memory_are_not_smoothed(tmp_path):
    src = _source(tmp_path, loss=np.arange(20.0), lr=np.arange(20.0), mem_peak_bytes=np.arange(20))
    data = prepare_compare([src], ["loss", "lr", "mem_peak_bytes"], smoothing=0.5)
    assert sorted((s.metric, s.kind) for s in data.series) == [
        ("loss", "raw"), ("loss", "smoothed"), ("lr", "raw"), ("mem_peak_bytes", "raw")]


def test_a_diverged_run_draws_capped_markers_but_counts_every_nan(tmp_path):
    loss = np.ones(10_000)
    loss[3000:] = np.nan
    data = prepare_compare([_source(tmp_path, loss=loss)], ["loss"])
    (m,) = data.markers
    assert m.count == 7000 and len(m.step) == prep_series.MAX_MARKERS
    assert m.step[0] == 3001 and m.step[-1] == 10_000
    assert data.nonfinite_lines() == ["r: loss is nan at 7000 step(s), first at step 3001"]


def test_user_scalars_ending_in_ema_are_metrics_but_derived_emas_are_not():
    schema = pl.Schema({"step": pl.Int64, "loss": pl.Float64, "loss_ema": pl.Float64, "weights_ema": pl.Float64})
    got = prep_series.available_metrics([schema])
    assert "weights_ema" in got and "loss_ema" not in got and "loss" in got
