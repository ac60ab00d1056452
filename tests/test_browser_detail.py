"""Headless Chromium on the run detail page and the static report: every chart
inside its own cell on open, the key names the ★, findings in full with real buttons.

Screenshots go to $KFORGE_SCREENSHOT_DETAIL / $KFORGE_SCREENSHOT_REPORT (docs/screenshot-detail.png,
docs/screenshot-report.png) or tmp_path.
"""

import json
import os
from pathlib import Path

import pytest
from browser_fixtures import CHARTS_DRAWN, new_page, serve, still

pytestmark = [pytest.mark.slow]


# Each chart's rendered SVG and legend against its grid cell, in page pixels.
_BOXES = """() => [...document.querySelectorAll('.chart')].map(cell => {
  const c = cell.getBoundingClientRect(), svg = cell.querySelector('.main-svg').getBoundingClientRect();
  const leg = cell.querySelector('.legend'), l = leg ? leg.getBoundingClientRect() : svg;
  return {cell: [c.left, c.right], svg: [svg.left, svg.right], legend: [l.left, l.right],
          title: (cell.layout.title || {}).text}; })"""


def test_report_charts_sit_inside_their_cells_on_open_at_every_width(browser, sample_runs_copy, tmp_path):
    from kforge_dash.browse.report import write_report

    out = tmp_path / "report.html"
    report = write_report([sample_runs_copy], out)
    shot = Path(os.environ.get("KFORGE_SCREENSHOT_REPORT") or tmp_path / "screenshot-report.png")
    for width in (1280, 1400, 1920):
        page, left = new_page(browser, allow="file", width=width, height=1000)
        page.goto(out.as_uri())
        page.wait_for_function(CHARTS_DRAWN, arg=len(report.metrics))  # no resize: as opened
        boxes = page.evaluate(_BOXES)
        assert len(boxes) == len(report.metrics) >= 4
        for b in boxes:
            (c0, c1), (s0, s1), (l0, l1) = b["cell"], b["svg"], b["legend"]
            assert c0 - 1 <= s0 and s1 <= c1 + 1, (width, b)  # the plot inside its cell (was ~1,350 px in 670)
            assert c0 - 1 <= l0 and l1 <= c1 + 1, (width, b)
        key = page.get_by_text("Key:", exact=False).inner_text()
        assert all(mark in key for mark in ("◆", "×", "▲", "★")), key
        if width == 1400:
            shot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(shot))
        assert left == []
        page.context.close()
    # The ★ the key names is drawn on the spike run's loss chart.
    page, _ = new_page(browser, allow="file", width=1400, height=1000)
    page.goto(out.as_uri())
    page.wait_for_function(CHARTS_DRAWN, arg=len(report.metrics))
    stars = page.evaluate("""() => [...document.querySelectorAll('.js-plotly-plot')].flatMap(gd => gd._fullData
        .filter(d => d.marker && d.marker.symbol === 'star').map(d => Array.from(d.y).map(Number))).flat()""")
    assert stars and max(stars) > 3.5  # at the raw peak (3.8), not the smoothed edge
    page.context.close()


def test_run_detail_findings_are_whole_and_their_buttons_work_from_the_keyboard(browser, sample_runs_copy, tmp_path):
    summary = json.loads((sample_runs_copy / "spike-nan" / "ingested" / "summary.json").read_text())
    shot = Path(os.environ.get("KFORGE_SCREENSHOT_DETAIL") or tmp_path / "screenshot-detail.png")
    with serve(sample_runs_copy, tmp_path / "server.log") as url:
        page, left = new_page(browser, width=1400, height=1000)
        # The picture: the straggler run (one finding, then the goodput waterfall) as a user first sees it.
        page.goto(url + "/detail?run=straggler")
        page.get_by_role("button", name="Open steps 1–250").wait_for()
        page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot .main-svg').length >= 2")
        still(page, 1000)  # plotly's transitions have ended before the picture
        shot.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(shot))
        page.goto(url + "/detail?run=spike-nan")
        page.get_by_role("heading", name="Run detail", exact=True).wait_for()
        page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot .main-svg').length >= 2")
        for f in summary["findings"]:  # every message in full, on the page as text (find-in-page reaches it)
            el = page.get_by_text(f["message"], exact=True)
            el.wait_for()
            assert el.evaluate("e => e.scrollWidth <= e.clientWidth + 1"), f["message"]
        assert page.get_by_text("None", exact=True).count() == 0
        page.get_by_test_id("stMetricValue").first.wait_for()
        for value in page.get_by_test_id("stMetricValue").all():  # header values are not cut ("2.4894…")
            assert value.evaluate("e => e.scrollWidth <= e.clientWidth + 1"), value.inner_text()
        button = page.get_by_role("button", name="Open steps 151–162")
        button.focus()  # a real button in the page's tab order, not a link drawn in a canvas grid
        assert page.evaluate("() => document.activeElement.innerText").strip() == "Open steps 151–162"
        page.keyboard.press("Enter")
        page.locator(".js-plotly-plot .gtitle", has_text="steps 151–162").wait_for()
        assert "focus=151-162" in page.url
        assert left == []


def test_run_detail_open_steps_scrolls_to_its_charts_and_the_per_rank_section_fits(browser, sample_runs_copy, tmp_path):
    """spike-nan at 1280x1000: after "Open steps 151–162" only the URL changed (the charts opened ~900 px
    below, out of view); the per-rank chart's title was cut at its half-width column ("...was the longe");
    the per-rank controls sat above their "Per rank" heading."""
    with serve(sample_runs_copy, tmp_path / "server.log") as url:
        page, left = new_page(browser, width=1280, height=1000)
        page.goto(url + "/detail?run=spike-nan")
        button = page.get_by_role("button", name="Open steps 151–162")
        button.wait_for()
        page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot .main-svg').length >= 2")
        assert page.locator(".js-plotly-plot .gtitle", has_text="steps 151–162").count() == 0
        button.click()
        chart = page.locator(".js-plotly-plot", has=page.locator(".gtitle", has_text="steps 151–162"))
        chart.wait_for()
        assert "focus=151-162" in page.url
        # The page moves to the opened charts: their top comes into the viewport (a condition, not a sleep).
        page.wait_for_function("""() => { const g = [...document.querySelectorAll('.js-plotly-plot')].find(
            e => (e.querySelector('.gtitle') || {}).textContent === 'steps 151–162');
            const top = g.getBoundingClientRect().top; return top >= 0 && top < window.innerHeight - 200; }""",
                               timeout=60_000)
        # The "Per rank" heading comes before its controls.
        heading = page.get_by_role("heading", name="Per rank", exact=True)
        heading.scroll_into_view_if_needed()
        metric = page.get_by_text("per-rank metric", exact=True)
        assert heading.bounding_box()["y"] + heading.bounding_box()["height"] <= metric.bounding_box()["y"]
        # The slowest-own-work chart's title whole inside its chart (SVG text is clipped, not wrapped).
        slow = page.locator(".js-plotly-plot", has=page.locator(".gtitle", has_text="own work"))
        slow.scroll_into_view_if_needed()
        fit = slow.evaluate("""g => { const t = g.querySelector('.gtitle').getBoundingClientRect(),
            s = g.querySelector('.main-svg').getBoundingClientRect();
            return {title: [t.left, t.right], svg: [s.left, s.right], text: g.querySelector('.gtitle').textContent}; }""")
        (t0, t1), (s0, s1) = fit["title"], fit["svg"]
        assert s0 <= t0 and t1 <= s1, fit
        assert left == []
        page.context.close()
