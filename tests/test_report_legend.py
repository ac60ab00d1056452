"""The report's one legend: a run list above the charts, a real <button> per run with
a swatch of its line, that hides or shows the run on every chart; no plotly legend under each chart."""

import json
import re
from html.parser import HTMLParser

import pytest
from browser_fixtures import CHARTS_DRAWN, new_page
from dash_fixtures import write_run

from kforge_dash.browse import figures as prep_figures
from kforge_dash.browse import preview as prep_preview
from kforge_dash.browse import runs as prep_runs

HOSTILE = "<img src=x onerror=alert(1)> & **y**"


class _RunList(HTMLParser):
    """Each run-list button: its data-group, swatch stroke and dash, and the text it shows."""

    def __init__(self):
        super().__init__()
        self.buttons: list[dict] = []
        self._in = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "button" and "run-toggle" in (a.get("class") or "").split():
            self._in = True
            self.buttons.append({"group": a.get("data-group"), "pressed": a.get("aria-pressed"), "text": ""})
        elif tag == "line" and self._in:
            self.buttons[-1].update(stroke=a.get("stroke"), dasharray=a.get("stroke-dasharray"))

    def handle_endtag(self, tag):
        if tag == "button":
            self._in = False

    def handle_data(self, data):
        if self._in:
            self.buttons[-1]["text"] += data


def _specs(page: str) -> list[dict]:
    block = re.search(r'<script type="application/json" id="chart-specs">(.*?)</script>', page, re.S).group(1)
    return json.loads(block)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """15 runs (two past the palette's 13, so dashed), one with a name that is HTML and Markdown."""
    root = tmp_path_factory.mktemp("legend")
    for i in range(14):
        write_run(root, f"run-{i:02d}", n=60, seed=i, with_ranks=False, restart_at=30 if i == 1 else None)
    write_run(root, HOSTILE, n=60, seed=99, with_ranks=False)
    return root


def test_report_has_one_run_list_in_the_traces_own_colours_and_no_legend_per_chart(root):
    from kforge_dash.browse.report import build_report

    report = build_report([root])
    specs = _specs(report.html)
    assert len(specs) >= 4
    assert all(s["layout"].get("showlegend") is False for s in specs)  # no plotly legend under any chart
    colours: dict[str, str] = {}  # legendgroup -> colour of its line traces, the same on every chart
    for s in specs:
        for t in s["data"]:
            if t.get("mode") == "lines":
                assert colours.setdefault(t["legendgroup"], t["line"]["color"]) == t["line"]["color"]
    # Dash patterns from the loss chart (where a line equals another run's, as MFU here, it is dashed over it).
    loss = next(s for s in specs if s["layout"]["title"]["text"] == prep_figures.chart_title("loss"))
    lines = {t["legendgroup"]: (t["line"]["color"], t["line"].get("dash", "solid")) for t in loss["data"]
             if t.get("mode") == "lines"}
    assert set(lines) == set(colours)
    parser = _RunList()
    parser.feed(report.html.split("</head>", 1)[1])
    buttons = parser.buttons
    assert [b["text"] for b in buttons] == report.runs and len(buttons) == 15  # one button per run, name as text
    assert {b["group"] for b in buttons} == set(lines)
    for b in buttons:
        colour, dash = lines[b["group"]]
        assert b["stroke"] == colour and b["dasharray"] == prep_preview.SVG_DASHES.get(dash), b
        assert b["pressed"] == "true"
    # The dashboard's colours (runs.run_styles over the root's runs, oldest first); past 13 runs, dashed.
    styles = prep_runs.run_styles(prep_runs.claim_order(prep_runs.list_runs(root)))
    assert {prep_figures.text(n): s.colour for n, s in styles.items()} == {g: c for g, (c, _) in lines.items()}
    assert lines[prep_figures.text("run-13")][1] == "dash" and len({c for c, _ in lines.values()}) == 13
    assert "<img" not in report.html.split("</head>", 1)[1]


@pytest.mark.slow
def test_a_runs_button_hides_and_shows_it_on_every_chart_offline(browser, root, tmp_path):
    from kforge_dash.browse.report import write_report

    out = tmp_path / "report.html"
    names = ["run-00", "run-01", HOSTILE]
    report = write_report([root], out, runs=names)
    # Per chart: `visible` of each trace of the run (its line and markers), then of each of its restart lines.
    visible = """g => [...document.querySelectorAll('.charts .js-plotly-plot')].map(gd => gd.data
        .filter(t => t.legendgroup === g).map(t => t.visible)
        .concat((gd.layout.shapes || []).filter(s => s.name === g).map(s => s.visible)))"""
    every = "g => ({visible})(g).every(v => v.length && v.every(x => x === {want}))"
    page, left = new_page(browser, allow="file", width=1400, height=1000)
    page.goto(out.as_uri())
    page.wait_for_function(CHARTS_DRAWN, arg=len(report.metrics))
    before = {n: page.evaluate(visible, prep_figures.text(n)) for n in names}
    assert all(len(vs) == len(report.metrics) for vs in before.values())
    assert all(v and all(x is True for x in v) for vs in before.values() for v in vs), before
    assert len(before["run-01"][0]) == 3  # its line, its ◆ restart marker and its restart line on the loss chart
    for name in ("run-01", HOSTILE):
        button, group = page.get_by_role("button", name=name, exact=True), prep_figures.text(name)
        button.click()
        page.wait_for_function(every.format(visible=visible, want="false"), arg=group)
        assert button.get_attribute("aria-pressed") == "false"
        assert page.evaluate(visible, prep_figures.text("run-00")) == before["run-00"]  # the other runs stay
        button.click()
        page.wait_for_function(every.format(visible=visible, want="true"), arg=group)
        assert button.get_attribute("aria-pressed") == "true"
    # A real button in the tab order: Tab from run-01's reaches the next run's, Enter hides that run.
    page.get_by_role("button", name="run-01", exact=True).focus()
    page.keyboard.press("Tab")
    assert page.evaluate("() => document.activeElement.textContent") == HOSTILE
    page.keyboard.press("Enter")
    page.wait_for_function(every.format(visible=visible, want="false"), arg=prep_figures.text(HOSTILE))
    assert left == []
    page.context.close()
