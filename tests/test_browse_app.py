"""Pages through Streamlit's AppTest, and kforge-report's library and CLI."""

import json
import os
import re
from pathlib import Path

import numpy as np
from chart_specs import chart_specs
from click.testing import CliRunner
from dash_fixtures import shown, write_run, write_shards_only
from streamlit.testing.v1 import AppTest

from kforge_dash import column_registry as reg


def md_text(s):  # what text.md_text gives, written out: "\\" before each character Markdown acts on
    return re.sub(r"([\\`*_\[\]<>#!$~|{}&:@])", r"\\\1", s)

APP = Path(__file__).resolve().parent.parent / "kforge_dash" / "browse" / "app.py"
HOSTILE = "![pix](https:evil.invalid)"


def _app(root, monkeypatch, **params):
    monkeypatch.setenv("KFORGE_DASH_ROOT", str(root))
    at = AppTest.from_file(str(APP), default_timeout=300)
    at.query_params.update(params)
    return at


def _titles(at):
    return [s["layout"]["title"]["text"] for s in chart_specs(at)]


def test_landing_page_draws_the_most_recent_runs_at_once(tmp_path, monkeypatch):
    for i in range(10):
        write_run(tmp_path, f"run{i}", n=50, seed=i)
        p = tmp_path / f"run{i}" / "ingested" / "summary.json"
        s = json.loads(p.read_text())
        s["attempts"][0]["start_time"] = 1.7e9 + 60 * i
        p.write_text(json.dumps(s))
    at = _app(tmp_path, monkeypatch).run()
    assert not at.exception
    assert at.multiselect(key="runs").value == [f"run{i}" for i in range(9, 1, -1)]  # 8 newest, newest first
    assert {reg.lookup(m).titled for m in ("loss", "grad_norm", "lr", "mfu", "step_time_s")} <= set(_titles(at))


def test_hostile_names_are_text_in_every_panel(tmp_path, monkeypatch):
    write_run(tmp_path, "**bold**", n=30, tags=["<img src=x>"], hparams={"![h](https:h.invalid)": 1},
              warnings=["see ![w](https:w.invalid)"])
    write_shards_only(tmp_path, HOSTILE)
    at = _app(tmp_path, monkeypatch).run()
    assert not at.exception
    notice = next(w.value for w in at.warning if "until ingested" in shown(w.value))
    assert md_text(HOSTILE) in notice and HOSTILE in shown(notice)
    assert "![" not in notice  # the Markdown source has no image syntax left
    at.switch_page("views/run_detail.py").run()
    assert not at.exception
    warning = next(w.value for w in at.warning if "see" in w.value)
    assert "![" not in warning and shown(warning) == "see ![w](https:w.invalid)"


def test_damaged_ranks_file_and_outside_symlink_are_named_not_tracebacks(tmp_path, monkeypatch):
    root = tmp_path / "runs"
    write_run(root, "trunc", n=40)
    ranks = root / "trunc" / "ingested" / "ranks.parquet"
    ranks.write_bytes(ranks.read_bytes()[: len(ranks.read_bytes()) // 2])  # truncated mid-file
    write_run(root, "linked", n=40)
    outside = tmp_path / "secret-place"
    write_run(outside, "x", n=40)
    steps = root / "linked" / "ingested" / "steps.parquet"
    steps.unlink()
    os.symlink(outside / "x" / "ingested" / "steps.parquet", steps)
    at = _app(root, monkeypatch, run="trunc").run()
    at.switch_page("views/run_detail.py").run()
    assert not at.exception
    assert any(str(ranks) in shown(e.value) for e in at.error)
    at = _app(root, monkeypatch, run="linked").run()
    at.switch_page("views/run_detail.py").run()
    assert not at.exception
    errors = [shown(e.value) for e in at.error]
    assert any("linked/ingested/steps.parquet" in e and "outside the run directory" in e for e in errors)
    assert not any("secret-place" in e for e in errors)
    at = _app(root, monkeypatch, runs=["linked", "trunc"]).run()  # the compare page too
    assert not at.exception and not any("secret-place" in shown(e.value) for e in at.error)
    assert _titles(at)  # the other run is still drawn


def test_group_band_and_zoom_inputs_on_the_compare_page(tmp_path, monkeypatch):
    for name, seed in (("a-seed1", 1), ("a-seed2", 2), ("b-seed1", 3)):
        write_run(tmp_path, name, n=300, seed=seed)
    at = _app(tmp_path, monkeypatch, group_by="name pattern", metrics=["loss"], step_from="101", step_to="200").run()
    assert not at.exception
    (chart,) = chart_specs(at)
    fills = [t for t in chart["data"] if t.get("fill") == "tonexty"]
    assert len(fills) == 2  # one band per group
    means = [t for t in chart["data"] if t.get("line", {}).get("width") == 1.8]
    assert sorted(t["name"] for t in means) == ["a (2 runs)", "b (1 run)"]
    assert chart["layout"]["dragmode"] == "select"


def test_run_page_shows_units_and_where_mfu_inputs_came_from(tmp_path, monkeypatch):
    write_run(tmp_path, "cpu", n=30, world_size=2, device={"type": "cpu", "name": "x86_64"},
              wall_time_s=3725.0, mean_mfu=0.4123, peak_mem_bytes=None)
    write_run(tmp_path, "gpu", n=30, peak_mem_bytes=3 * 2**30)
    at = _app(tmp_path, monkeypatch, run="cpu").run()
    at.switch_page("views/run_detail.py").run()
    assert not at.exception
    got = {m.label: m.value for m in at.metric}
    assert got["ranks"] == "2" and got["training time"] == "1:02:05" and got["mean MFU"] == "41.2 %"
    cap = " ".join(shown(c.value) for c in at.caption)
    assert "Device: CPU ×2" in cap
    assert "FLOPs/token from n_params" in cap and "peak 989 TFLOPS/GPU from table" in cap
    at.switch_page("views/runs.py").run()
    table = at.dataframe[0].value.set_index("run")
    assert table.loc["cpu", "peak_mem_bytes"] == "—" and table.loc["gpu", "peak_mem_bytes"].strip() == "3.00 GiB"


def test_kforge_ingest_screen_says_where_mfu_inputs_came_from():
    from kforge_dash.cli.ingest import _screen
    from kforge_dash.ingest.options import IngestResult

    res = IngestResult("/x/r", {"run_name": "r", "flops_per_token": 7.4e8, "flops_source": "6*n_params+12*L*D*S",
                                "peak_tflops": 989.0, "peak_source": "table: H100"}, False)
    assert "  MFU inputs: 7.4e+08 FLOPs/token from 6*n_params+12*L*D*S; peak 989 TFLOPS/GPU from table: H100" in _screen(res)


def test_kforge_ingest_screen_says_unknown_mfu_inputs_in_words():
    from kforge_dash.cli.ingest import _screen
    from kforge_dash.ingest.options import IngestResult

    res = IngestResult("/x/r", {"run_name": "r", "flops_per_token": None, "flops_source": None, "peak_tflops": None,
                                "peak_source": None}, False)
    assert "  MFU inputs: FLOPs/token unknown; peak TFLOPS unknown" in _screen(res)


def test_dash_hides_the_developer_toolbar():
    from kforge_dash.cli import dash as cli_dash

    args = cli_dash.streamlit_args(host="127.0.0.1", port=8501)
    assert dict(zip(args[2::2], args[3::2]))["--client.toolbarMode"] == "minimal"


def test_report_is_self_contained_escaped_and_names_findings(tmp_path):
    write_run(tmp_path, "<img src=x onerror=alert(1)>", n=200, restart_at=120, nan_steps=(50,),
              findings=[{"kind": "loss_spike", "severity": "warning", "message": "<script>x</script>",
                         "first_step": 10, "last_step": 12, "ranks": [0, 3]}],
              goodput={"fraction": 0.875, "buckets": {"productive_s": 700.0, "restart_s": 100.0}})
    write_run(tmp_path, "plain", n=200)
    out = tmp_path / "report.html"
    from kforge_dash.cli.report import main

    picks = ["--runs", "<img src=x onerror=alert(1)>", "--runs", "plain", "--runs", "nope"]
    r = CliRunner().invoke(main, [str(tmp_path), "-o", str(out), *picks])
    assert r.exit_code == 0, r.output
    assert "--runs nope: no ingested run of that name" in r.output
    page = out.read_text()
    body = page.split("</head>", 1)[1]  # the head holds plotly.js, inline
    assert "<img" not in body and "&lt;img src=x onerror=alert(1)&gt;" in body
    assert "<script>x</script>" not in body and "&lt;script&gt;x&lt;/script&gt;" in body
    assert "87.5 %" in body and "loss spike" in body and "ranks 0, 3" in body and "Restarts (1)" in body
    assert "Non-finite steps: 2" in body  # loss and eval/loss (loss + 0.1 every 10 steps) at step 50
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", body)  # nothing to fetch
    # The charts' specs as one JSON block, drawn by one script once the grid is laid out (its second
    # newPlot draws the run sections' MFU waterfalls, none here); plotly.js inline.
    assert body.count('<div class="chart"') == 7 and body.count("<script>") == 1 and body.count("Plotly.newPlot(") == 2
    assert page.count("<script") == 3 and "<script src" not in page
    bad = CliRunner().invoke(main, [str(tmp_path), "-o", str(out), "--runs", "nope"])
    assert bad.exit_code == 1 and "no ingested run to report" in bad.output


def test_report_size_stays_small_for_long_runs(tmp_path):
    """8 runs × 1M steps would take a minute here; 2 × 200k show the file does not grow with steps."""
    from kforge_dash.browse import report as prep_report

    for i in range(2):
        write_run(tmp_path, f"r{i}", n=200_000, seed=i, with_ranks=False)
    small = prep_report.build_report([tmp_path], options=prep_report.ReportOptions(metrics=("loss",)))
    assert len(small.html) < 7e6
    np.testing.assert_equal(small.runs, ["r0", "r1"])


def test_a_sessions_first_page_sends_previews_then_the_first_chart_ahead_of_the_others(tmp_path, monkeypatch):
    """The frontend draws every chart that has arrived in one task: on a session's first page the
    script sends a static preview of every chart, then holds the other plotly charts back once the
    first is sent (so it shows sooner), and only then."""
    import time

    from kforge_dash.browse.views import common

    for i in range(2):
        write_run(tmp_path, f"run{i}", n=50, seed=i)
    held, real_sleep = [], time.sleep

    def sleep(seconds):
        if seconds in (common.FIRST_CHART_HEAD_START_S, common.FIRST_PAGE_HOLD_S):
            held.append(seconds)
        real_sleep(0)

    monkeypatch.setattr(time, "sleep", sleep)
    at = _app(tmp_path, monkeypatch).run()
    assert not at.exception
    assert held == [common.FIRST_PAGE_HOLD_S] and len(_titles(at)) >= 5
    assert len(at.get("image")) == len(_titles(at))  # one static preview per chart
    at.run()  # the same session again (a widget changed): plotly.js is loaded, nothing held back, no previews
    assert not at.exception
    assert held == [common.FIRST_PAGE_HOLD_S] and len(_titles(at)) >= 5 and not at.get("image")


def test_back_on_compare_from_another_page_the_runs_are_shown_as_they_were(tmp_path, monkeypatch):
    # Streamlit drops the legend pills' state on another page: coming back hid every run.
    for i in range(3):
        write_run(tmp_path, f"run{i}", n=40, seed=i)
    at = _app(tmp_path, monkeypatch).run()
    runs = at.pills(key="legend").options
    at.pills(key="legend").set_value([r for r in runs if r != "run1"]).run()
    at.switch_page("views/run_detail.py").run()
    at.switch_page("views/compare.py").run()
    assert not at.exception
    assert sorted(at.pills(key="legend").value) == sorted(r for r in runs if r != "run1")  # as it was left
    assert not [i for i in at.info if "Every run is hidden" in i.value] and chart_specs(at)

