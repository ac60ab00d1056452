"""One runs table for the dashboard and kforge-report: the same columns, in the same order, with the same
labels, tooltips and note (they differed: `gpus` read "ranks" on the page, the report had "hardware")."""

from __future__ import annotations

import json
import shutil
from html.parser import HTMLParser
from pathlib import Path

from dash_fixtures import SAMPLE_RUNS, ingest_sample_run, shown
from streamlit.testing.v1 import AppTest

from kforge_dash import column_registry as reg
from kforge_dash.browse.report import build_report

APP = Path(__file__).resolve().parent.parent / "kforge_dash" / "browse" / "app.py"


class _RunsTable(HTMLParser):
    """The header cells (text, title) and body cells of the report's <table class="runs">, and the note above it."""

    def __init__(self):
        super().__init__()
        self.head, self.rows, self.note = [], [], None
        self._in, self._cell, self._title, self._key = None, None, None, False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table" and a.get("class") == "runs":
            self._in = "table"
        elif tag == "p" and a.get("class") == "key" and self.note is None and not self.head:
            self._key, self.note = True, ""
        elif self._in and tag in ("th", "td"):
            self._cell, self._title = "", a.get("title")
        elif self._in and tag == "tr":
            self._row = []

    def handle_endtag(self, tag):
        if tag == "table" and self._in:
            self._in = None
        elif tag == "p":
            self._key = False
        elif self._in and tag == "th":
            self.head.append((self._cell, self._title))
            self._cell = None
        elif self._in and tag == "td":
            self._row.append(self._cell)
            self._cell = None
        elif self._in and tag == "tr" and self._row:
            self.rows.append(self._row)

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data
        elif self._key:
            self.note += data


def test_the_dashboard_and_the_report_show_one_runs_table(tmp_path, monkeypatch):
    for name in ("straggler", "preempted"):  # CPU runs: no peak mem, said once above the table in both
        shutil.copytree(SAMPLE_RUNS / name, tmp_path / name, ignore=shutil.ignore_patterns("ingested", "events.out.*"))
        ingest_sample_run(tmp_path / name)
    monkeypatch.setenv("KFORGE_DASH_ROOT", str(tmp_path))
    at = AppTest.from_file(str(APP), default_timeout=300).run()
    at.switch_page("views/runs.py").run()
    assert not at.exception
    grid = at.dataframe[0]
    config = json.loads(grid.proto.columns)
    page = [(config[c]["label"], config[c].get("help")) for c in grid.proto.column_order]
    report = _RunsTable()
    report.feed(build_report([tmp_path]).html)
    assert report.head == page  # same columns, order, labels and tooltips
    labels = [label for label, _ in page]
    assert labels[:5] == ["run", "findings", "warnings", "goodput", "restarts"]
    assert reg.label("world_size") == "ranks" and "ranks" in labels and "hardware" not in labels
    assert "gpus" not in labels and "peak mem" not in labels  # null on every row: said once
    assert report.note == shown(at.caption[0].value) == "Every run: ingested · device CPU · no peak mem"
    # each cell reads as the page formats it (the column registry's format)
    shown_table = grid.value.set_index("run")
    for row in report.rows:
        for (label, _), cell, column in zip(page, row, grid.proto.column_order):
            value = row[0] if column == "run" else shown_table.loc[row[0], column]
            assert cell == (value.strip() if isinstance(value, str) else reg.REGISTRY[column].text(value)), (label, cell)
