"""The run page's restarts, lineage and per-rank phase tables and kforge-report's restarts table take their
headers (and tooltips) from the column registry; they had hand-written labels of their own ("last step
recorded", "wall lost (s)", "data (s)"; the report's table had four headers over five columns). The expected
words are read from kforge_dash/column_registry.py, never written here."""

from __future__ import annotations

import json
import re

from dash_fixtures import detail_page, write_run

from kforge_dash import column_registry as reg
from kforge_dash.browse.rank_metrics import phase_label
from kforge_dash.browse.report import build_report


def _headers(table) -> dict[str, dict]:
    """{column: its column_config} of an AppTest dataframe (label, help)."""
    return json.loads(table.proto.columns)


def _table_with(at, column: str):
    return next(d for d in at.dataframe if column in d.value.columns)


def test_the_restarts_and_lineage_tables_headers_are_the_registrys(tmp_path, monkeypatch):
    write_run(tmp_path, "resumed", n=80, restart_at=40)
    at = detail_page(tmp_path, monkeypatch, "resumed")
    assert not at.exception
    for column in ("reached_step", "segment"):  # the restarts table, the lineage table
        table = _table_with(at, column)
        config = _headers(table)
        for c in table.value.columns:
            assert config[c]["label"] == reg.lookup(c).titled, c
            assert config[c]["help"] == reg.help_of(c), c
            assert reg.known(c), f"{c}: no registry entry"
    lineage = _table_with(at, "segment")
    assert _headers(lineage)["wall_lost_s"]["label"] == reg.lookup("wall_lost_s").titled  # was "wall lost (s)"


def test_the_per_rank_phase_tables_headers_are_the_registrys(tmp_path, monkeypatch):
    write_run(tmp_path, "ranks", n=60, world_size=2)
    at = detail_page(tmp_path, monkeypatch, "ranks")
    assert not at.exception
    table = _table_with(at, phase_label("step_time_s"))
    phases = [c for c in ("time/data_s", "time/fwd_bwd_s", "time/optimizer_s")]
    shown = set(table.value.columns) - {"rank"}
    assert shown and shown <= {phase_label("step_time_s")} | {phase_label(p, waiting=w) for p in phases
                                                               for w in (False, True)}
    assert any(reg.lookup(p).label in c for p in phases for c in shown)  # "data phase (s)", not "data (s)"
    assert _headers(table)["rank"]["label"] == reg.label("rank")


def test_the_reports_restarts_table_has_a_registry_header_over_each_column(tmp_path):
    write_run(tmp_path, "resumed", n=80, restart_at=40)
    page = build_report([tmp_path]).html
    head, body = re.search(r"<h4>Restarts \(1\)</h4><table class=\"\"><thead><tr>(.*?)</tr></thead><tbody><tr>(.*?)"
                           r"</tr>", page).groups()
    headers = re.findall(r"<th[^>]*>(.*?)</th>", head)
    cells = re.findall(r"<td>(.*?)</td>", body)
    keys = ("attempt", "resumed_at_step", "previous_last_step", "superseded_steps", "why")
    assert headers == [reg.label(k) for k in keys] and len(cells) == len(headers)
    assert re.findall(r'<th title="([^"]*)"', head) == [reg.help_of(k).replace("'", "&#x27;") for k in keys]


def test_the_phase_breakdown_tables_headers_are_the_registrys(tmp_path, monkeypatch):
    write_run(tmp_path, "ranks", n=60, world_size=2)
    at = detail_page(tmp_path, monkeypatch, "ranks")
    assert not at.exception
    table = _table_with(at, "steps_ran")
    config = _headers(table)
    for c in table.value.columns:
        assert (config[c]["label"], config[c]["help"]) == (reg.lookup(c).titled, reg.help_of(c)), c
