"""Every page of the Streamlit app through Streamlit's AppTest, on sample_runs/ ingested for real.

Expected values are read independently from the ingested files (pyarrow, json), not from the
dashboard's prep functions.
"""

import base64
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from chart_specs import chart_elements, chart_spec
from click.testing import CliRunner
from dash_fixtures import SAMPLE_RUNS, copy_and_ingest_sample_runs, ingest_sample_run, sample_run_names, shown, write_run
from streamlit.testing.v1 import AppTest

from kforge_dash.browse.figures import chart_title
from kforge_dash.browse.rank_metrics import phase_label

APP = Path(__file__).resolve().parent.parent / "kforge_dash" / "browse" / "app.py"


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return copy_and_ingest_sample_runs(tmp_path_factory.mktemp("dash") / "runs")


@pytest.fixture
def app(root, monkeypatch):
    monkeypatch.setenv("KFORGE_DASH_ROOT", str(root))
    # A limit, not a wait (a run ends when the script does): a loaded 2-core machine took over 60 s for one.
    return AppTest.from_file(str(APP), default_timeout=300)


def summary(root, name):
    return json.loads((root / name / "ingested" / "summary.json").read_text())


def steps(root, name):
    return pq.read_table(root / name / "ingested" / "steps.parquet").to_pydict()


def decode(v):
    """Plotly's JSON holds arrays either as lists or as typed base64 ({'dtype', 'bdata'})."""
    if isinstance(v, dict) and "bdata" in v:
        a = np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"]))
        return a.reshape([int(n) for n in str(v["shape"]).split(",")]) if "shape" in v else a  # shape "n, 2"
    return np.asarray(v)


def charts(at):
    """{chart title: plotly spec} of the plotly charts on the page."""
    out = {}
    for c in chart_elements(at):
        spec = chart_spec(c)
        out[spec["layout"].get("title", {}).get("text") or c.proto.id] = spec
    return out


def frame_with(at, column):
    """The page's dataframe (as pandas) that has `column`."""
    return next(d.value for d in at.dataframe if column in d.value.columns)



def test_compare_page_lists_runs_and_draws_selected_ones(app, root):
    names = sample_run_names()
    at = app.run()
    assert not at.exception
    assert at.title[0].value == "Compare runs"
    runs = at.multiselect(key="runs")
    assert sorted(runs.options) == names
    a, b = names[:2]
    runs.set_value([a, b]).run()
    assert not at.exception
    got = charts(at)
    assert {chart_title(m) for m in ("loss", "grad_norm", "lr", "tokens_per_sec", "step_time_s")} <= set(got)
    loss = got[chart_title("loss")]
    lines = {(t["name"], t["opacity"] < 1): t for t in loss["data"] if t["mode"] == "lines"}
    assert {n for n, _ in lines} == {a, b}
    # The raw line of run a is the ingested loss, exactly, at every (finite) step.
    s = steps(root, a)
    raw = lines[(a, True)]
    want = {st: v for st, v in zip(s["step"], s["loss"]) if v is not None and np.isfinite(v)}
    drawn_steps = decode(raw["x"]).tolist()  # on the step axis x is the step
    assert set(drawn_steps) <= set(want)
    if len(want) <= 2000:
        assert drawn_steps == sorted(want)
    np.testing.assert_allclose(decode(raw["y"]), [want[st] for st in drawn_steps])
    # Colours: the same run has the same colour on every chart.
    colour = {t["name"]: t["line"]["color"] for spec in got.values() for t in spec["data"] if t["mode"] == "lines"}
    for spec in got.values():
        for t in spec["data"]:
            if t["mode"] == "lines":
                assert t["line"]["color"] == colour[t["name"]]
    assert colour[a] != colour[b]
    labels = [d.proto.label for d in at.get("download_button")]
    assert labels == ["Download CSV", "Download Parquet"]


def test_compare_smoothing_matches_ingest_ema_and_log_y_and_tokens_axis(app, root):
    a = sample_run_names()[0]
    at = app.run()
    at.multiselect(key="runs").set_value([a]).run()
    at.slider(key="smoothing").set_value(0.9).run()  # alpha 0.1: ingest's default
    at.toggle(key="log_y").set_value(True).run()
    at.selectbox(key="x_axis").set_value("tokens").run()
    assert not at.exception
    loss = charts(at)["loss"]
    smooth = next(t for t in loss["data"] if t["mode"] == "lines" and t["opacity"] == 1)
    s = steps(root, a)
    by_step = dict(zip(s["step"], s["loss_ema"]))  # ingest's own EMA
    drawn = decode(smooth["customdata"])[:, 0].astype(np.int64).tolist()  # (step, raw value beside it)
    np.testing.assert_allclose(decode(smooth["y"]), [by_step[st] for st in drawn], rtol=1e-9)
    assert loss["layout"]["yaxis"]["type"] == "log"
    cum = dict(zip(s["step"], np.cumsum(s["tokens"]).tolist()))
    assert decode(smooth["x"]).tolist() == [cum[st] for st in drawn]
    assert loss["layout"]["xaxis"]["title"]["text"].startswith("tokens")


def test_compare_search_filters_and_bad_query_params_are_ignored(app):
    names = sample_run_names()
    app.query_params["runs"] = ["../outside", "/etc", names[0]]
    at = app.run()
    assert not at.exception
    assert at.multiselect(key="runs").value == [names[0]]  # the rest are not runs of the root
    at.text_input(key="query").set_value(names[-1]).run()
    assert set(at.multiselect(key="runs").options) == {names[-1], names[0]}  # the selection stays


def test_compare_marks_nonfinite_steps(app, root):
    bad = [n for n in sample_run_names() if any(
        v is not None and not np.isfinite(v) for v in steps(root, n)["loss"])]
    assert bad, "sample_runs/spike-nan must have a non-finite loss"
    at = app.run()
    at.multiselect(key="runs").set_value(bad[:1]).run()
    texts = [shown(w.value) for w in at.warning]
    assert any(bad[0] in t and ("loss is nan" in t or "loss is inf" in t) for t in texts)
    markers = [t for t in charts(at)[chart_title("loss")]["data"] if t["mode"] == "markers"]
    assert any(t["marker"]["symbol"] in ("x", "triangle-up") for t in markers)


def test_runs_table_and_config_diff(app, root):
    names = sample_run_names()
    at = app.run()
    at.switch_page("views/runs.py").run()
    assert not at.exception and at.title[0].value == "Runs"
    table = at.dataframe[0].value
    assert table["run"].tolist() == names
    for _, row in table.iterrows():
        s = summary(root, row["run"])
        assert row["status"] == "ingested"
        assert row["steps"] == s["steps"] and row["world_size"] == s["world_size"]
        assert row["final_loss"] == pytest.approx(s["final_loss"], nan_ok=True)
        assert row["restarts"] == len(s["restarts"])
    # Config diff of all runs: exactly the hyperparameters that differ somewhere.
    hp = {n: summary(root, n)["hparams"] for n in names}
    keys = set().union(*hp.values())
    differ = {f"hparams.{k}" for k in keys if len({json.dumps(h.get(k)) for h in hp.values()}) > 1
              or any(k not in h for h in hp.values())}
    diff = at.dataframe[1].value
    assert {k for k in diff["key"] if k.startswith("hparams.")} == differ
    assert "hparams.lr" in differ
    lr = diff[diff["key"] == "hparams.lr"].iloc[0]
    assert [json.loads(lr[n]) for n in names] == [hp[n]["lr"] for n in names]
    at.multiselect(key="diff_runs").set_value(names[:1]).run()
    assert any("at least two" in i.value for i in at.info)


def test_run_detail_page(app, root):
    names = sample_run_names()
    pick = next((n for n in names if summary(root, n)["restarts"]), names[0])
    app.query_params["run"] = pick
    at = app.run()
    at.switch_page("views/run_detail.py").run()
    assert not at.exception and at.title[0].value == "Run detail"
    assert at.selectbox(key="run").value == pick
    s = summary(root, pick)
    heat = next(spec for spec in charts(at).values() if spec["data"][0]["type"] == "heatmap")
    assert decode(heat["data"][0]["y"]).tolist() == s["ranks"]
    assert {h.value for h in at.subheader} >= {"Per rank", "Phase breakdown", "Restarts",
                                               "Non-finite steps", "Warnings"}
    slow = next(spec for t, spec in charts(at).items() if t.startswith("steps where each rank's own work"))
    st = steps(root, pick)
    # Expected independently (pyarrow): per step, the rank with the longest data + optimizer time
    # (the own-work phases of the sample runs; fwd_bwd holds the all-reduce, checkpoint is goodput's).
    t = pq.read_table(root / pick / "ingested" / "ranks.parquet").to_pydict()
    best: dict[int, tuple[float, int]] = {}
    for step, rank, data, opt in zip(t["step"], t["rank"], t["time/data_s"], t["time/optimizer_s"]):
        own = (data or 0.0) + (opt or 0.0)
        if step not in best or own > best[step][0]:
            best[step] = (own, rank)
    counts = np.bincount([r for _, r in best.values()])
    assert dict(zip(decode(slow["data"][0]["x"]).tolist(), decode(slow["data"][0]["y"]).tolist())) == {
        r: int(c) for r, c in enumerate(counts) if c}
    assert len(frame_with(at, "superseded_steps")) == len(s["attempts"])
    (ids,) = [c.value for c in at.caption if c.value.startswith("Attempt ids")]  # as text: a cell cut them
    assert all(shown(a["attempt_ids"][0]) in shown(ids) for a in s["attempts"])
    warnings = [shown(w.value) for w in at.warning]
    assert all(w in warnings for w in s["warnings"])
    nonfinite = sum(1 for v in st["loss"] if v is not None and not np.isfinite(v))
    if nonfinite:
        table = frame_with(at, "metric")
        assert (table["metric"] == "loss").sum() == nonfinite
    # A run name from the URL that is not a run of the root: said so, and no other run shown under it.
    app2 = AppTest.from_file(str(APP), default_timeout=300)
    app2.query_params["run"] = "../../etc"
    at2 = app2.run()
    at2.switch_page("views/run_detail.py").run()
    assert not at2.exception and not chart_elements(at2) and not at2.metric
    assert any("'../../etc' is not under" in shown(e.value) for e in at2.error)


def test_run_detail_finds_the_straggler_in_its_phase_timers(app, root):
    """sample_runs/straggler: rank 1 sleeps 40 ms in its data phase (examples/make_sample_runs.py).
    Both ranks share one step time (DDP waits), so the page must show it through the phase timers."""
    assert "straggler" in sample_run_names(), "sample_runs/straggler is missing"
    app.query_params["run"] = "straggler"
    at = app.run()
    at.switch_page("views/run_detail.py").run()
    at.selectbox(key="metric").set_value("time/data_s").run()
    assert not at.exception
    heat = next(spec for spec in charts(at).values() if spec["data"][0]["type"] == "heatmap")
    z = np.array(heat["data"][0]["z"], dtype=float)
    ranks = decode(heat["data"][0]["y"]).tolist()
    # Expected independently: each rank's mean data time, from ranks.parquet via pyarrow.
    table = pq.read_table(root / "straggler" / "ingested" / "ranks.parquet").to_pydict()
    per_rank = {r: np.nanmean([v for rr, v in zip(table["rank"], table["time/data_s"]) if rr == r and v is not None])
                for r in set(table["rank"])}
    slow = max(per_rank, key=per_rank.get)
    assert slow == 1 and per_rank[1] >= 0.04 > per_rank[0]
    rows = {r: z[i] for i, r in enumerate(ranks)}
    assert np.nanmean(rows[1]) > np.nanmean(rows[0])  # the heatmap lights up rank 1
    data = phase_label("time/data_s")  # the column registry's "data phase (s)"
    by_rank = frame_with(at, data)
    assert by_rank.set_index("rank")[data].idxmax() == 1


def test_not_ingested_and_stale_runs_are_flagged_and_ingested_from_the_app(tmp_path, monkeypatch):
    names = sample_run_names()
    root = tmp_path / "runs"
    shutil.copytree(SAMPLE_RUNS, root, ignore=shutil.ignore_patterns("ingested"))
    fresh = names[0]
    for n in names[1:]:
        ingest_sample_run(root / n)
    stale = names[1] if len(names) > 1 else None
    if stale:
        # Shards written after its ingest: date the ingest back before the newest shard.
        newest = max(f.stat().st_mtime for f in (root / stale).glob("rank-*/*/*"))
        os.utime(root / stale / "ingested" / "summary.json", (newest - 60, newest - 60))
    monkeypatch.setenv("KFORGE_DASH_ROOT", str(root))
    at = AppTest.from_file(str(APP), default_timeout=300)
    at.run()
    at.switch_page("views/runs.py").run()
    status = dict(zip(*at.dataframe[0].value[["run", "status"]].T.values))
    assert status[fresh] == "not ingested"
    if stale:
        assert status[stale] == "stale"
    notice = next(shown(w.value) for w in at.warning if "until ingested" in shown(w.value))
    assert fresh in notice
    at.button(key="ingest").click().run()
    assert not at.exception
    status = dict(zip(*at.dataframe[0].value[["run", "status"]].T.values))
    assert status[fresh] == "ingested" and (root / fresh / "ingested" / "steps.parquet").is_file()
    if stale:
        assert status[stale] == "ingested"
    assert not any("until ingested" in shown(w.value) for w in at.warning)


def test_damaged_steps_file_is_named_not_a_crash(root, tmp_path, monkeypatch):
    copy = tmp_path / "runs"
    shutil.copytree(root, copy)
    name = sample_run_names()[0]
    steps_file = copy / name / "ingested" / "steps.parquet"
    steps_file.write_bytes(b"PAR1 damaged")
    monkeypatch.setenv("KFORGE_DASH_ROOT", str(copy))
    at = AppTest.from_file(str(APP), default_timeout=300)
    at.query_params["runs"] = [name]
    at.run()
    assert not at.exception
    assert any(str(steps_file) in shown(e.value) for e in at.error)
    at.query_params["run"] = name
    at.switch_page("views/run_detail.py").run()
    assert not at.exception
    assert any(str(steps_file) in shown(e.value) for e in at.error)


def test_cli_refuses_a_missing_root_and_binds_localhost_by_default(tmp_path):
    from click.testing import CliRunner

    from kforge_dash.browse.runs import default_runs_root
    from kforge_dash.cli import dash as cli_dash

    result = CliRunner().invoke(cli_dash.main, [str(tmp_path / "nope")])
    assert result.exit_code == 2 and f"{tmp_path / 'nope'} is not a directory" in result.output
    assert default_runs_root() == SAMPLE_RUNS
    args = cli_dash.streamlit_args(host="127.0.0.1", port=8501)
    opts = dict(zip(args[2::2], args[3::2]))
    assert args[:2] == ["run", str(APP)]
    assert opts["--server.address"] == "127.0.0.1" and opts["--server.headless"] == "true"
    assert opts["--browser.gatherUsageStats"] == "false"
    assert "127.0.0.1" in CliRunner().invoke(cli_dash.main, ["--help"]).output


def test_compare_view_settings_come_from_the_url(app, root):
    """A shared link reproduces the view: runs, metrics, x axis, smoothing and log-y from the URL."""
    a = sample_run_names()[0]
    app.query_params.update({"runs": [a], "metrics": ["loss"], "x_axis": "tokens", "smoothing": "0.9", "log_y": "true"})
    at = app.run()
    assert not at.exception
    assert at.multiselect(key="metrics").value == ["loss"]
    assert at.selectbox(key="x_axis").value == "tokens"
    assert at.slider(key="smoothing").value == 0.9 and at.toggle(key="log_y").value is True
    assert set(charts(at)) == {"loss"} and charts(at)["loss"]["layout"]["yaxis"]["type"] == "log"


def test_cli_takes_a_run_folder_as_a_root_holding_that_one_run(tmp_path, monkeypatch):
    """`kforge-dash RUN_DIR` said "No runs under RUN_DIR yet. Record one ... Recorder('RUN_DIR/my-run')"."""
    from kforge_dash.browse import runs as prep_runs
    from kforge_dash.cli import dash as cli_dash

    write_run(tmp_path, "a", n=30)
    write_run(tmp_path, "b", n=30)
    started = []
    monkeypatch.setattr("streamlit.web.cli.main", lambda **kw: started.append(kw))
    monkeypatch.setenv(prep_runs.ROOT_ENV, "")  # the CLI sets both: restored after the test
    monkeypatch.setenv(prep_runs.ONLY_RUN_ENV, "")
    result = CliRunner().invoke(cli_dash.main, [str(tmp_path / "a"), "--port", str(_free_port())])
    assert result.exit_code == 0 and started, result.output
    assert os.environ[prep_runs.ROOT_ENV] == str(tmp_path.resolve()) and os.environ[prep_runs.ONLY_RUN_ENV] == "a"
    assert f"run {tmp_path.resolve() / 'a'}, serving on" in result.output
    at = AppTest.from_file(str(APP), default_timeout=120).run()  # the landing page: that run alone
    assert not at.exception
    assert [r.name for r in prep_runs.list_runs(tmp_path, only=prep_runs.only_run_from_env())] == ["a"]
    assert "No runs under" not in " ".join(e.value for e in at.info)
    assert at.multiselect(key="runs").options == ["a"]


def test_cli_says_a_port_is_taken_before_saying_it_serves_there(tmp_path, monkeypatch):
    """With 8501 taken, kforge-dash printed "serving on ...:8501" and then Streamlit's "Port 8501 is not available"."""
    import socket

    from kforge_dash.cli import dash as cli_dash

    started = []
    monkeypatch.setattr("streamlit.web.cli.main", lambda **kw: started.append(kw))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(cli_dash.main, [str(tmp_path), "--port", str(port)])
    assert result.exit_code == 2 and not started
    assert f"port {port} on 127.0.0.1 is not available" in result.output and "serving on" not in result.output


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
