"""How long headless Chromium takes to evaluate each plotly.js bundle and draw one compare-like chart
with it (16 lines x 1,000 points, unified hover): the bundle kforge-dash loads for its charts
(kforge_dash/browse/plotlyjs/plotly-basic.min.js) next to the full plotly.min.js (the installed plotly
package's, the same plotly.js as Streamlit's 4.7 MB plotly chunk). Served from 127.0.0.1, fresh
browser context per navigation, interleaved, medians.

    python benchmarks/bench_plotly_bundles.py [--repeat 7]
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import statistics
import tempfile
import threading
from pathlib import Path

import numpy as np
import plotly
from playwright.sync_api import sync_playwright

HERE = Path(__file__).resolve().parent.parent
BUNDLES = {
    "basic (plotly.js-basic-dist-min, kforge-dash's)": HERE / "kforge_dash" / "browse" / "plotlyjs" / "plotly-basic.min.js",
    "full (plotly.min.js)": Path(plotly.__file__).parent / "package_data" / "plotly.min.js",
}
CHROMIUM = "/usr/bin/chromium"


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def page_html(script: str, fig: dict) -> str:
    return (f"<html><body><div id=g></div><script>window.t0 = performance.now()</script><script src='{script}'></script>"
            f"<script>window.t1 = performance.now(); Plotly.newPlot('g', {json.dumps(fig['data'])}, "
            f"{json.dumps(fig['layout'])}).then(() => {{ window.t2 = performance.now(); }});</script></body></html>")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    fig = {"data": [{"type": "scatter", "mode": "lines", "x": list(range(1000)), "y": rng.random(1000).round(4).tolist()}
                    for _ in range(16)], "layout": {"height": 360, "hovermode": "x unified"}}
    with tempfile.TemporaryDirectory(prefix="kforge-bench-bundles-") as tmp:
        for i, path in enumerate(BUNDLES.values()):
            (Path(tmp) / f"b{i}.js").write_bytes(path.read_bytes())
            (Path(tmp) / f"b{i}.html").write_text(page_html(f"b{i}.js", fig))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=tmp))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        times = {name: [] for name in BUNDLES}
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM)
            for _ in range(args.repeat):
                for i, name in enumerate(BUNDLES):
                    ctx = browser.new_context()
                    page = ctx.new_page()
                    page.goto(f"http://127.0.0.1:{server.server_port}/b{i}.html")
                    page.wait_for_function("window.t2 !== undefined")
                    times[name].append(page.evaluate("[t1 - t0, t2 - t1, t2]"))
                    ctx.close()
            browser.close()
        server.shutdown()
    print(f"headless Chromium, median of {args.repeat} interleaved navigations; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores\n")
    print("| bundle | size (MB) | fetch + evaluate (ms) | first chart drawn after (ms) | chart on screen from navigation (ms) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, path in BUNDLES.items():
        med = [statistics.median(t[k] for t in times[name]) for k in range(3)]
        print(f"| {name} | {path.stat().st_size / 1e6:.2f} | {med[0]:.0f} | {med[1]:.0f} | {med[2]:.0f} |")


if __name__ == "__main__":
    main()
