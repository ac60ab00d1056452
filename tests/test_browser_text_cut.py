"""No text cut at 1280 px in headless Chromium (issue 30, "seen by a new user"): the runs table's last
column (tags), the sidebar's fifth and later run, the findings' "Open steps ..." buttons and the restart
table's attempt ids."""

import json

import pytest
from browser_fixtures import new_page, serve, settled
from dash_fixtures import copy_and_ingest_sample_runs, sample_run_names

pytestmark = [pytest.mark.slow]
WIDTH, HEIGHT = 1280, 1000
# True when the element's text is drawn in full: it does not overflow its box and nothing clips it.
WHOLE = """e => { const r = e.getBoundingClientRect(), x = r.left + r.width / 2, y = r.top + r.height / 2;
    const top = document.elementFromPoint(x, y);
    return e.scrollWidth <= e.clientWidth + 1 && !!top && (e.contains(top) || top.contains(e)); }"""


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cut")
    root = copy_and_ingest_sample_runs(tmp / "runs")
    with serve(root, tmp / "server.log") as url:
        yield root, url


def test_the_runs_table_fits_1280px(browser, served):
    _, url = served
    page, left = new_page(browser, width=WIDTH, height=HEIGHT)
    page.goto(url + "/runs")
    page.get_by_text("keys differ", exact=False).wait_for()
    page.locator(".stDataFrame").first.wait_for()
    page.wait_for_function("() => document.querySelector('.stDataFrame').querySelectorAll('th').length >= 10")
    size = page.locator(".stDataFrame").first.locator(".dvn-scroller").evaluate("e => [e.scrollWidth, e.clientWidth]")
    assert size[0] <= size[1], size  # the tags column was past the right edge
    assert left == []


def test_every_selected_run_in_the_sidebar_is_whole(browser, served):
    _, url = served
    names = sample_run_names()[:7]
    page, left = new_page(browser, width=WIDTH, height=HEIGHT)
    page.goto(url + "/?" + "&".join(f"runs={n}" for n in names))
    settled(page)
    tags = page.locator(".st-key-runs [data-tag-index]")
    assert tags.count() == len(names)
    # Streamlit caps the multiselect at ~4 rows of tags and scrolls inside it: the fifth was cut in half
    scrolled = page.locator(".st-key-runs").evaluate(
        "s => [...s.querySelectorAll('div')].filter(e => e.scrollHeight > e.clientHeight + 1).length")
    assert scrolled == 0
    cut = [tags.nth(i).get_attribute("aria-label") for i in range(tags.count()) if not tags.nth(i).evaluate(WHOLE)]
    assert cut == [], cut
    assert left == []


def test_finding_buttons_and_attempt_ids_are_whole(browser, served):
    root, url = served
    page, left = new_page(browser, width=WIDTH, height=HEIGHT)
    page.goto(url + "/detail?run=spike-nan")
    buttons = page.get_by_role("button", name="Open steps", exact=False)
    buttons.first.wait_for()
    for i in range(buttons.count()):
        label = buttons.nth(i).locator("p").first
        label.scroll_into_view_if_needed()
        assert label.evaluate(WHOLE), label.text_content()  # "Open steps 10…" at 1280 px
    page.goto(url + "/detail?run=preempted")
    ids = page.get_by_text("Attempt ids", exact=False).first
    ids.wait_for()
    ids.scroll_into_view_if_needed()
    summary = json.loads((root / "preempted" / "ingested" / "summary.json").read_text())
    shown = ids.text_content()
    assert all(a["attempt_ids"][0] in shown for a in summary["attempts"]) and ids.evaluate(WHOLE)
    assert left == []
