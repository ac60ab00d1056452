"""The nonfinite finding and its hint: ranks.parquet says which float columns may hold NaN/inf, and the
finding reads only those, with the same findings as a full read."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from findings_fixtures import nan_run

from kforge_dash import ingest_run
from kforge_dash.contract import RANKS_NONFINITE_KEY
from kforge_dash.findings.finding import RunFacts
from kforge_dash.findings.nonfinite import nonfinite_findings
from kforge_dash.findings.thresholds import FindingsOptions
from kforge_dash.ingest.rowpass.ranks_writer import may_be_nonfinite


@pytest.mark.filterwarnings("ignore::kforge_dash.ingest.options.IngestWarning")
def test_ranks_parquet_names_exactly_the_float_columns_with_nan_or_inf(tmp_path, monkeypatch):
    run = nan_run(tmp_path, monkeypatch)
    ingest_run(run)
    path = f"{run}/ingested/ranks.parquet"
    listed = json.loads(pq.read_metadata(path).metadata[RANKS_NONFINITE_KEY.encode()])
    assert listed == ["grad_norm", "loss"]
    df = pl.read_parquet(path)  # the claim holds for every other float column
    for c, dt in df.schema.items():
        if dt == pl.Float64 and c not in listed:
            assert df[c].drop_nulls().is_finite().all(), c


@pytest.mark.filterwarnings("ignore::kforge_dash.ingest.options.IngestWarning")
def test_nonfinite_findings_are_the_same_with_the_hint_and_without_it(tmp_path, monkeypatch):
    run = nan_run(tmp_path, monkeypatch)
    ingest_run(run)
    steps = pl.read_parquet(f"{run}/ingested/steps.parquet")
    path = f"{run}/ingested/ranks.parquet"
    bare = str(tmp_path / "bare.parquet")  # the same rows from another writer: no key, every column read
    pq.write_table(pq.read_table(path).replace_schema_metadata(None), bare)

    def found(p):
        facts = RunFacts(steps=steps, ranks_path=p, launches=[], summary={}, opts=FindingsOptions(), phases=None,
                         hosts={})
        return sorted((f.metric, f.first_step, f.ranks, f.score, f.message) for f in nonfinite_findings(facts))

    with_hint = found(path)
    assert [m for m, *_ in with_hint] == ["grad_norm", "loss"]
    # the message names the metric as the other findings and the pages do (the column registry's label)
    assert [msg.split(" first went")[0] for *_, msg in with_hint] == ["grad norm", "loss"]
    assert with_hint == found(bare)


def test_may_be_nonfinite_is_false_only_when_every_value_is_finite():
    assert not may_be_nonfinite(pa.chunked_array([[1.0, 2.0], [3.0]]))
    assert not may_be_nonfinite(pa.chunked_array([pa.array([], pa.float64())]))
    for bad in (float("nan"), float("inf"), -float("inf")):
        assert may_be_nonfinite(pa.chunked_array([[1.0], [2.0, bad]]))
    # A slice looks only at its own values, not at the buffer around it.
    arr = pa.array([np.nan, 1.0, 2.0, np.inf])
    assert not may_be_nonfinite(pa.chunked_array([arr.slice(1, 2)]))
    assert may_be_nonfinite(pa.chunked_array([arr.slice(2, 2)]))
    # Huge finite values whose sum overflows: a false alarm (the file is read), never a miss.
    assert may_be_nonfinite(pa.chunked_array([[1e308, 1e308]]))


