"""views/chart.py's element in Chromium: a chart the page no longer shows is purged (plotly's window resize
listener and the chart's ResizeObserver kept every chart of every zoom and page alive: the JS heap grew
23 -> 97 MB in 8 zooms); under Streamlit's dark theme the charts are not white boxes.

Needs Debian's chromium at /usr/bin/chromium; playwright never downloads one."""

import re

import pytest
from browser_fixtures import DRAWN, new_page, serve, settled
from dash_fixtures import write_run

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("unmount") / "runs"
    for i in range(2):
        write_run(root, f"run{i}", n=400, seed=i, world_size=1, with_ranks=False)
    with serve(root, root.parent / "server.log") as url:
        yield url


def resize_listeners(cdp) -> int:
    """The window's 'resize' listeners (plotly adds one per responsive chart)."""
    r = cdp.send("Runtime.evaluate", {"expression": "(getEventListeners(window).resize || []).length",
                                      "includeCommandLineAPI": True, "returnByValue": True})
    return r["result"]["value"]


def backgrounds(page) -> list[str]:
    """Each chart's paper background, as plotly drew it."""
    return page.evaluate("[...document.querySelectorAll('.js-plotly-plot')].map(g => g._fullLayout.paper_bgcolor)")


def zoom_and_back(page) -> None:
    """Drag across the first chart (a new range: new chart elements), then "Whole run" (new ones again)."""
    box = page.evaluate("""() => { const gd = document.querySelector('.js-plotly-plot');
        const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis, r = gd.getBoundingClientRect();
        return {x0: r.left + xa._offset + xa._length * 0.2, x1: r.left + xa._offset + xa._length * 0.7,
                y: r.top + ya._offset + ya._length / 2}; }""")
    page.mouse.move(box["x0"], box["y"])
    page.mouse.down()
    for i in range(1, 11):
        page.mouse.move(box["x0"] + (box["x1"] - box["x0"]) * i / 10, box["y"])
    page.mouse.up()
    page.wait_for_url("**step_from=**")
    settled(page)
    page.get_by_role("button", name="Whole run").click()
    page.wait_for_function("() => !location.search.includes('step_from=')")
    settled(page)


def test_zoomed_out_and_left_charts_are_purged(browser, two_runs):
    page, left = new_page(browser)
    cdp = page.context.new_cdp_session(page)
    page.goto(two_runs + "/compare?runs=run0,run1&metrics=loss,lr")
    page.wait_for_function(DRAWN, arg=2)
    settled(page)
    charts = page.evaluate("document.querySelectorAll('.js-plotly-plot').length")
    zoom_and_back(page)  # the first zoom adds Streamlit's own listeners (the button's tooltip)
    start = resize_listeners(cdp)
    for _ in range(3):
        zoom_and_back(page)
    assert page.evaluate("document.querySelectorAll('.js-plotly-plot').length") == charts
    assert set(backgrounds(page)) == {"white"}  # the light theme keeps the report's white template
    # each round mounts every chart twice: unpurged, each old chart kept its listener (+2 per chart a round)
    assert resize_listeners(cdp) == start
    assert not left


def test_charts_follow_the_dark_theme(browser, tmp_path, monkeypatch):
    root = tmp_path / "runs"
    write_run(root, "run0", n=100, world_size=1, with_ranks=False)
    monkeypatch.setenv("STREAMLIT_THEME_BASE", "dark")
    with serve(root, tmp_path / "server.log") as url:
        page, _ = new_page(browser)
        page.goto(url + "/compare?runs=run0&metrics=loss,lr")
        page.wait_for_function(DRAWN, arg=2)
        settled(page)
        assert set(backgrounds(page)) == {"rgba(0,0,0,0)"}  # Streamlit's dark background shows through
        fonts = page.evaluate("[...document.querySelectorAll('.js-plotly-plot')].map(g => g._fullLayout.font.color)")
        assert fonts and all(sum(map(int, re.findall(r"\d+", f)[:3])) > 3 * 128 for f in fonts)  # light text
