"""The dashboard's plain preparation: per-series smoothing, zoom re-query, restart gaps,
groups with bands, stable colours, units, Markdown escaping, MFU inputs and the MLP kind."""

import json
import re

import numpy as np
import plotly.io
import polars as pl
import pytest
from dash_fixtures import write_run
from reference_math import ema_loop

from kforge_dash import run_view, text
from kforge_dash.browse import figures as prep_figures
from kforge_dash.browse import groups as prep_groups
from kforge_dash.browse import runs as prep_runs
from kforge_dash.browse import tables, zoom
from kforge_dash.browse.series import RunSource, StepRange, prepare_compare


def _source(tmp_path, name="r", summary=None, *, step=None, time=None, **cols):
    n = len(next(iter(cols.values())))
    step = np.arange(1, n + 1, dtype=np.int64) if step is None else step
    time = 1.7e9 + step.astype(np.float64) if time is None else time
    path = tmp_path / f"{name}.parquet"
    pl.DataFrame({"step": step, "time": time, **cols}).write_parquet(path)
    return RunSource(name, path, summary or {})


def test_a_sparse_eval_series_is_not_smoothed_into_a_wrong_last_value(tmp_path):
    n = 5000
    step = np.arange(1, n + 1)
    loss = 2.6 + 2.0 * np.exp(-step / 800.0)
    evals = pl.Series(np.where(step % 100 == 0, loss, np.nan)).fill_nan(None)  # every 100 steps, null between
    src = _source(tmp_path, loss=loss, **{"eval/loss": evals})
    data = prepare_compare([src], ["loss", "eval/loss"], smoothing=0.6)
    kinds = {(s.metric, s.kind) for s in data.series}
    assert ("loss", "smoothed") in kinds and ("eval/loss", "smoothed") not in kinds  # 0.6**100: nothing to see
    (ev,) = [s for s in data.series if s.metric == "eval/loss"]
    assert ev.step[-1] == 5000 and ev.y[-1] == pytest.approx(loss[-1])  # its true last value
    # A heavier weight spans the same number of steps whatever the interval: weight**100 per point.
    data = prepare_compare([src], ["eval/loss"], smoothing=0.99)
    smooth = next(s for s in data.series if s.kind == "smoothed")
    ref = ema_loop(loss[99::100].tolist(), 1 - 0.99**100)
    np.testing.assert_allclose(smooth.y, ref, rtol=1e-12)


def test_a_series_of_a_few_points_is_never_smoothed(tmp_path):
    data = prepare_compare([_source(tmp_path, loss=np.array([5.0, 1.0, 4.0, 2.0, 3.0]))], ["loss"], smoothing=0.9)
    assert [s.kind for s in data.series] == ["raw"]


def test_zoom_rereads_the_range_at_full_resolution(tmp_path):
    n, s = 1_000_000, 654_321
    rng = np.random.default_rng(3)
    loss = 3.0 - np.linspace(0, 1, n) + 0.01 * rng.standard_normal(n)
    loss[s - 1], loss[s + 2] = 10.0, 9.0  # two spikes 3 steps apart: one bin of the whole-run drawing
    src = _source(tmp_path, loss=loss)
    whole = prepare_compare([src], ["loss"], smoothing=0.6)
    raw = next(x for x in whole.series if x.kind == "raw")
    assert 10.0 in raw.y and 9.0 not in raw.y  # the second spike is not drawn at this scale
    zoomed = prepare_compare([src], ["loss"], smoothing=0.6, step_range=StepRange(s - 400, s + 400))
    raw_z = next(x for x in zoomed.series if x.kind == "raw")
    assert raw_z.step.tolist() == list(range(s - 400, s + 401))  # every recorded step of the range (< DEFAULT_POINTS)
    assert 10.0 in raw_z.y and 9.0 in raw_z.y
    # The smoothed line in the zoom is the whole run's EMA at those steps (smoothed before the cut).
    full = next(x for x in prepare_compare([src], ["loss"], smoothing=0.6, max_points=None).series
                if x.kind == "smoothed")
    smooth_z = next(x for x in zoomed.series if x.kind == "smoothed")
    np.testing.assert_array_equal(smooth_z.y, full.y[s - 401:s + 400])
    with pytest.raises(ValueError, match="first must be <= last"):
        StepRange(5, 4)


def test_box_on_a_time_axis_maps_to_the_steps_drawn_inside_it(tmp_path):
    src = _source(tmp_path, loss=np.arange(100.0))
    data = prepare_compare([src], ["loss"], x_axis="wall time")
    x = data.series[0].x
    box = (str(x[10]).replace("T", " "), str(x[19]).replace("T", " "))  # plotly sends dates as text
    assert zoom.step_range_from_box(data.series, *box) == StepRange(11, 20)
    assert zoom.step_range_from_steps(10.4, 19.6) == StepRange(11, 19)
    assert zoom.zoom_from_inputs(None, None) is None and zoom.zoom_from_inputs(5, None).first == 5


def test_time_axes_break_the_line_over_a_restart_downtime(tmp_path):
    n = 40
    time = 1.7e9 + np.arange(n, dtype=np.float64)
    time[20:] += 3600.0  # an hour down before step 21
    summary = {"restarts": [{"attempt": 1, "resumed_at_step": 21}]}
    src = _source(tmp_path, summary=summary, time=time, loss=np.linspace(3, 2, n))
    (on_time,) = prepare_compare([src], ["loss"], x_axis="time since start").series
    gap = np.flatnonzero(np.isnan(on_time.y))
    assert gap.tolist() == [20] and on_time.step[21] == 21  # one break, just before the restart
    spec = json.loads(plotly.io.to_json(prep_figures.metric_figure(
        prepare_compare([src], ["loss"], x_axis="time since start"), "loss", {})))
    assert spec["data"][0]["connectgaps"] is False
    (on_step,) = prepare_compare([src], ["loss"], x_axis="step").series
    assert np.isfinite(on_step.y).all()  # no downtime on the step axis


def test_groups_by_name_pattern_tag_and_hparam_with_bands(tmp_path):
    for name, seed, lr in (("a-seed1", 1, 3e-4), ("a-seed2", 2, 3e-4), ("a-seed3", 3, 3e-4), ("b-seed1", 4, 1e-3)):
        write_run(tmp_path, name, n=200, seed=seed, hparams={"lr": lr}, tags=["sweep", name[0]])
    runs = prep_runs.list_runs(tmp_path)
    srcs = [r.source() for r in runs]
    by = prep_groups.GroupBy("name pattern", prep_groups.DEFAULT_PATTERN)
    assert prep_groups.group_runs(srcs, by) == {"a": ["a-seed1", "a-seed2", "a-seed3"], "b": ["b-seed1"]}
    assert list(prep_groups.group_runs(srcs, prep_groups.GroupBy("hparam", "lr"))) == ["lr=0.0003", "lr=0.001"]
    assert list(prep_groups.group_runs(srcs, prep_groups.GroupBy("tag"))) == ["a, sweep", "b, sweep"]
    data = prep_groups.prepare_groups(srcs, ["loss"], by)
    band = next(b for b in data.bands if b.group == "a")
    losses = np.stack([pl.read_parquet(tmp_path / n / "ingested" / "steps.parquet")["loss"].to_numpy()
                       for n in band.runs])
    assert band.step.tolist() == list(range(1, 201))
    np.testing.assert_allclose(band.mean, losses.mean(axis=0))
    np.testing.assert_allclose(band.lo, losses.min(axis=0))
    np.testing.assert_allclose(band.hi, losses.max(axis=0))
    std = prep_groups.prepare_groups(srcs, ["loss"], by, band="±std").bands[0]
    np.testing.assert_allclose(std.hi - std.mean, losses.std(axis=0), rtol=1e-9)
    spec = json.loads(plotly.io.to_json(prep_figures.group_figure(data, "loss", {"a": "#1f77b4"})))
    assert [t.get("fill") for t in spec["data"][:3]] == [None, "tonexty", None]
    with pytest.raises(ValueError, match="not a regular expression"):
        prep_groups.GroupBy("name pattern", "(")


def test_a_run_keeps_its_colour_when_runs_are_added():
    names = [f"run-{i:03d}" for i in range(len(prep_runs.PALETTE))]
    before = prep_runs.run_colours(names)
    assert len(set(before.values())) == len(names)  # distinct while the palette lasts
    for extra in ("zz-new", "aa-new", "run-000-copy"):
        after = prep_runs.run_colours(names + [extra])
        assert {n: after[n] for n in names} == before
    # Removing other runs does not move a run either, unless it had lost a clash to one of them.
    assert prep_runs.run_colours(names[:1]) == {names[0]: before[names[0]]}


def test_landing_selection_is_the_most_recent_runs(tmp_path):
    for i in range(10):
        write_run(tmp_path, f"r{i}", n=5)
        p = tmp_path / f"r{i}" / "ingested" / "summary.json"
        s = json.loads(p.read_text())
        s["attempts"][0]["start_time"] = 1000.0 + (i * 7) % 10  # not in name order
        p.write_text(json.dumps(s))
    runs = prep_runs.list_runs(tmp_path)
    got = prep_runs.recent_runs(runs, 3)
    starts = {r.name: r.summary["attempts"][0]["start_time"] for r in runs}
    assert got == sorted(starts, key=starts.get, reverse=True)[:3]


def test_units_a_person_reads():
    assert text.hms(3 * 3600 + 25 * 60 + 46.4) == "3:25:46" and text.hms(None) == "—"
    assert text.percent(0.4123) == "41.2 %" and text.percent(float("nan")) == "—"
    assert text.gib(3 * 2**30) == "3.00 GiB" and text.number(None) == "—"
    assert run_view.device_label({"device": {"type": "cpu", "name": "x86_64"}, "world_size": 2}) == "CPU ×2"
    assert run_view.device_label({"device": {"type": "cuda", "name": "NVIDIA H100"}, "world_size": 8}) == "NVIDIA H100 ×8"
    s = {"flops_per_token": 7.4e8, "flops_source": "6*n_params+12*L*D*S", "peak_tflops": 989.0,
         "peak_source": "table: NVIDIA H100 80GB HBM3 (https://x)"}
    assert run_view.flops_origin(s) == ("7.4e+08 FLOPs/token from 6*n_params+12*L*D*S; "
                                     "peak 989 TFLOPS/GPU from table: NVIDIA H100 80GB HBM3 (https://x)")
    spec = json.loads(plotly.io.to_json(prep_figures.metric_figure(
        prepare_compare([], []), "mfu", {})))
    assert spec["layout"]["yaxis"]["tickformat"] == ".1%" and spec["layout"]["hovermode"] == "x unified"


@pytest.mark.parametrize("name", ["![pix](https:evil.invalid)", "**bold** _x_", "<img src=x onerror=1>",
                                  "$x^2$ :red[r]", "a\n# heading", "`code`", "user@host https://e.invalid"])
def test_md_text_escapes_everything_markdown_acts_on(name):
    out = text.md_text(name)
    # Nothing Markdown acts on is left bare: each such character is preceded by a backslash.
    bare = [c for i, c in enumerate(out) if c in "![]()*_<>$`#:@" and (i == 0 or out[i - 1] != "\\")
            and c not in "()"]
    assert bare == [] and "\n" not in out
    assert re.sub(r"\\(.)", r"\1", out) == name.replace("\n", " ")


def test_plotly_text_is_escaped_and_image_export_is_configured():
    assert prep_figures.text("<b>x</b>") == "&lt;b&gt;x&lt;/b&gt;"
    cfg = prep_figures.chart_config("eval/loss", image_format="svg")
    assert cfg["toImageButtonOptions"] == {"format": "svg", "filename": "kforge-eval_loss", "scale": 2}
    with pytest.raises(ValueError, match="image format"):
        prep_figures.chart_config("loss", image_format="gif")


def test_gelu_mlp_counts_two_matrices_and_a_bad_kind_is_refused():
    from kforge_dash.ingest.inputs.flops import flops_per_token
    from kforge_record.model import ModelSpec

    gpt2 = dict(n_layers=12, dim=768, n_heads=12, n_kv_heads=12, ffn_hidden_dim=3072, vocab_size=50257, seq_len=1024)
    swiglu, src = flops_per_token(gpt2)
    gelu, src_g = flops_per_token({**gpt2, "mlp": "gelu"})
    assert swiglu - gelu == 6 * 12 * 768 * 3072  # one D×F matrix per layer, 6 FLOPs per weight
    assert src == "shape (dense): 6*P_active+12*L*D*S" and "gelu MLP" in src_g
    assert flops_per_token({**gpt2, "mlp": "swiglu"})[0] == swiglu
    with pytest.raises(ValueError, match="mlp must be one of"):
        ModelSpec.from_dict({**gpt2, "mlp": "relu"})


def test_missing_cells_read_as_a_dash_and_still_sort_as_numbers():
    rows = [{"run": "a", "mem": 2.5, "steps": 10}, {"run": "b", "mem": None, "steps": 9}, {"run": "c", "mem": 12.25, "steps": 8}]
    out = tables.with_missing_as_dash(rows, {"mem": "{:.2f} GiB".format, "steps": "{:,}".format})
    assert [r["mem"] for r in out] == [" 2.50 GiB", "—", "12.25 GiB"] and [r["steps"] for r in out] == [10, 9, 8]
    assert sorted(r["mem"] for r in out if r["mem"] != "—") == [" 2.50 GiB", "12.25 GiB"]  # as 2.5 < 12.25
    frame = tables.frame_missing_as_dash(pl.DataFrame({"rank": [0, 1], "t": [0.5, None]}))
    assert frame["t"].to_list() == ["0.5", "—"] and frame["rank"].dtype == pl.Int64
