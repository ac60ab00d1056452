"""The runs table page in headless Chromium at 1400x1000: the whole table fits the window (findings and
warnings included, no horizontal scroll) and the config diff's run pills wear the runs' own colours.

The screenshot goes to $KFORGE_SCREENSHOT_RUNS or tmp_path."""

import os
from pathlib import Path

import pytest
from browser_fixtures import new_page, serve
from dash_fixtures import copy_and_ingest_sample_runs, sample_run_names

from kforge_dash.browse import runs as prep_runs

pytestmark = [pytest.mark.slow]
WIDTH, HEIGHT = 1400, 1000


def rgb_hex(css: str) -> str:
    r, g, b = (int(v) for v in css[css.index("(") + 1:css.index(")")].split(",")[:3])
    return f"#{r:02x}{g:02x}{b:02x}"


def test_the_runs_table_fits_1400px_and_the_diff_pills_wear_the_runs_colours(browser, tmp_path):
    root = copy_and_ingest_sample_runs(tmp_path / "runs")
    names = sample_run_names()
    colours = prep_runs.run_colours(prep_runs.claim_order(prep_runs.list_runs(root)))
    shot = Path(os.environ.get("KFORGE_SCREENSHOT_RUNS") or tmp_path / "runs-1400x1000.png")
    with serve(root, tmp_path / "server.log") as url:
        page, left = new_page(browser, width=WIDTH, height=HEIGHT)
        page.goto(url + "/runs")
        page.get_by_text("keys differ", exact=False).wait_for()
        grid = page.locator(".stDataFrame").first  # the runs table (the config diff's comes after it)
        table = grid.locator(".dvn-scroller")
        table.wait_for()
        # The grid draws its columns on a canvas: the scroller's widths say whether any column is off
        # the right edge; its accessible header row names the columns drawn.
        page.wait_for_function("() => document.querySelector('.stDataFrame').querySelectorAll('th').length >= 10")
        size = table.evaluate("e => [e.scrollWidth, e.clientWidth]")
        assert size[0] <= size[1], size
        box = grid.bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= WIDTH, box
        headers = grid.locator("th").all_text_contents()
        assert "findings" in headers and "warnings" in headers, headers
        tags = page.locator(".st-key-diff_runs [data-tag-index]")
        assert tags.count() == len(names)
        for i in range(tags.count()):
            name = tags.nth(i).get_attribute("aria-label")
            assert rgb_hex(tags.nth(i).evaluate("e => getComputedStyle(e).backgroundColor")) == colours[name].lower(), name
        shot.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(shot))
        assert left == []


def test_the_runs_table_shows_every_run_without_scrolling_inside_it(browser, tmp_path):
    """Streamlit's default table shows 10 rows and scrolls inside itself: the 11th run was hidden."""
    from dash_fixtures import write_run

    for i in range(14):
        write_run(tmp_path / "runs", f"run-{i:02d}", n=20)
    with serve(tmp_path / "runs", tmp_path / "server.log") as url:
        page, left = new_page(browser, width=WIDTH, height=HEIGHT)
        page.goto(url + "/runs")
        page.get_by_text("Config diff", exact=True).wait_for()
        table = page.locator(".stDataFrame").first.locator(".dvn-scroller")
        table.wait_for()
        page.wait_for_function("() => document.querySelector('.stDataFrame').querySelectorAll('th').length >= 10")
        size = table.evaluate("e => [e.scrollHeight, e.clientHeight]")
        assert size[0] <= size[1] + 1, size
        assert left == []
