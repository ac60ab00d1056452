"""Across runs: the hosts that keep doing it (kforge_dash/findings/host_table.py, kforge-ingest --json, the Hosts page)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from findings_fixtures import Clock, close_all, drive, install
from streamlit.testing.v1 import AppTest

import kforge_record.env as env_mod
from kforge_dash.browse import hosts_prep as prep_hosts
from kforge_dash.browse import runs as prep_runs
from kforge_dash.cli.ingest import main
from kforge_dash.findings.host_table import host_table
from kforge_dash.text import md_text
from kforge_record import Recorder

APP = Path(__file__).resolve().parent.parent / "kforge_dash" / "browse" / "app.py"
NO_EXPORT = ["--no-wandb", "--no-tensorboard"]


def _run(root: Path, name: str, monkeypatch, *, straggler: int | None):
    """4 ranks, rank r on host node-(r+1); ``straggler``: the rank whose data phase takes 50 ms more."""
    clock = install(monkeypatch, Clock())
    recs = {}
    for r in range(4):
        monkeypatch.setattr(env_mod, "hostname", lambda r=r: f"node-{r + 1}")
        recs[r] = Recorder(root / name, rank=r, world_size=4, flush_every_steps=50, flush_every_s=1e9,
                           install_sigterm_handler=False)
    drive(recs, range(1, 81), clock, wait_phase="bwd",
          phases=lambda r, s: [("data", 0.01 + (0.05 if r == straggler else 0.0)), ("fwd", 0.1)])
    close_all(recs)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    root = tmp_path_factory.mktemp("hosts") / "runs"
    try:
        _run(root, "job-a", mp, straggler=2)
        _run(root, "job-b", mp, straggler=None)
        _run(root, "job-c", mp, straggler=2)
    finally:
        mp.undo()
    return root


def _ingest_json(root):
    r = CliRunner().invoke(main, [str(root), "--json", *NO_EXPORT])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_the_host_that_straggles_in_two_runs_comes_first_also_when_runs_are_unchanged(root):
    for attempt in ("first ingest", "every run unchanged"):
        out = _ingest_json(root)
        assert all(x["skipped"] for x in out["runs"]) == (attempt == "every run unchanged")
        hosts = out["hosts"]
        assert [h["host"] for h in hosts][0] == "node-3", attempt
        assert {h["host"]: (h["runs"], h["straggler_runs"], h["throttle_runs"]) for h in hosts} == {
            "node-1": (3, 0, 0), "node-2": (3, 0, 0), "node-3": (3, 2, 0), "node-4": (3, 0, 0)}
        # every run has a what-if (summary.json what_if.by_rank): node-3's rank 2 cost 50 ms x 80 steps in
        # each of its two straggling runs, the others nothing (a known 0, not unknown)
        costs = {h["host"]: (h["cost_s"], h["cost_runs"]) for h in hosts}
        assert costs["node-3"][0] == pytest.approx(8.0, rel=1e-3) and costs["node-3"][1] == 3
        assert all(costs[f"node-{i}"] == (0.0, 3) for i in (1, 2, 4))
    summary = json.loads((root / "job-a" / "ingested" / "summary.json").read_text())
    assert summary["host_ranks"] == [{"host": f"node-{r + 1}", "ranks": [r]} for r in range(4)]


def test_the_screen_prints_the_top_hosts(root):
    r = CliRunner().invoke(main, [str(root), *NO_EXPORT])
    assert r.exit_code == 0, r.output
    tail = r.output[r.output.index("hosts (4 across the runs"):]
    assert tail.splitlines()[1].strip() == ("node-3: in 3 runs, straggling in 2, throttled in 0, "
                                            "cost 8.0 s (known in 3 of its 3 runs)")


def _summary(hosts_costs: dict | None, *, findings=()):
    by_rank = None if hosts_costs is None else [{"rank": i, "host": h, "cost_s": c} for i, (h, c) in
                                                 enumerate(hosts_costs.items())]
    return {"host_ranks": [{"host": h, "ranks": [0]} for h in ("a", "b", "c")], "findings": list(findings),
            "what_if": None if by_rank is None else {"total_s": 100.0, "without_stragglers_s": 90.0, "saved_s": 10.0,
                                                     "by_rank": by_rank, "method": "median rank"}}


def test_cost_is_summed_where_known_and_unknown_is_not_zero():
    throttle = {"kind": "hw_throttle", "hosts": ["c"], "ranks": [0]}
    straggler_a = {"kind": "straggler", "hosts": ["a"], "ranks": [0]}  # rank 0 ran on host a
    straggler_b = {"kind": "straggler", "hosts": ["b"], "ranks": [1]}  # rank 1 on host b
    hosts = host_table([
        _summary({"a": 1.0, "b": 30.0, "c": None}, findings=[throttle, straggler_a, straggler_b]),
        _summary({"a": 2.5, "b": 0.0}),
        _summary({"a": 0.0, "b": 40.0}),  # 40 s of 100 s, but no finding names rank 1: a known 0 (issue 27.3)
        _summary(None),  # an older ingest, or what-if not computable
    ])
    by = {h["host"]: h for h in hosts}
    assert [h["host"] for h in hosts] == ["b", "a", "c"]  # largest cost first, unknown last
    assert (by["b"]["cost_s"], by["b"]["cost_runs"]) == (30.0, 3)
    # a's 1.0 s counts where a straggler finding names its rank; its 2.5 s of 100 s elsewhere is under the
    # no finding naming it: noise, a known 0
    assert (by["a"]["cost_s"], by["a"]["cost_runs"], by["a"]["straggler_runs"]) == (1.0, 3, 1)
    assert (by["c"]["cost_s"], by["c"]["cost_runs"], by["c"]["throttle_runs"], by["c"]["runs"]) == (None, 0, 1, 4)


def test_noise_of_clean_runs_does_not_add_up_into_a_hosts_cost():
    """Ten clean runs where node-1's rank cost 0.4 s of 44 s each (the preempted sample run's noise), and one
    run where node-2 straggled for 5 s: node-2 is the costly host, node-1 costs nothing."""
    noise = {"kind": "straggler", "hosts": ["node-1"], "ranks": [0], "severity": "info"}  # immaterial: not straggling
    clean = [_summary({"node-1": 0.4, "node-2": 0.3}, findings=[noise]) for _ in range(10)]
    for s in clean:
        s["what_if"].update(total_s=44.0, without_stragglers_s=43.6, saved_s=0.4)
    slow = _summary({"node-2": 5.0, "node-1": 0.2}, findings=[{"kind": "straggler", "hosts": ["node-2"], "ranks": [0]}])
    by = {h["host"]: h for h in host_table([*clean, slow])}
    assert [h["host"] for h in host_table([*clean, slow])][:2] == ["node-2", "node-1"]
    assert (by["node-2"]["cost_s"], by["node-1"]["cost_s"], by["node-1"]["cost_runs"]) == (5.0, 0.0, 11)
    assert (by["node-1"]["straggler_runs"], by["node-2"]["straggler_runs"]) == (0, 1)


def test_hosts_page_data(root):
    _ingest_json(root)
    runs = prep_runs.list_runs(root)
    t = prep_hosts.hosts_table(runs)
    assert t["host"].to_list()[0] == "node-3" and t["straggler_runs"].to_list()[0] == 2
    f = prep_hosts.host_findings(runs, "node-3")
    assert [x.run for x in f] == ["job-a", "job-c"] and {x.card.kind for x in f} == {"straggler"}
    summary = json.loads((root / "job-a" / "ingested" / "summary.json").read_text())
    (strag,) = [x for x in summary["findings"] if x["kind"] == "straggler"]
    assert f[0].card.message == strag["message"]  # whole, as the run page shows it
    assert f[0].card.focus == f"{strag['first_step']}-{strag['last_step']}"  # the run page's ?focus= value
    assert prep_hosts.host_findings(runs, "node-1") == []


def _hosts_page(root, monkeypatch, host=None):
    monkeypatch.setenv(prep_runs.ROOT_ENV, str(root))
    at = AppTest.from_file(str(APP), default_timeout=300)
    if host is not None:
        at.query_params["host"] = host
    at.run()
    at.switch_page("views/hosts.py").run()
    assert not at.exception
    return at


def test_hosts_page_renders_the_table_and_a_hosts_findings_with_real_links(root, monkeypatch):
    """The findings were a table that cut messages at its width, with 'open steps' cells that were no
    link (Playwright found no element); cost (s) showed 38.3795 where the CLI says 38.4."""
    _ingest_json(root)
    at = _hosts_page(root, monkeypatch, "node-3")
    (table,) = at.dataframe  # the findings are no table any more
    assert table.value["host"].tolist()[0] == "node-3"
    cost = json.loads(table.proto.columns)["cost_s"]
    assert (cost["label"], cost["type_config"]["format"]) == ("cost (s)", "%.1f")
    links = at.get("page_link")
    assert [(x.proto.page, x.proto.query_string) for x in links] == [
        ("detail", f"run={x.run}&focus={x.card.focus}") for x in prep_hosts.host_findings(prep_runs.list_runs(root), "node-3")]
    assert [x.proto.label.split(" of ")[-1] for x in links] == ["job-a", "job-c"]
    messages = [m.value for m in at.markdown]
    summary = json.loads((root / "job-c" / "ingested" / "summary.json").read_text())
    (strag,) = [x for x in summary["findings"] if x["kind"] == "straggler"]
    assert md_text(strag["message"]) in messages


def test_hosts_page_cost_with_a_gap_is_text_to_one_decimal(root, monkeypatch, tmp_path):
    """A host whose cost no run knows: the column is text, "—" there, the others to one decimal."""
    import shutil

    _ingest_json(root)
    mixed = tmp_path / "runs"
    shutil.copytree(root, mixed)
    s_path = mixed / "job-b" / "ingested" / "summary.json"
    s = json.loads(s_path.read_text())
    s["host_ranks"].append({"host": "node-9", "ranks": [7]})
    s_path.write_text(json.dumps(s))
    at = _hosts_page(mixed, monkeypatch)
    (table,) = at.dataframe
    got = dict(zip(table.value["host"], table.value["cost_s"]))
    assert got["node-3"].strip() == "8.0" and got["node-9"] == "—" and got["node-1"].strip() == "0.0"


def test_hosts_page_in_chromium_a_row_click_lists_whole_messages_and_links_open_the_steps(root, browser, tmp_path):
    """Real headless Chromium: clicking node-3's row lists its findings; each message is whole (wrapped, not
    cut at a table's width) and "Open steps" is a real link to the run page with ?run=&focus=, which opens
    those steps there."""
    from browser_fixtures import new_page, serve

    _ingest_json(root)
    found = prep_hosts.host_findings(prep_runs.list_runs(root), "node-3")
    with serve(root, tmp_path / "dash.log") as url:
        page, left = new_page(browser)
        page.goto(f"{url}/hosts")
        grid = page.locator("[data-testid='stDataFrame'] [data-testid='data-grid-canvas']").first
        grid.wait_for()
        box = grid.bounding_box()
        page.mouse.click(box["x"] + 15, box["y"] + 36 + 18)  # the first row's selection box (node-3: most costly)
        links = page.locator("a[href*='focus=']")
        links.first.wait_for()
        assert "host=node-3" in page.url
        hrefs = [links.nth(i).get_attribute("href") for i in range(links.count())]
        assert hrefs == [f"detail?run={x.run}&focus={x.card.focus}" for x in found]
        text = page.get_by_text(found[0].card.message, exact=True).first  # job-a and job-c: the same words
        assert text.is_visible() and text.evaluate("e => e.scrollWidth <= e.clientWidth")
        links.first.click()
        page.wait_for_url("**/detail?*")
        # the run page's run and focus boxes hold the link's ?run= and ?focus= (the URL may then drop a default)
        page.wait_for_function("v => { const got = [...document.querySelectorAll('input[role=combobox]')].map(e => e.value);"
                               " return v.every(x => got.includes(x)); }", arg=[found[0].run, found[0].card.focus])
        assert left == []
