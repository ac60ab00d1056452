"""kforge-report: one self-contained HTML file of the compare charts, the runs table, the config
diff and each run's restarts, non-finite steps, findings and goodput, for a cluster without a
browser (copy it to a laptop: plotly's JavaScript is embedded, opening it makes no network request).

Charts are prepared as the dashboard prepares them (browse/series.py: full-resolution smoothing,
then MinMaxLTTB to REPORT_POINTS per line, so every spike is in the file); they zoom in the
browser, at the resolution written. Every name, tag, hparam and message from disk is HTML-escaped
(and plotly text escaped by figures.text), so a hostile run name stays text.
"""

from __future__ import annotations

import datetime as _dt
import html
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from kforge_dash import column_registry as reg
from kforge_dash import text
from kforge_dash.browse import columns as prep_columns
from kforge_dash.browse import diagnosis as prep_diagnosis
from kforge_dash.browse import figures as prep_figures
from kforge_dash.browse import findings as prep_findings
from kforge_dash.browse import findings_figures, runs_table, tables
from kforge_dash.browse import overlap as prep_overlap
from kforge_dash.browse import preview as prep_preview
from kforge_dash.browse import ranks as prep_ranks
from kforge_dash.browse import runs as prep_runs
from kforge_dash.browse import series as prep_series
from kforge_dash.browse.hang import hang_lines, hang_of
from kforge_dash.contract import STEPS_FILE, SUMMARY_FILE
from kforge_dash.run_view import RunView, run_view
from kforge_record.atomic import atomic_path

MAX_NONFINITE_ROWS = 50  # per run; the count in the heading is exact
# The report zooms in the browser only, at the resolution written (no re-query): twice the dashboard's.
REPORT_POINTS = 2000


@dataclass(frozen=True)
class ReportOptions:
    """What the report draws. `metrics` None: the dashboard's default charts present in the runs."""
    metrics: tuple[str, ...] | None = None
    x_axis: str = "step"
    smoothing: float = 0.0
    max_points: int = REPORT_POINTS
    title: str = "kforge report"

    def __post_init__(self):
        prep_series.check_view(x_axis=self.x_axis, smoothing=self.smoothing)
        if isinstance(self.max_points, bool) or not isinstance(self.max_points, int) or self.max_points < 3:
            raise ValueError(f"max_points {self.max_points!r}: must be an integer >= 3")


@dataclass
class Report:
    html: str
    runs: list[str]
    metrics: list[str]
    notes: list[str] = field(default_factory=list)  # e.g. a path without ingested runs


def _esc(v) -> str:
    return html.escape(str(v), quote=True)


@dataclass(frozen=True)
class FoundRuns:
    runs: list[prep_runs.RunInfo]  # the runs to report, in order
    notes: list[str]
    listed: list[prep_runs.RunInfo]  # every run listed under the paths, ingested or not: they claim colours


def find_runs(paths: list[str | os.PathLike], names: list[str] | None = None) -> FoundRuns:
    """Ingested runs under each PATH (a runs root, or one run directory), in order.

    `names` keeps only those runs (in the order given); a name found nowhere is a note.
    """
    found: dict[str, prep_runs.RunInfo] = {}
    listed: dict[str, prep_runs.RunInfo] = {}
    notes = []
    for p in map(Path, paths):
        if (p / "ingested" / SUMMARY_FILE).is_file():
            cands = [r for r in prep_runs.list_runs(p.resolve().parent) if r.name == p.resolve().name]
        elif p.is_dir():
            cands = prep_runs.list_runs(p)
        else:
            notes.append(f"{p}: not a directory")
            continue
        for r in cands:
            listed.setdefault(r.name, r)
        ingested = [r for r in cands if r.ingested]
        if not ingested:
            notes.append(f"{p}: no ingested run (run kforge-ingest first)")
        for r in ingested:
            if r.name in found:
                notes.append(f"{r.path}: a second run named {r.name}; the first one ({found[r.name].path}) is shown")
            else:
                found[r.name] = r
    if names is None:
        return FoundRuns(list(found.values()), notes, list(listed.values()))
    notes += [f"--runs {n}: no ingested run of that name" for n in names if n not in found]
    return FoundRuns([found[n] for n in dict.fromkeys(names) if n in found], notes, list(listed.values()))


def _table(header: list[str], rows: list[list[str]], *, cls: str = "", titles: dict[str, str] | None = None) -> str:
    """A table; ``titles``: a column's tooltip (what its number is), by its header."""
    head = "".join(f'<th title="{_esc(titles[h])}">{_esc(h)}</th>' if titles and h in titles else f"<th>{_esc(h)}</th>"
                   for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_esc(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def runs_table_html(runs: list[prep_runs.RunInfo]) -> str:
    """The dashboard's runs table (browse/runs_table.py): its columns, the registry's labels, tooltips and text."""
    data = runs_table.runs_table(runs)
    columns, rows = runs_table.table_text(data)
    note = runs_table.runs_table_note(data)
    header = [reg.label(c) for c in columns]
    return ((f'<p class="key">{_esc(note)}</p>' if note else "")
            + _table(header, rows, cls="runs", titles={reg.label(c): reg.help_of(c) for c in columns}))


def config_diff_html(runs: list[prep_runs.RunInfo]) -> str:
    changes = prep_runs.launch_changes(runs)
    if len(runs) < 2 and not changes:
        return "<p>One run, launched with one configuration: nothing to compare.</p>"
    diff = prep_runs.config_diff(runs)
    if diff.is_empty():
        return "<p>These runs have the same configuration.</p>"
    shown = tables.config_diff_text(diff, changes)
    return (_table(shown.columns, [list(row) for row in shown.iter_rows()], cls="diff")
            + f"<p>Values as JSON; {_esc(text.NOT_SET)}: the run has no such key.</p>")


def _script_json(obj) -> str:
    """JSON safe inside <script>: no '<' at all, so neither </script> nor <!-- can end it early."""
    return json.dumps(obj, separators=(",", ":")).replace("<", "\\u003c")


def charts_html(runs: list[prep_runs.RunInfo], options: ReportOptions,
                styles: dict[str, prep_runs.RunStyle]) -> tuple[str, list[str], list[str]]:
    """(the run list, divs and scripts of the charts; metrics drawn; notes). `styles`: each run's colour and dash."""
    sources = [r.source() for r in runs]
    schemas = [prep_series.steps_schema(s.steps_path) for s in sources]
    have = prep_series.available_metrics(schemas)
    if options.metrics:
        metrics = list(options.metrics)
    else:  # the default charts that some run has values for: a CPU run's memory columns are all null
        with_values = set().union(*(prep_columns.metrics_with_values(s.steps_path) for s in sources))
        metrics = prep_columns.default_metrics(have, with_values)  # the dashboard's choice (browse/columns.py)
    data = prep_series.prepare_compare(sources, metrics, x_axis=options.x_axis, smoothing=options.smoothing,
                                       max_points=options.max_points)
    colours = {r.name: styles[r.name].colour for r in runs}
    dashes = {r.name: styles[r.name].dash for r in runs}
    specs = []
    for metric in data.drawn_metrics():  # no legend per chart: the run list above them is the page's one legend
        fig = prep_figures.metric_figure(data, metric, colours, dashes=dashes, legend=False)
        specs.append(prep_figures.figure_spec(fig, metric))
    cells = "".join(f'<div class="chart" id="chart-{i}"></div>' for i in range(len(specs)))
    return (run_list_html(runs, styles) + f'<div class="charts">{cells}</div><script type="application/json" id="chart-specs">'
            f"{_script_json(specs)}</script>"), data.drawn_metrics(), prep_overlap.chart_notes([data])


def _run_figure_html(fig, name: str) -> str:
    """A run section's figure: its spec in a JSON script right after its cell; _DRAW_RUN_FIGURES draws it there."""
    return (f'<div class="run-figure"></div><script type="application/json" class="run-figure-spec">'
            f"{_script_json(prep_figures.figure_spec(fig, name))}</script>")


def run_list_html(runs: list[prep_runs.RunInfo], styles: dict[str, prep_runs.RunStyle]) -> str:
    """The page's one legend: a button per run with a swatch of its line (colour, dash); _TOGGLE hides or
    shows the run on every chart. data-group is the run's legendgroup on the charts (figures.text of its name)."""
    out = []
    for r in runs:
        st = styles[r.name]
        dash = prep_preview.SVG_DASHES.get(st.dash)
        line = (f'<line x1="0" y1="6" x2="28" y2="6" stroke="{_esc(st.colour)}" stroke-width="3"'
                + (f' stroke-dasharray="{dash}"' if dash else "") + "/>")
        out.append(f'<button type="button" class="run-toggle" aria-pressed="true" data-group="{_esc(prep_figures.text(r.name))}"'
                   f' title="hide or show this run on every chart"><svg width="28" height="12" aria-hidden="true">{line}'
                   f"</svg>{_esc(r.name)}</button>")
    return f'<div class="run-list" role="group" aria-label="runs: show or hide on every chart">{"".join(out)}</div>'


# A run-list button hides or shows its run's traces (legendgroup) and restart lines (shape name) on every
# chart; a chart not drawn yet
# takes the hidden runs when drawn (_DRAW).
_TOGGLE = """var kforgeHidden = new Set();
function kforgeVisible(data) { return data.map(function (t) { return !kforgeHidden.has(t.legendgroup); }); }
document.addEventListener("DOMContentLoaded", function () {
  document.querySelectorAll("button.run-toggle").forEach(function (b) {
    b.addEventListener("click", function () {
      var g = b.dataset.group, show = kforgeHidden.has(g);
      if (show) { kforgeHidden.delete(g); } else { kforgeHidden.add(g); }
      b.setAttribute("aria-pressed", show ? "true" : "false");
      document.querySelectorAll(".chart.js-plotly-plot").forEach(function (gd) {
        var idx = [];
        gd.data.forEach(function (t, i) { if (t.legendgroup === g) { idx.push(i); } });
        if (idx.length) { Plotly.restyle(gd, {visible: show}, idx); }
        var shapes = {};  // its restart lines
        (gd.layout.shapes || []).forEach(function (sh, i) { if (sh.name === g) { shapes["shapes[" + i + "].visible"] = show; } });
        if (Object.keys(shapes).length) { Plotly.relayout(gd, shapes); }
      });
    });
  });
});
"""
# Each chart is drawn once the whole grid is laid out (plotly sizes a chart to its cell when drawn:
# drawn while the page was still being parsed, the first cell was the page's only one, full width,
# and plotly's `responsive` follows window resizes only, so the chart overflowed its cell until one).
# A ResizeObserver keeps each chart to its cell after that (a narrower window, a font loaded late).
_DRAW = """document.addEventListener("DOMContentLoaded", function () {
  var specs = JSON.parse(document.getElementById("chart-specs").textContent);
  specs.forEach(function (s, i) {
    var cell = document.getElementById("chart-" + i), shown = kforgeVisible(s.data);
    s.data.forEach(function (t, j) { t.visible = shown[j]; });
    (s.layout.shapes || []).forEach(function (sh) { sh.visible = !kforgeHidden.has(sh.name); });
    Plotly.newPlot(cell, s.data, s.layout, s.config).then(function () {
      if (window.ResizeObserver) {
        var w = cell.clientWidth;
        new ResizeObserver(function () {
          if (cell.clientWidth !== w) { w = cell.clientWidth; Plotly.Plots.resize(cell); }
        }).observe(cell);
      }
    });
  });
});"""
_DRAW_RUN_FIGURES = """document.addEventListener("DOMContentLoaded", function () {
  document.querySelectorAll("script.run-figure-spec").forEach(function (el) {
    var s = JSON.parse(el.textContent);
    Plotly.newPlot(el.previousElementSibling, s.data, s.layout, s.config);
  });
});"""


def _findings_html(view: RunView) -> str:
    s, out = view.summary, []
    goodput = s.get("goodput")
    if isinstance(goodput, dict):
        out.append(f"<p><b>Goodput</b>: {_esc(text.percent(goodput.get('fraction')))} of the job's wall clock "
                   f"({_esc(text.duration(goodput.get('total_s')))})</p>")
        fall = prep_findings.goodput_waterfall(s)  # as the run page draws it: largest bucket first, none of 0 s
        if fall is not None:
            out.append(_run_figure_html(findings_figures.waterfall_figure(fall), "goodput_waterfall"))
    hang = hang_of(s)
    if hang is not None:  # first: what a person paged for a hung job reads first
        out.append(f'<div class="hang"><h4>Hung: {_esc(hang.get("message"))}</h4><ul>'
                   + "".join(f"<li>{_esc(line)}</li>" for line in hang_lines(hang)) + "</ul></div>")
    if view.cards:
        rows = [[c.severity, c.kind, c.facts or text.MISSING, c.message] for c in view.cards]
        out.append(f"<h4>Findings ({len(rows)})</h4>" + _table(["severity", "finding", "where", "message"], rows,
                                                               cls="findings"))
    return "".join(out)


def _diagnosis_html(view: RunView) -> str:
    """The what-if sentence and the MFU waterfall, prepared as the run page prepares them (browse/diagnosis.py).
    The figure's spec sits in a JSON script right after its cell; _DRAW_RUN_FIGURES draws it there."""
    out = []
    if view.what_if:
        out.append(f'<p class="what-if">{_esc(view.what_if)}</p>')
    fall = prep_diagnosis.mfu_waterfall(view.summary)
    if fall is not None:
        out.append(_run_figure_html(findings_figures.mfu_waterfall_figure(fall), "mfu_waterfall"))
    return "".join(out)


def _restarts_html(s: dict) -> str:
    restarts = s.get("restarts") or []
    if not restarts:
        return "<p>No restarts.</p>"
    keys = ["attempt", "resumed_at_step", "previous_last_step", "superseded_steps", "why"]
    rows = [[reg.lookup(k).text(r.get(k)) for k in keys] for r in restarts]
    # The run page's words (the column registry): each header its label, its help the tooltip.
    return f"<h4>Restarts ({len(rows)})</h4>" + _table([reg.label(k) for k in keys], rows,
                                                       titles={reg.label(k): reg.help_of(k) for k in keys})


def _nonfinite_html(r: prep_runs.RunInfo) -> str:
    try:
        nf = prep_ranks.nonfinite_steps(r.file(STEPS_FILE))
    except (ValueError, OSError) as e:
        return f"<p class=warn>{_esc(e)}</p>"
    except Exception as e:  # polars' errors on a damaged file: name the file, keep the report
        return f"<p class=warn>{_esc(r.name)}/ingested/{STEPS_FILE}: cannot be read ({_esc(type(e).__name__)})</p>"
    if nf.is_empty():
        return "<p>No NaN or inf in any metric.</p>"
    rows = [list(map(str, row)) for row in nf.head(MAX_NONFINITE_ROWS).iter_rows()]
    more = f" (first {MAX_NONFINITE_ROWS} shown)" if len(nf) > MAX_NONFINITE_ROWS else ""
    return f"<h4>Non-finite steps: {len(nf)}{more}</h4>" + _table(nf.columns, rows)


def run_section_html(r: prep_runs.RunInfo) -> str:
    s = r.summary or {}
    view = run_view(s)  # the run header as the CLI screen and the run page show it
    warnings = s.get("warnings") or []
    warn = "".join(f"<li>{_esc(w)}</li>" for w in warnings)
    return (f'<section class="run"><h3>{_esc(r.name)}</h3>'
            f"<p>{_esc(reg.label('device'))} {_esc(view.device)} · {_esc(view.wall_times)} · "
            f"MFU inputs: {_esc(view.mfu_inputs)}</p>"
            + _findings_html(view) + _diagnosis_html(view) + _restarts_html(s) + _nonfinite_html(r)
            + (f"<h4>Ingest warnings ({len(warnings)})</h4><ul>{warn}</ul>" if warnings else "")
            + "</section>")


_STYLE = """body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}table{border-collapse:collapse;
margin:.5em 0;font-size:13px}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}th{background:#f4f4f4}
.charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(560px,1fr));gap:12px}.chart{height:380px;min-width:0}
.warn{color:#a40}section.run{border-top:1px solid #ccc;margin-top:1em}table.findings td:last-child{min-width:30em}
.key{font-size:13px;color:#555}
.run-list{display:flex;flex-wrap:wrap;gap:6px;margin:.3em 0 .8em}.run-toggle{font:inherit;font-size:13px;cursor:pointer;
display:inline-flex;align-items:center;gap:6px;padding:3px 10px;border:1px solid #bbb;border-radius:999px;background:#fff}
.run-toggle[aria-pressed=false]{opacity:.45;text-decoration:line-through}.run-toggle:focus-visible{outline:2px solid #0072B2}
.run-figure{height:380px;max-width:760px}"""


def build_report(paths: list[str | os.PathLike], *, runs: list[str] | None = None,
                 options: ReportOptions = ReportOptions()) -> Report:
    """The report's HTML for the ingested runs under `paths` (optionally only `runs`)."""
    from plotly.offline import get_plotlyjs

    found = find_runs(paths, runs)
    chosen, notes = found.runs, found.notes
    if not chosen:
        raise ValueError("no ingested run to report: " + "; ".join(notes or ["nothing found"]))
    # The dashboard's colours: every run under the paths claims one, oldest first (runs.run_styles).
    styles = prep_runs.run_styles(prep_runs.claim_order(found.listed))
    charts, metrics, chart_notes = charts_html(chosen, options, styles)
    notes += chart_notes
    when = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    body = (
        f"<h1>{_esc(options.title)}</h1><p>{text.counted(len(chosen), 'run')}, generated {when}. Charts: up to "
        f"{options.max_points:,} points per line (MinMaxLTTB keeps every local extreme); drag to zoom, "
        "double-click to reset; the camera button saves a chart as PNG; a run's button above the charts hides or "
        "shows it on every chart. Key: ◆ restart · × NaN · ▲/▼ ±inf · "
        "★ loss or grad-norm spike (a finding, at its raw peak) · faint dotted: steps a restart superseded</p>"
        + "".join(f"<p class=warn>{_esc(n)}</p>" for n in notes)
        + f"<h2>Charts</h2>{charts}<script>{_TOGGLE}{_DRAW}{_DRAW_RUN_FIGURES}</script>"
        + f"<h2>Runs</h2>{runs_table_html(chosen)}<h2>Config diff</h2>{config_diff_html(chosen)}"
        + "<h2>Each run</h2>" + "".join(run_section_html(r) for r in chosen)
    )
    page = (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{_esc(options.title)}</title>'
            # No request may leave the file: scripts and styles inline, nothing else fetched.
            '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; script-src \'unsafe-inline\' '
            "'unsafe-eval'; style-src 'unsafe-inline'; img-src data: blob:\">"
            f"<style>{_STYLE}</style><script>{get_plotlyjs()}</script></head><body>{body}</body></html>")
    return Report(page, [r.name for r in chosen], metrics, notes)


def write_report(paths: list[str | os.PathLike], out: str | os.PathLike, *, runs: list[str] | None = None,
                 options: ReportOptions = ReportOptions()) -> Report:
    """build_report, written atomically to `out`; its folder is created when missing (as `mkdir -p`).

    OSError (a folder that cannot be made, `out` a directory, no permission) names the path."""
    report = build_report(paths, runs=runs, options=options)
    folder = Path(out).parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OSError(e.errno, f"cannot create the folder {folder} ({e.strerror or e})") from None
    if Path(out).is_dir():
        raise IsADirectoryError(f"{out} is a directory, not a file to write")
    with atomic_path(str(out)) as tmp:
        Path(tmp).write_text(report.html, encoding="utf-8")
    return report
