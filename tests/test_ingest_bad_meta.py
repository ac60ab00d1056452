"""A meta.json that is missing, unreadable, wrong-typed or from a newer kforge: its rows are kept where
they can be (with a warning naming the file and the key), refused with a clear message where not."""

import glob
import json
import os

import pytest
from ingest_fixtures import read_outputs, warns_each
from parts_fixtures import make_run, read_outputs_by_path, small_run

from kforge_dash.ingest.options import IngestError, IngestOptions, IngestWarning
from kforge_dash.ingest.run import ingest_run


def test_missing_and_unreadable_meta_keep_rows(tmp_path, monkeypatch):
    run = make_run(tmp_path / "run", monkeypatch, world=3)
    metas = sorted(os.path.join(d, "meta.json") for d, _, f in os.walk(run) if "meta.json" in f)
    os.remove(metas[1])
    open(metas[2], "w").write("{not json")
    with pytest.warns(UserWarning, match="meta.json"):
        ingest_run(run)
    steps, ranks, summary = read_outputs(run)
    assert ranks.height == 3 * 20 and steps["n_ranks"].to_list() == [3] * 20
    assert sum(metas[1] in w and "missing" in w for w in summary["warnings"]) == 1
    assert sum(metas[2] in w and "unreadable" in w for w in summary["warnings"]) == 1
    assert len(summary["attempts"]) == 1  # still recognised as one launch (start time from the attempt id)


def test_a_missing_meta_says_tokens_are_assumed_counted(tmp_path, monkeypatch):
    run = small_run(str(tmp_path / "nometa"), monkeypatch)
    d = os.path.join(run, "rank-00001")
    meta = os.path.join(d, os.listdir(d)[0], "meta.json")
    os.remove(meta)
    with pytest.warns(IngestWarning, match="meta.json: missing"):
        ingest_run(run)
    steps, _, summary = read_outputs(run)
    assert steps["tokens"].to_list() == [20] * 5  # rank 1's tokens still counted
    said = [w for w in summary["warnings"] if meta in w]
    assert len(said) == 1 and "missing" in said[0] and "assumed counts_tokens=True" in said[0]


def test_wrong_typed_meta_fields_are_ignored_with_a_warning_naming_file_and_key(tmp_path, monkeypatch):
    run = make_run(tmp_path / "run", monkeypatch, world=2)
    [meta_path] = glob.glob(os.path.join(glob.escape(run), "rank-00000", "*", "meta.json"))
    with open(meta_path) as f:
        meta = json.load(f)
    meta.update(device="gpu", peak_tflops="fast", world_size="two", counts_tokens="yes")
    with open(meta_path, "w") as f:
        json.dump(meta, f)
    with warns_each(*(f"meta.json: field '{key}' is str" for key in ("device", "peak_tflops", "world_size", "counts_tokens"))):
        ingest_run(run)
    steps, _, summary = read_outputs_by_path(run)
    assert steps.height == 20 and steps["tokens"].to_list() == [20] * 20  # rows of both ranks, tokens counted
    for key in ("device", "peak_tflops", "world_size", "counts_tokens"):
        assert [w for w in summary["warnings"] if meta_path in w and repr(key) in w and "ignored" in w], key
    assert summary["device"] is None and summary["peak_tflops"] is None
    assert summary["world_size"] == 2  # rank 1's meta.json says so


def test_peak_override_still_gives_mfu_when_the_recorded_peak_is_garbage(tmp_path, monkeypatch):
    run = make_run(tmp_path / "run", monkeypatch, world=1)
    [meta_path] = glob.glob(os.path.join(glob.escape(run), "rank-00000", "*", "meta.json"))
    with open(meta_path) as f:
        meta = json.load(f)
    meta.update(peak_tflops=[1, 2], device={"name": 7, "type": "cuda"})
    with open(meta_path, "w") as f:
        json.dump(meta, f)
    with warns_each("field 'device.name' is int 7", "field 'peak_tflops' is list"):
        res = ingest_run(run, options=IngestOptions(peak_tflops=100.0, flops_per_token=1e9))
    assert [w for w in res.summary["warnings"] if "'device.name'" in w and meta_path in w]
    assert res.summary["peak_tflops"] == 100.0 and res.summary["mean_mfu"] is not None


def test_newer_schema_meta_is_refused_with_a_clear_message(tmp_path, monkeypatch):
    run = make_run(tmp_path / "run", monkeypatch)
    meta_path = next(os.path.join(d, "meta.json") for d, _, f in os.walk(run) if "meta.json" in f and "rank-00001" in d)
    meta = json.load(open(meta_path))
    meta["schema_version"] = "2.0"
    json.dump(meta, open(meta_path, "w"))
    with pytest.warns(UserWarning, match="newer"):
        ingest_run(run)
    _, ranks, summary = read_outputs(run)
    assert ranks["rank"].unique().to_list() == [0]
    assert any(meta_path in w and "schema 2.0" in w and "upgrade kforge" in w for w in summary["warnings"])
    # all attempts newer: nothing to ingest -> an error naming the run
    meta0 = meta_path.replace("rank-00001", "rank-00000")
    d0 = os.path.dirname(os.path.dirname(meta0))
    m0 = os.path.join(d0, os.listdir(d0)[0], "meta.json")
    meta = json.load(open(m0))
    meta["schema_version"] = "2.0"
    json.dump(meta, open(m0, "w"))
    with pytest.raises(IngestError, match=f"{run}: no readable rows"):
        ingest_run(run)
