"""TensorBoard export, read back with TensorBoard's own EventAccumulator (no size limit)."""

from __future__ import annotations

import glob
import math
import os
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
from export_fixtures import INF_GRAD_STEP, MISSING_RANK, NAN_LOSS_STEP, expected_points, make_ingested_run, read_back, same

from kforge_dash.export.run import export_run
from kforge_dash.export.tensorboard import kforge_event_files


# The documented column -> tag mapping (README / export_history), written out here independently.
def test_every_point_every_tag_matches_steps_parquet(tmp_path):
    run = make_ingested_run(tmp_path, n_steps=40, world_size=3)
    res = export_run(run, wandb=False)
    assert res.ok and res.wandb is None and res.upload is None
    got = read_back(run)  # the whole run directory: every event file in it
    want = expected_points(run)
    assert set(got) == set(want)
    for tag in want:
        assert same(got[tag], want[tag]), tag
    assert res.tensorboard.points == sum(len(v) for v in want.values())
    # What the fixture put in on purpose survives: NaN loss shown, inf grad norm, nulls absent.
    loss = dict((s, v) for s, _, v in got["1_train/loss"])
    assert math.isnan(loss[NAN_LOSS_STEP])
    assert dict((s, v) for s, _, v in got["1_train/grad_norm"])[INF_GRAD_STEP] == math.inf
    assert [s for s, _, _ in got["gpu/mem_peak_gib"]] == [1, 11, 21, 31]
    assert [s for s, _, _ in got["eval/loss"]] == [25]
    step, rank = MISSING_RANK
    assert step not in [s for s, _, _ in got[f"ranks/step_time_s/{rank:05d}"]]
    assert "smoothed/mfu_ema" not in got  # an all-null column makes no tag at all
    # One monotonic history across the restart.
    steps = [s for s, _, _ in got["1_train/step_time_s"]]
    assert steps == sorted(set(steps)) == list(range(1, 41))
    assert {v for _, _, v in got["run/attempt"]} == {0.0, 1.0}


def test_reexport_replaces_the_event_file_never_duplicates(tmp_path):
    run = make_ingested_run(tmp_path, n_steps=20)
    first = export_run(run, wandb=False).tensorboard
    again = export_run(run, wandb=False).tensorboard
    assert first.path == again.path
    with open(first.path, "rb") as f:
        data = f.read()
    # The run grew and its first step moved (a different file name): still exactly one file, the new history.
    make_ingested_run(tmp_path, n_steps=30, t0=1_790_000_500.0)
    grown = export_run(run, wandb=False).tensorboard
    logdir = run
    # The file before a rewrite stays (a running TensorBoard moves on from it); the new one's
    # SessionLog.START drops its points, so TensorBoard's own reader shows each point once.
    assert kforge_event_files(logdir) == [first.path, grown.path] and grown.path > first.path
    assert sorted(n for n in os.listdir(run) if "tfevents" in n) == [os.path.basename(first.path),
                                                                      os.path.basename(grown.path)]
    got, want = read_back(logdir), expected_points(run)
    assert set(got) == set(want) and all(same(got[t], want[t]) for t in want)
    assert len(got["1_train/loss"]) == 30
    # Same input, same bytes (under a later name: a rewrite that a running TensorBoard reads next).
    make_ingested_run(tmp_path, n_steps=20)
    again = export_run(run, wandb=False).tensorboard.path
    assert open(again, "rb").read() == data and os.path.basename(again) > os.path.basename(grown.path)
    assert kforge_event_files(logdir) == [grown.path, again]  # never more than two
    got, want = read_back(logdir), expected_points(run)
    assert set(got) == set(want) and all(same(got[t], want[t]) for t in want)


def test_no_rank_tags_above_the_limit(tmp_path):
    run = make_ingested_run(tmp_path, n_steps=5, world_size=3)
    res = export_run(run, wandb=False, max_rank_tags=2)
    got = read_back(res.tensorboard.path)
    assert not [t for t in got if t.startswith("ranks/step_time_s/")]
    want = expected_points(run, with_ranks=False)
    assert set(got) == set(want) and all(same(got[t], want[t]) for t in want)


def test_other_event_files_in_the_logdir_are_left_alone(tmp_path):
    run = make_ingested_run(tmp_path, n_steps=5)
    logdir = run
    mine = os.path.join(logdir, "events.out.tfevents.1.user-host")
    open(mine, "wb").close()
    export_run(run, wandb=False)
    assert os.path.exists(mine)


@pytest.mark.parametrize("damage", ["missing-steps", "corrupt-steps", "bad-summary", "unordered", "no-time"])
def test_bad_input_is_reported_naming_the_file_and_loses_nothing(tmp_path, damage):
    run = make_ingested_run(tmp_path, n_steps=10)
    ing = os.path.join(run, "ingested")
    steps = os.path.join(ing, "steps.parquet")
    if damage == "missing-steps":
        os.remove(steps)
        bad, why = steps, "not found"
    elif damage == "corrupt-steps":
        with open(steps, "r+b") as f:
            f.truncate(100)
        bad, why = steps, "not a readable Parquet file"
    elif damage == "bad-summary":
        with open(os.path.join(ing, "summary.json"), "w") as f:
            f.write("{not json")
        bad, why = os.path.join(ing, "summary.json"), "JSON"
    elif damage == "unordered":
        t = pq.read_table(steps)
        pq.write_table(t.take([1, 0] + list(range(2, t.num_rows))), steps)
        bad, why = steps, "not strictly increasing"
    else:
        pq.write_table(pq.read_table(steps).drop_columns(["time"]), steps)
        bad, why = steps, "missing column 'time'"
    before = {p: open(p, "rb").read() for p in glob.glob(os.path.join(ing, "*")) if os.path.isfile(p)}
    res = export_run(run, wandb=True)  # never raises
    assert not res.ok
    for outcome in (res.tensorboard, res.wandb):
        assert outcome.ok is False and bad in outcome.error and why in outcome.error
    after = {p: open(p, "rb").read() for p in before}
    assert after == before
    assert not kforge_event_files(run) and not os.path.exists(os.path.join(ing, "wandb"))


def test_export_needs_no_torch(tmp_path):
    run = make_ingested_run(tmp_path, n_steps=5)
    code = (
        "import sys; from kforge_dash.export.run import export_run; "
        f"r = export_run({run!r}, wandb=False); assert r.ok, r; "
        "assert 'torch' not in sys.modules, 'export imported torch'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_fast_checksum_writes_exactly_tensorboards_record_bytes(tmp_path):
    """The C CRC32C path (google-crc32c) must frame every record as tensorboard's RecordWriter does."""
    from kforge_dash.export.history import load_history
    from kforge_dash.export.tensorboard import write_tensorboard

    run = make_ingested_run(tmp_path, n_steps=30, world_size=2)
    h = load_history(run)
    slow, _ = write_tensorboard(h, str(tmp_path / "slow"), fast_crc=False)
    fast, _ = write_tensorboard(h, str(tmp_path / "fast"), fast_crc=True)
    assert open(fast, "rb").read() == open(slow, "rb").read()


def test_one_exporter_failing_does_not_stop_the_other(tmp_path):
    run = make_ingested_run(tmp_path, n_steps=5)
    os.makedirs(os.path.join(run, f".kforge-events.{os.getpid()}.tmp"))  # a folder where the temp file goes
    res = export_run(run, wandb=True)
    assert not res.ok and not res.tensorboard.ok and res.tensorboard.error
    assert res.wandb.ok and os.path.isdir(res.wandb.path)
    assert res.to_dict()["tensorboard"]["ok"] is False and res.to_dict()["upload"] is None


def test_missing_optional_packages_are_reported_with_an_install_hint(tmp_path):
    run = make_ingested_run(tmp_path, n_steps=5)
    code = (
        "import sys; sys.modules['tensorboard'] = None; sys.modules['wandb'] = None; "  # as if not installed
        "from kforge_dash.export.run import export_run; "
        f"r = export_run({run!r}); "
        "assert not r.tensorboard.ok and not r.wandb.ok, r; "
        "assert all(\"pip install 'kforge[ingest]'\" in o.error for o in (r.tensorboard, r.wandb)), r"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_user_scalar_named_like_a_kforge_tag_is_exported_under_user(tmp_path):
    import polars as pl

    run = make_ingested_run(tmp_path, n_steps=20, world_size=2)
    path = os.path.join(run, "ingested", "steps.parquet")
    steps = pl.read_parquet(path)
    steps.with_columns((pl.col("step") * 10.0).alias("1_train/loss")).write_parquet(path)
    with pytest.warns(RuntimeWarning, match="named like a kforge tag"):
        res = export_run(run, wandb=False)
    assert res.tensorboard.ok, res.tensorboard.error
    got = read_back(res.tensorboard.path)
    assert [v for _, _, v in got["user/1_train/loss"]] == [float(s * 10) for s in steps["step"].to_list()]
    expected_loss = [float(np.float32(v)) for v in steps["loss"].to_list() if v is not None]
    assert [v for _, _, v in got["1_train/loss"] if not math.isnan(v)] == [v for v in expected_loss if not math.isnan(v)]


def test_no_tensorboard_says_an_earlier_event_file_was_left_in_place(tmp_path, monkeypatch):
    from click.testing import CliRunner
    from ingest_fixtures import open_ranks, run_steps

    from kforge_dash.cli.ingest import main

    run = str(tmp_path / "run")
    recs = open_ranks(run, 1)
    run_steps(monkeypatch, recs, range(1, 6), step_time=lambda r, s: 0.1)
    for rec in recs.values():
        rec.close()
    first = CliRunner().invoke(main, [run, "--no-wandb", "-q"])
    assert first.exit_code == 0 and "note" not in first.stderr
    [old] = kforge_event_files(run)
    r = CliRunner().invoke(main, [run, "--no-wandb", "--no-tensorboard", "--force"])  # -q: no note
    assert r.exit_code == 0, r.output
    assert f"kforge-ingest: note: {old}: TensorBoard export switched off (--no-tensorboard)" in r.stderr
    assert "left as it is" in r.stderr and kforge_event_files(run) == [old]


def _tensorboard_order(a: str, b: str) -> int:
    """TensorBoard's own tag comparison (its frontend's compareTagNames, webfiles.zip index.js): runs of
    digits compare as numbers, a digit or "/" sorts before any other character, the rest by code."""
    i = j = 0
    while True:
        if i == len(a):
            return 0 if j == len(b) else -1
        if j == len(b):
            return 1
        if a[i].isdigit() and b[j].isdigit():
            i2, j2 = i, j
            while i2 < len(a) and a[i2].isdigit():
                i2 += 1
            while j2 < len(b) and b[j2].isdigit():
                j2 += 1
            x, y = int(a[i:i2]), int(b[j:j2])
            if x != y:
                return -1 if x < y else 1
            i, j = i2, j2
            continue
        first_a, first_b = a[i] == "/" or a[i].isdigit(), b[j] == "/" or b[j].isdigit()
        if first_a != first_b:
            return -1 if first_a else 1
        if not first_a and a[i] != b[j]:  # a digit against "/": no order between them, as there
            return -1 if a[i] < b[j] else 1
        i, j = i + 1, j + 1


def test_the_first_group_tensorboard_shows_is_the_training_metrics(tmp_path):
    """TensorBoard groups scalars by the tag's first path part, sorted by its compareTagNames, and opens
    the first two groups: they were eval, hw (and ranks, run, smoothed, time before train)."""
    import functools
    import shutil

    from click.testing import CliRunner
    from dash_fixtures import SAMPLE_RUNS
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from kforge_dash.cli.ingest import main

    run = tmp_path / "throttled"
    shutil.copytree(SAMPLE_RUNS / "throttled", run, ignore=shutil.ignore_patterns("ingested", "events.out.*"))
    assert CliRunner().invoke(main, [str(run), "--no-wandb", "-q"]).exit_code == 0
    ea = EventAccumulator(kforge_event_files(str(run))[-1], size_guidance={"scalars": 0})
    ea.Reload()
    tags = sorted(ea.Tags()["scalars"], key=functools.cmp_to_key(_tensorboard_order))
    groups = list(dict.fromkeys(t.split("/", 1)[0] for t in tags))
    assert {"eval", "hw", "ranks", "run", "smoothed", "time"} <= set(groups)  # the groups that came first
    assert groups[0] == "1_train", groups
    assert {"1_train/loss", "1_train/mfu", "1_train/tokens_per_sec", "1_train/step_time_s"} <= set(tags)
