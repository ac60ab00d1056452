"""The landing page's first screen in headless Chromium: the first chart wholly
visible at 1400x1000, one legend for the page, and runs told apart by colour, read from the plot's own data.

The screenshot of the landing page goes to $KFORGE_SCREENSHOT (docs/screenshot-compare.png) or tmp_path.
"""

import colorsys
import itertools
import json
import os
import re
import urllib.parse
from pathlib import Path

import pytest
from browser_fixtures import DRAWN, new_page, serve, settled, still
from dash_fixtures import copy_and_ingest_sample_runs, lab, sample_run_names, write_run

pytestmark = [pytest.mark.slow]
WIDTH, HEIGHT = 1400, 1000

LINES = """() => { const out = {}; for (const gd of document.querySelectorAll('.js-plotly-plot')) {
    for (const d of gd._fullData || []) if (d.mode === 'lines' && d.opacity === 1)
        out[d.name] = [d.line.color, d.line.dash]; } return out; }"""


def rgb_hex(css: str) -> str:
    """'rgb(0, 114, 178)' (a computed style) or '#0072B2' (plotly) as '#0072b2'."""
    if css.startswith("#"):
        return css.lower()
    r, g, b = (int(v) for v in css[css.index("(") + 1:css.index(")")].split(",")[:3])
    return f"#{r:02x}{g:02x}{b:02x}"


def greys(colours) -> list[str]:
    return [c for c in colours if colorsys.rgb_to_hsv(*(int(c[i:i + 2], 16) / 255 for i in (1, 3, 5)))[1] < 0.25]


def test_first_chart_wholly_on_the_first_screen_with_one_legend_in_the_runs_colours(browser, tmp_path):
    root = copy_and_ingest_sample_runs(tmp_path / "runs")
    names = sample_run_names()
    shot = Path(os.environ.get("KFORGE_SCREENSHOT") or tmp_path / "screenshot-compare.png")
    with serve(root, tmp_path / "server.log") as url:
        page, left = new_page(browser, width=WIDTH, height=HEIGHT)
        page.goto(url + "/")
        page.wait_for_function(DRAWN, arg=4)
        settled(page)
        first = page.locator(".js-plotly-plot").first.bounding_box()
        # The whole first chart, title to x axis, is inside the 1400x1000 window without scrolling.
        assert page.evaluate("() => window.scrollY") == 0
        assert first["y"] >= 0 and first["x"] >= 0, first
        assert first["y"] + first["height"] <= HEIGHT and first["x"] + first["width"] <= WIDTH, first
        # One legend for the page: no chart draws its own.
        assert page.locator(".js-plotly-plot .legendtext").count() == 0
        pills = page.locator(".st-key-legend button")
        assert sorted(pills.all_text_contents()) == names
        lines = {n: rgb_hex(c) for n, (c, _) in page.evaluate(LINES).items()}
        assert set(lines) == set(names) and len(set(lines.values())) == len(names)
        # Each legend pill and each picked run's tag in the sidebar wear the run's own line colour.
        for i, name in enumerate(pills.all_text_contents()):
            border = pills.nth(i).evaluate("e => getComputedStyle(e).borderTopColor")
            assert rgb_hex(border) == lines[name], (name, border)
        tags = page.locator(".st-key-runs [data-tag-index]")
        assert tags.count() == len(names)
        for i in range(tags.count()):
            name = tags.nth(i).get_attribute("aria-label")
            assert rgb_hex(tags.nth(i).evaluate("e => getComputedStyle(e).backgroundColor")) == lines[name], name
        # The static preview drawn while plotly.js loaded is under the plotly chart, and hidden once it is drawn.
        preview = page.locator(".st-key-preview-0")
        assert preview.locator("img").count() == 1 and preview.evaluate("e => getComputedStyle(e).display") == "none"
        still(page, 1000)  # plotly's transitions have ended before the picture
        shot.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(shot))
        # A click on a legend pill hides that run on every chart, and a second one brings it back.
        hidden = pills.first.text_content()
        pills.first.click()
        page.wait_for_function("n => !Object.keys((" + LINES + ")()).includes(n)", arg=hidden)
        assert len(page.evaluate(LINES)) == len(names) - 1
        page.locator(".st-key-legend button").first.click()
        page.wait_for_function("n => Object.keys((" + LINES + ")()).includes(n)", arg=hidden)
        assert left == []


def test_thirteen_runs_get_thirteen_distinct_colours_none_grey_and_markers_name_their_run(browser, tmp_path):
    root = tmp_path / "runs"
    names = [f"r{i:02d}" for i in range(14)]
    for i, name in enumerate(names):
        run = write_run(root, name, n=60, seed=i, restart_at=30 if i == 0 else None)
        p = run / "ingested" / "summary.json"
        s = json.loads(p.read_text())
        s["attempts"][0]["start_time"] = 1.7e9 + 60 * i  # claim order: r00 oldest
        p.write_text(json.dumps(s))
    query = "&".join("runs=" + urllib.parse.quote(n) for n in names) + "&metrics=loss"
    with serve(root, tmp_path / "server.log") as url:
        page, _ = new_page(browser, width=WIDTH, height=HEIGHT)
        page.goto(url + "/compare?" + query)
        page.wait_for_function(DRAWN, arg=1)
        settled(page)
        lines = page.evaluate(LINES)
        assert set(lines) == set(names)
        colours = {n: rgb_hex(c) for n, (c, _) in lines.items()}
        first13 = [colours[n] for n in names[:13]]
        assert len(set(first13)) == 13  # 13 runs started one after another: 13 colours
        assert len(greys(set(colours.values()))) <= 1, greys(set(colours.values()))
        close = min(sum((a - b) ** 2 for a, b in zip(lab(x), lab(y))) ** 0.5 for x, y in itertools.combinations(first13, 2))
        assert close >= 15, close  # CIELAB distance: no two of them nearly the same colour
        # The 14th run comes round to the first colour again, told apart by its dash pattern.
        assert len({tuple(v) for v in lines.values()}) == 14 and lines[names[13]][1] != lines[names[0]][1]
        # The restart marker's hover names the run it belongs to.
        texts = page.evaluate("""() => [...document.querySelectorAll('.js-plotly-plot')].flatMap(gd => gd._fullData
            .filter(d => d.mode === 'markers' && d.marker.symbol === 'diamond').flatMap(d => Array.from(d.text)))""")
        assert texts and all(t.startswith("r00: restart") for t in texts), texts


# Each cell's top and height, and the top of the page's note under the charts.
GEOMETRY = """() => ({cells: [...document.querySelectorAll('[class*=st-key-cell-]')].map(c => {
    const r = c.getBoundingClientRect(); return [c.className.match(/st-key-cell-\\d+/)[0], r.top, r.height]; }),
  skeletons: [...document.querySelectorAll('[class*=st-key-cell-] [data-testid=stSkeleton]')].filter(
    e => e.getBoundingClientRect().height > 0).length})"""
PREVIEWS = """n => [...document.querySelectorAll('[class*=st-key-preview-] img')].filter(
    i => i.complete && i.naturalWidth > 0).length >= n"""


PLOTLY_JS = re.compile(r"/plotly[^/]*\.min\.js$")


def test_nothing_moves_when_plotly_replaces_the_previews_and_no_empty_box_shows(browser, tmp_path):
    """While plotly.js loads (held here until the previews are measured) each chart's place is already
    its final size with the static preview in it: no grey placeholder, and no chart or note below it
    moves when the plotly charts arrive (it moved ~400 px down, then back up)."""
    root = copy_and_ingest_sample_runs(tmp_path / "runs")
    with serve(root, tmp_path / "server.log") as url:
        page, left = new_page(browser, width=1280, height=HEIGHT)
        held: list = []

        def hold(route):  # plotly.js (the bundle views/chart.py loads) waits until released
            held.append(route)

        page.context.route(PLOTLY_JS, hold)
        page.goto(url + "/")
        page.wait_for_function(PREVIEWS, arg=4)
        page.get_by_text("Drawing ", exact=False).first.wait_for()
        still(page, 500)
        # the 1.2 MB basic bundle, not Streamlit's 4.7 MB plotly chunk (views/chart.py)
        assert held and {r.request.url.rsplit("/", 1)[1] for r in held} == {"plotly-basic.min.js"}
        assert page.locator(".js-plotly-plot").count() == 0
        before = page.evaluate(GEOMETRY)
        note_before = page.get_by_text("Drawing ", exact=False).first.bounding_box()["y"]
        assert before["skeletons"] == 0, before
        page.context.unroute(PLOTLY_JS, hold)
        for r in held:
            r.continue_()
        page.wait_for_function(DRAWN, arg=4)
        settled(page)
        after = page.evaluate(GEOMETRY)
        assert [c[0] for c in after["cells"]] == [c[0] for c in before["cells"]]
        for (name, top0, h0), (_, top1, h1) in zip(before["cells"], after["cells"]):
            assert abs(top1 - top0) <= 2 and abs(h1 - h0) <= 2, (name, (top0, h0), (top1, h1))
        assert abs(page.get_by_text("Drawing ", exact=False).first.bounding_box()["y"] - note_before) <= 2
        assert left == []


# The hovered chart's unified hover box, its plot area and whether the box is what is painted at its centre.
HOVER = """cell => { const gd = document.querySelector('.st-key-' + cell + ' .js-plotly-plot');
    const box = gd.querySelector('.hoverlayer .legend'), plot = gd.querySelector('.nsewdrag');
    const r = e => { const q = e.getBoundingClientRect(); return [q.left, q.top, q.right, q.bottom]; };
    if (!box) return null;
    const parts = [box, ...box.querySelectorAll('*')];  // plotly's hover takes no pointer events: hit-test it
    parts.forEach(e => { e.style.pointerEvents = 'visiblePainted'; });
    const [l, t, rt, b] = r(box), hit = document.elementFromPoint((l + rt) / 2, (t + b) / 2);
    parts.forEach(e => { e.style.pointerEvents = ''; });
    const rows = [...box.querySelectorAll('.traces')].map(e => e.textContent);
    return {box: [l, t, rt, b], plot: r(plot), rows: rows.filter(x => !x.includes('superseded')).length,
            branches: rows.length - rows.filter(x => !x.includes('superseded')).length,
            painted: !!hit && box.contains(hit)}; }"""


def test_hover_box_sits_beside_its_chart_not_over_its_lines(browser, tmp_path):
    """At 1280 px the unified hover (one row per run) of a chart in either column lies outside that
    chart's plot area, wholly in the window, and is painted on top (not clipped by the chart's frame)."""
    root = copy_and_ingest_sample_runs(tmp_path / "runs")
    names = sample_run_names()
    with serve(root, tmp_path / "server.log") as url:
        page, left = new_page(browser, width=1280, height=HEIGHT)
        page.goto(url + "/")
        page.wait_for_function(DRAWN, arg=4)
        settled(page)
        for cell in ("cell-0", "cell-1"):  # the first chart of the left and of the right column
            plot = page.locator(f".st-key-{cell} .nsewdrag").bounding_box()
            page.mouse.move(plot["x"] + plot["width"] / 2, plot["y"] + plot["height"] / 2)
            page.wait_for_function("c => (" + HOVER + ")(c) !== null", arg=cell)
            got = page.evaluate(HOVER, cell)
            (bl, bt, br, bb), (pl, pt, pr, pb) = got["box"], got["plot"]
            assert br <= pl or bl >= pr or bb <= pt or bt >= pb, (cell, got)  # no overlap with the plot area
            assert 0 <= bl and br <= 1280 and 0 <= bt and bb <= HEIGHT, (cell, got)
            # one row per run; a restart's superseded branch under the pointer adds its own (named) row
            assert got["painted"] and got["rows"] == len(names), (cell, got)
            page.mouse.move(5, 5)
            page.wait_for_function("c => (" + HOVER + ")(c) === null", arg=cell)
        assert left == []
