"""The landing (compare) page's defaults and bad input: plain functions and Streamlit's AppTest."""

import colorsys
import itertools
import json
import re
from pathlib import Path

import plotly.io
import polars as pl
import pytest
from chart_specs import chart_elements
from dash_fixtures import copy_and_ingest_sample_runs, lab, shown, write_run
from streamlit.testing.v1 import AppTest

from kforge_dash.browse import columns as prep_columns
from kforge_dash.browse import figures as prep_figures
from kforge_dash.browse import groups as prep_groups
from kforge_dash.browse import overlap as prep_overlap
from kforge_dash.browse import runs as prep_runs
from kforge_dash.browse import series as prep_series
from kforge_dash.browse import zoom as prep_zoom

APP = Path(__file__).resolve().parent.parent / "kforge_dash" / "browse" / "app.py"


@pytest.fixture(scope="module")
def sample_root(tmp_path_factory):
    return copy_and_ingest_sample_runs(tmp_path_factory.mktemp("landing") / "runs")


def _app(root, monkeypatch, **params):
    monkeypatch.setenv("KFORGE_DASH_ROOT", str(root))
    at = AppTest.from_file(str(APP), default_timeout=300)
    at.query_params.update(params)
    return at


def _texts(at) -> str:
    return "\n".join(shown(e.value) for kind in ("caption", "info", "warning", "error", "markdown")
                     for e in at.get(kind))


# -- palette ----------------------------------------------------------------------------------------


def test_palette_has_twelve_and_more_colours_far_apart_and_no_two_greys():
    pal = prep_runs.PALETTE
    assert len(pal) >= 12
    sat = [colorsys.rgb_to_hsv(*(int(c[i:i + 2], 16) / 255 for i in (1, 3, 5)))[1] for c in pal]
    assert sum(s < 0.25 for s in sat) <= 1, dict(zip(pal, sat))
    dist = min(sum((a - b) ** 2 for a, b in zip(lab(x), lab(y))) ** 0.5 for x, y in itertools.combinations(pal, 2))
    assert dist >= 15, dist
    styles = prep_runs.run_styles([f"r{i}" for i in range(3 * len(pal))])
    assert len({(s.colour, s.dash) for s in styles.values()}) == 3 * len(pal)  # rounds past the palette are dashed


# -- default metrics ----------------------------------------------------------------------------------


def test_metrics_with_values_reads_the_footer_and_skips_all_null_columns(tmp_path):
    path = tmp_path / "steps.parquet"
    pl.DataFrame({"step": [1, 2, 3], "loss": [1.0, None, 2.0],
                  "mem_peak_bytes": pl.Series([None] * 3, dtype=pl.Int64)}).write_parquet(path)
    assert prep_columns.metrics_with_values(path) == {"step", "loss"}
    assert prep_columns.default_metrics(["loss", "mem_peak_bytes", "grad_norm"], {"loss", "grad_norm"}) == ["loss",
                                                                                                        "grad_norm"]
    (tmp_path / "bad.parquet").write_text("not parquet")
    with pytest.raises(ValueError, match="bad.parquet: not a readable Parquet file"):
        prep_columns.metrics_with_values(tmp_path / "bad.parquet")


def test_landing_selects_only_metrics_some_selected_run_has(sample_root, monkeypatch):
    at = _app(sample_root, monkeypatch).run()
    assert not at.exception
    metrics = at.multiselect(key="metrics").value
    # CPU sample runs record no memory: no chart for it, and no "no mem_peak_bytes in …" note either.
    assert "mem_peak_bytes" not in metrics and {"loss", "grad_norm", "lr"} <= set(metrics)
    assert "no mem_peak_bytes" not in _texts(at)


# -- group-by default ---------------------------------------------------------------------------------


def test_default_hparam_key_differs_between_the_runs():
    same = {"batch_size": 16}
    runs = [{"hparams": {**same, "lr": lr, "seed": s, "opt": {"beta": b}}}
            for lr, s, b in ((1e-3, 1, 0.9), (1e-3, 2, 0.9), (3e-3, 3, 0.95), (3e-3, 4, 0.95), (1e-2, 5, 0.9))]
    assert prep_groups.hparam_keys(runs) == ["batch_size", "lr", "opt.beta", "seed"]
    assert prep_groups.default_hparam_key(runs) == "lr"  # 3 groups of 5 runs; seed would make 5 groups of one
    assert prep_groups.default_hparam_key(runs[:2]) == "seed"  # the only key that differs
    assert prep_groups.default_hparam_key([{"hparams": same}] * 2) == "batch_size"
    assert prep_groups.default_hparam_key([{}]) is None


def test_group_by_hparam_opens_on_a_key_that_splits_the_sample_runs(sample_root, monkeypatch):
    at = _app(sample_root, monkeypatch, group_by="hparam").run()
    assert not at.exception
    key = at.selectbox(key="group_key").value
    values = {json.dumps(json.loads((p / "ingested" / "summary.json").read_text())["hparams"].get(key))
              for p in sample_root.iterdir() if (p / "ingested").is_dir()}
    assert len(values) >= 2, (key, values)  # not batch_size, which every sample run shares


# -- URL steps -----------------------------------------------------------------------------------------


def test_step_param_clamps_or_ignores_what_no_input_holds():
    assert prep_zoom.step_param("step_to", "120") == prep_zoom.StepParam(120)
    assert prep_zoom.step_param("step_to", "1e3") == prep_zoom.StepParam(1000)
    big = prep_zoom.step_param("step_from", "9" * 400)
    assert big.value == prep_zoom.MAX_STEP and "beyond the largest step" in big.note and len(big.note) < 120
    assert prep_zoom.step_param("step_to", "inf").value == prep_zoom.MAX_STEP
    assert prep_zoom.step_param("step_to", "-inf").value == -prep_zoom.MAX_STEP
    for bad in ("nan", "abc", "1.5"):
        p = prep_zoom.step_param("step_from", bad)
        assert p.value is None and "not a step number: ignored" in p.note


@pytest.mark.parametrize("param", [{"step_to": "inf"}, {"step_from": "9" * 400}, {"step_from": "nan"}])
def test_a_url_step_no_input_can_hold_is_a_note_not_a_traceback(sample_root, monkeypatch, param):
    name = sorted(p.name for p in sample_root.iterdir() if (p / "ingested").is_dir())[0]
    at = _app(sample_root, monkeypatch, runs=[name], metrics=["loss"], **param).run()
    assert not at.exception
    (key, _), = param.items()
    assert f"{key}=" in _texts(at)
    # The page goes on: the chart is drawn, or (from a step past the run) it says there is nothing there.
    assert chart_elements(at) or f"in steps {prep_zoom.MAX_STEP}.." in _texts(at)


# -- empty root ----------------------------------------------------------------------------------------


def test_an_empty_root_says_how_to_record_and_ingest_a_run(tmp_path, monkeypatch):
    at = _app(tmp_path, monkeypatch).run()
    assert not at.exception
    text = _texts(at)
    assert "Recorder(" in text and f"kforge-ingest {tmp_path}" in text and "end_step" in text
    at.switch_page("views/runs.py").run()
    assert not at.exception and f"kforge-ingest {tmp_path}" in _texts(at)


def test_a_root_with_runs_waiting_says_to_ingest_them(tmp_path):
    runs = [prep_runs.RunInfo("a", tmp_path / "a", prep_runs.NOT_INGESTED)]
    msg = prep_runs.no_runs_message(tmp_path, runs)
    assert "1 run recorded there waits" in msg and f"kforge-ingest {tmp_path}" in msg and "Recorder" not in msg


# -- lines that would hide each other, markers that name their run -----------------------------------------


def test_identical_lines_are_dashed_and_noted_and_markers_name_their_run(tmp_path):
    srcs = []
    for name in ("a", "b", "c"):
        run = write_run(tmp_path, name, n=40, seed=0 if name != "c" else 1, restart_at=20 if name == "a" else None)
        summary = json.loads((run / "ingested" / "summary.json").read_text())
        srcs.append(prep_series.RunSource(name, run / "ingested" / "steps.parquet", summary))
    data = prep_series.prepare_compare(srcs, ["loss"], smoothing=0.0)
    assert prep_overlap.identical_runs(data, "loss") == {"b": "a"}
    assert prep_overlap.chart_notes([data]) == ["b: loss the same as a (dashed)"]
    spec = json.loads(plotly.io.to_json(prep_figures.metric_figure(data, "loss", {"a": "#0072B2", "b": "#E69F00"},
                                                                   legend=False)))
    dash = {t["name"]: t["line"].get("dash") for t in spec["data"] if t["mode"] == "lines"}
    assert dash["b"] == "dash" and dash["a"] in (None, "solid") and dash["c"] in (None, "solid")
    assert spec["layout"]["showlegend"] is False
    marks = [t for t in spec["data"] if t["mode"] == "markers"]
    assert marks and all(txt.startswith("a: restart") for t in marks for txt in t["text"])


# -- the static preview drawn while plotly.js loads -------------------------------------------------------


def test_preview_svg_draws_every_line_in_its_colour_and_dash(tmp_path):
    from kforge_dash.browse import preview as prep_preview

    srcs = []
    for name in ("a", "b", "c"):
        run = write_run(tmp_path, name, n=2000, seed=0 if name != "c" else 1)
        srcs.append(prep_series.RunSource(name, run / "ingested" / "steps.parquet", {}))
    data = prep_series.prepare_compare(srcs, ["loss", "lr"], smoothing=0.6)
    svg = prep_preview.preview_svg(data, "loss", {"a": "#0072B2", "b": "#E69F00", "c": "#009E73"}, {"c": "dot"})
    lines = re.findall(r'<polyline points="([^"]*)" fill="none" stroke="([^"]*)" stroke-width="([^"]*)" '
                       r'stroke-opacity="([^"]*)"( stroke-dasharray="[^"]*")?', svg)
    # Raw (faint) and smoothed line of each run, in the run's colour; b repeats a, so b is dashed; c has its own dot.
    assert sorted((c, o) for _, c, _, o, _ in lines) == sorted(
        (c, o) for c in ("#0072B2", "#E69F00", "#009E73") for o in ("0.3", "1"))
    dashed = {c for _, c, _, _, d in lines if d}
    assert dashed == {"#E69F00", "#009E73"}
    assert all(len(p.split()) <= prep_preview.POINTS for p, *_ in lines)  # a few kB per line, not 2,000 points
    assert svg.startswith("<svg") and "<script" not in svg and ">loss<" in svg
    assert prep_preview.preview_svg(data, "grad_norm", {}) is None
    assert prep_preview.nice_ticks(0.0, 1.0) == pytest.approx([0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
    assert prep_preview.nice_ticks(13.0, 87.0) == pytest.approx([20.0, 40.0, 60.0, 80.0])
