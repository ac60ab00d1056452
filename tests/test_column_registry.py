"""The column registry (kforge_dash/column_registry.py) has words for every column an ingest writes and for
every summary.json field a page shows; the columns covered are read from the files a sample ingest writes
(whatever they are: a rollup replacing ranks.parquet is covered the same way), never listed here."""

from __future__ import annotations

import json
import shutil

import pyarrow.parquet as pq
from dash_fixtures import SAMPLE_RUNS, ingest_sample_run

from kforge_dash import column_registry as reg
from kforge_dash import run_view
from kforge_dash.contract import INGESTED_DIR, MANIFEST_FILE, SUMMARY_FILE
from kforge_record.schema import FIXED_NAMES, HW_COLUMNS, PHASE_PREFIX


def _user_scalars(run) -> set[str]:
    """What the job itself logged (not a kforge name): the shards' columns less the recorder's own."""
    names = set()
    for part in run.glob("rank-*/*/part-*.parquet"):
        names |= set(pq.read_schema(part).names)
    return {n for n in names if n not in FIXED_NAMES and n not in HW_COLUMNS and not n.startswith(PHASE_PREFIX)}


def test_every_column_an_ingest_writes_has_a_registry_entry(tmp_path):
    written, user = {}, set()
    for name in ("throttled", "preempted"):  # GPU telemetry; a restart
        run = tmp_path / name
        shutil.copytree(SAMPLE_RUNS / name, run, ignore=shutil.ignore_patterns("ingested", "events.out.*"))
        ingest_sample_run(run)
        user |= _user_scalars(run)
        for f in (run / INGESTED_DIR).glob("*.parquet"):
            if f.name != MANIFEST_FILE:  # ingest's own footer cache, not an output a page shows
                written.setdefault(f.name, set()).update(pq.read_schema(f).names)
    assert {"steps.parquet"} <= set(written) and len(written) >= 2, written
    assert user == {"eval/loss"}  # the sample jobs' own scalar: shown by its name, not kforge's to label
    for file, columns in written.items():
        missing = sorted(c for c in columns if not reg.known(c) and c not in user)
        assert not missing, f"{file}: no registry entry for {missing}"
    for c in set().union(*written.values()):
        e = reg.lookup(c)
        assert e.label and e.help and e.format in reg.FORMATS, c
        assert reg.known(c) != (c in user), c  # a user scalar is never mistaken for a kforge column
    assert reg.lookup("time/data_s").label == "data phase" and reg.lookup("time/data_s").unit == "s"
    assert reg.lookup("mem_peak_bytes").text(3 * 2**30) == "3.00 GiB"


def test_every_summary_field_a_page_shows_is_in_the_registry_and_in_summary_json(tmp_path):
    run = tmp_path / "straggler"
    shutil.copytree(SAMPLE_RUNS / "straggler", run, ignore=shutil.ignore_patterns("ingested", "events.out.*"))
    ingest_sample_run(run)
    s = json.loads((run / INGESTED_DIR / SUMMARY_FILE).read_text())
    shown = set(run_view.SUMMARY_FIELDS) | set(reg.RUNS_TABLE) - {"run", "status"}
    assert not sorted(shown - set(reg.REGISTRY)), "a summary field shown without a registry entry"
    for field in shown:  # each name is a real path in summary.json (a renamed key would show "—" everywhere)
        at = s
        for key in field.split("."):
            assert isinstance(at, dict) and key in at, f"summary.json has no {field}"
            at = at[key]
    view = run_view.run_view(s)
    assert set(view.values) == set(run_view.SUMMARY_FIELDS)
    assert view.text("goodput.fraction") == reg.REGISTRY["goodput.fraction"].text(s["goodput"]["fraction"])
    assert len({reg.label(c) for c in reg.RUNS_TABLE}) == len(reg.RUNS_TABLE)  # no two columns read alike


def test_the_reference_page_is_the_registry():
    """docs/reference/columns.md lists the registry as it is (regenerate its table with
    column_registry.markdown_table() after changing an entry)."""
    from pathlib import Path

    page = (Path(__file__).resolve().parent.parent / "docs" / "reference" / "columns.md").read_text()
    assert page.endswith(reg.markdown_table()), "docs/reference/columns.md is behind kforge_dash/column_registry.py"
