"""kforge-import tensorboard: event files written by torch's SummaryWriter and TensorBoard's own record writer,
imported, ingested, and compared bit for bit with what TensorBoard's EventAccumulator returns."""

from __future__ import annotations

import json
import os

import pyarrow.parquet as pq
from click.testing import CliRunner
from import_fixtures import (
    FIRST_LAST,
    INF_STEP,
    NAN_STEP,
    NEG_INF_STEP,
    PURGE_STEP,
    bits,
    column_points,
    ea_scalars,
    last_per_step,
    scalar_event,
    steps_columns,
    tree_bytes,
    write_events,
    write_tb_restarted,
)
from tensorboard.compat.proto import event_pb2

from kforge_dash.cli.import_runs import main as import_main
from kforge_dash.pipeline import ingest_path


def _import(*args) -> tuple[int, str, str]:
    res = CliRunner().invoke(import_main, list(args), catch_exceptions=False)
    return res.exit_code, res.stdout, res.stderr


def _ingest(root) -> None:
    results = ingest_path(str(root), tensorboard=False, wandb=False)
    assert all(hasattr(r, "summary") for r in results), results


def test_values_restart_and_tags_match_event_accumulator_bit_for_bit(tmp_path):
    logdir, root = tmp_path / "logs", tmp_path / "root"
    write_tb_restarted(str(logdir))
    code, out, err = _import("tensorboard", str(logdir), str(root))
    assert code == 0, err
    assert "exp__a: new" in out and "b: new" in out
    _ingest(root)

    want = ea_scalars(str(logdir / "exp" / "a"))
    cols = steps_columns(str(root / "exp__a"))
    # TensorBoard purged steps >= PURGE_STEP of the first session: lr and eval/acc end before it
    assert max(s for s, _, _ in want["lr"]) == PURGE_STEP - 1
    for tag, column in {"train/loss": "loss", "lr": "lr", "eval/acc": "eval/acc", "time": "user/time"}.items():
        assert column_points(cols, column) == last_per_step(want[tag]), tag
    nonfinite = dict(column_points(cols, "lr"))
    assert nonfinite[INF_STEP] == bits(float("inf")) and nonfinite[NEG_INF_STEP] == bits(float("-inf"))
    assert dict(column_points(cols, "loss"))[NAN_STEP] != bits(0.0)  # NaN kept, and bit-equal above
    # a step's time: the latest wall time of its points
    walls = {}
    for pts in want.values():
        for s, w, _ in pts:
            walls[s] = max(walls.get(s, w), w)
    assert dict(zip(cols["step"], cols["time"])) == walls

    # the purged points are kept aside, none lost
    sup = pq.read_table(root / "exp__a" / "imported" / "superseded.parquet").to_pylist()
    assert {(r["tag"], r["step"]) for r in sup} == {(t, s) for t in ("train/loss", "lr", "eval/acc")
                                                    for s in range(PURGE_STEP, FIRST_LAST + 1)}
    assert {r["reason"] for r in sup} == {"purge_step"} and {r["superseded_at_step"] for r in sup} == {PURGE_STEP}
    # ... and drawn as a faint branch off the kept line where TensorBoard purged them (docs/restarts.md "Lineage")
    from kforge_dash.browse.figures import metric_figure
    from kforge_dash.browse.series import RunSource, prepare_compare

    src = RunSource("a", root / "exp__a" / "ingested" / "steps.parquet",
                    json.loads((root / "exp__a" / "ingested" / "summary.json").read_text()))
    (branch,) = [t for t in metric_figure(prepare_compare([src], ["loss"]), "loss", {}).data if "superseded" in (t.name or "")]
    assert list(branch.x) == list(range(PURGE_STEP - 1, FIRST_LAST + 1)) and "purged" in branch.hovertemplate

    summary = json.loads((root / "exp__a" / "ingested" / "summary.json").read_text())
    assert "imported:tensorboard" in summary["tags"]
    # two tags that could be the loss: neither is mapped, both kept by name
    b = steps_columns(str(root / "b"))
    assert all(v is None for v in b["loss"])
    want_b = ea_scalars(str(logdir / "b"))
    assert column_points(b, "train/loss") == last_per_step(want_b["train/loss"])
    assert column_points(b, "user/loss") == last_per_step(want_b["loss"])  # "loss" is kforge's: the tag is renamed
    src = json.loads((root / "b" / "imported" / "source.json").read_text())
    assert any("could each be loss" in n for n in src["notes"])


def test_reimport_is_idempotent_and_a_changed_source_replaces_the_run(tmp_path):
    logdir, root = tmp_path / "logs", tmp_path / "root"
    write_tb_restarted(str(logdir))
    assert _import("tensorboard", str(logdir), str(root))[0] == 0
    _ingest(root)
    before = tree_bytes(str(root / "exp__a"))
    mtimes = {p: os.stat(root / "exp__a" / p).st_mtime_ns for p in before}
    code, out, _ = _import("tensorboard", str(logdir), str(root))
    assert code == 0 and "exp__a: unchanged" in out
    assert tree_bytes(str(root / "exp__a")) == before
    assert {p: os.stat(root / "exp__a" / p).st_mtime_ns for p in before} == mtimes  # untouched: ingest skips it
    [attempt] = os.listdir(root / "exp__a" / "rank-00000")  # no second copy

    write_events(str(logdir / "exp" / "a" / "events.out.tfevents.9999999999.host.1.2"),
                 [event_pb2.Event(step=0, wall_time=2e9, file_version="brain.Event:2"), scalar_event(30, "lr", 7.0, 2e9)])
    code, out, _ = _import("tensorboard", str(logdir), str(root))
    assert code == 0 and "exp__a: updated" in out
    assert os.listdir(root / "exp__a" / "rank-00000") == [attempt]
    _ingest(root)
    assert column_points(steps_columns(str(root / "exp__a")), "lr")[-1] == (30, bits(7.0))


def test_steps_going_back_in_an_old_file_version_purge_by_tag_as_tensorboard_does(tmp_path):
    run, root = tmp_path / "logs" / "old", tmp_path / "root"
    run.mkdir(parents=True)
    events = [event_pb2.Event(step=0, wall_time=1.0, file_version="brain.Event:1")]
    events += [scalar_event(s, "loss", float(s), 10.0 + s) for s in range(1, 11)]
    events += [scalar_event(s, "acc", -float(s), 10.5 + s) for s in range(1, 11)]
    events += [scalar_event(s, "loss", 100.0 + s, 50.0 + s) for s in range(6, 9)]  # back to 6: loss purged >= 6
    write_events(str(run / "events.out.tfevents.1.host"), events)
    assert _import("tensorboard", str(tmp_path / "logs"), str(root))[0] == 0
    _ingest(root)
    want = ea_scalars(str(run))
    cols = steps_columns(str(root / "old"))
    assert column_points(cols, "loss") == last_per_step(want["loss"]) and len(want["loss"]) == 8
    assert column_points(cols, "acc") == last_per_step(want["acc"]) and len(want["acc"]) == 10
    sup = pq.read_table(root / "old" / "imported" / "superseded.parquet").to_pylist()
    assert [(r["tag"], r["step"], r["reason"]) for r in sup][:5] == [("loss", s, "out_of_order") for s in range(6, 11)]


def test_a_corrupt_record_is_an_error_naming_file_and_offset_and_the_points_before_it_are_imported(tmp_path):
    run, root = tmp_path / "logs" / "r", tmp_path / "root"
    run.mkdir(parents=True)
    path = run / "events.out.tfevents.1.host"
    write_events(str(path), [event_pb2.Event(step=0, wall_time=1.0, file_version="brain.Event:2")]
                 + [scalar_event(s, "loss", float(s), 10.0 + s) for s in range(1, 21)])
    data = bytearray(path.read_bytes())
    size = len(data) // 21  # roughly one record: flip a byte in the middle of the file's data
    offset = 10 * size + 20
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))
    code, out, err = _import("tensorboard", str(tmp_path / "logs"), str(root))
    assert code == 1
    assert str(path) in err and "fails its checksum at byte offset" in err
    _ingest(root)
    cols = steps_columns(str(root / "r"))
    want = ea_scalars(str(run))  # TensorBoard stops at the same record
    assert column_points(cols, "loss") == last_per_step(want["loss"]) and 0 < len(want["loss"]) < 20


def test_a_truncated_tail_is_a_warning_and_the_run_is_imported(tmp_path):
    run, root = tmp_path / "logs" / "r", tmp_path / "root"
    run.mkdir(parents=True)
    path = run / "events.out.tfevents.1.host"
    write_events(str(path), [scalar_event(s, "loss", float(s), 10.0 + s) for s in range(1, 11)])
    path.write_bytes(path.read_bytes()[:-7])  # a live file: the last record half written
    code, out, err = _import("tensorboard", str(tmp_path / "logs"), str(root))
    assert code == 0 and "warning:" in err and "cut short" in err
    _ingest(root)
    assert [s for s, _ in column_points(steps_columns(str(root / "r")), "loss")] == list(range(1, 10))


def test_hparams_of_add_hparams_reach_meta_json(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    logdir, root = tmp_path / "logs", tmp_path / "root"
    w = SummaryWriter(str(logdir / "hp"))
    w.add_hparams({"lr": 0.1, "bs": 32, "opt": "adam"}, {"hp/metric": 1.5}, run_name="trial")
    w.close()
    code, out, _ = _import("tensorboard", "--prefix", "tb-", str(logdir), str(root))
    assert code == 0 and "tb-hp: skipped, no scalars" in out
    _ingest(root)
    summary = json.loads((root / "tb-hp__trial" / "ingested" / "summary.json").read_text())
    assert summary["hparams"] == {"lr": 0.1, "bs": 32.0, "opt": "adam"}
    assert column_points(steps_columns(str(root / "tb-hp__trial")), "hp/metric") == [(0, bits(1.5))]


def test_a_folder_that_is_not_an_import_is_left_alone(tmp_path):
    logdir, root = tmp_path / "logs", tmp_path / "root"
    write_tb_restarted(str(logdir))
    (root / "b").mkdir(parents=True)
    (root / "b" / "mine.txt").write_text("a recorded run")
    code, out, err = _import("tensorboard", str(logdir), str(root))
    assert code == 1 and "is not an import" in err and "exp__a: new" in out
    assert os.listdir(root / "b") == ["mine.txt"]


def test_the_bulk_decoder_agrees_with_the_protobuf_parser_or_leaves_the_record_to_it(tmp_path):
    import random
    import struct

    from kforge_dash.importers import scalar_events
    from kforge_dash.importers.tfrecord import read_records

    rnd = random.Random(7)
    events = []
    for i in range(400):
        step = rnd.choice([0, 1, 127, 128, 2**31, 2**62, -1, -(2**40), rnd.randrange(10**9)])
        tag = rnd.choice(["a", "loss/é", "x" * 120, "y" * 200, "", "tag/" + str(i % 7)])
        value = struct.unpack("<f", struct.pack("<I", rnd.getrandbits(32)))[0]  # every float32, NaNs included
        e = scalar_event(step, tag, value, rnd.choice([0.0, 1.7e9 + i, -3.5]))
        if i % 50 == 0:  # a second value in one summary: not plain
            e.summary.value.add(tag="b", simple_value=1.0)
        events.append(e)
    path = tmp_path / "events.out.tfevents.1.host"
    write_events(str(path), events)
    recs = read_records(str(path))
    got = scalar_events.decode(recs.buf, recs.starts, recs.lengths)
    for k, e in enumerate(events):
        parsed = event_pb2.Event.FromString(recs.data(k))
        values = parsed.summary.value
        simple = len(values) == 1 and parsed.wall_time != 0.0 and 0 < len(values[0].tag.encode()) < 120
        if got.mask[k]:
            v = parsed.summary.value[0]
            assert (int(got.steps[k]), bits(float(got.walls[k])), got.tags[int(got.codes[k])], bits(float(got.values[k]))) == \
                (parsed.step, bits(parsed.wall_time), v.tag, bits(v.simple_value)), k
        else:
            assert not simple, k  # only what the layout cannot hold is left to the parser
    assert got.mask.sum() > 100  # and most are decoded in bulk


def test_the_dashboard_shows_an_imported_run_like_a_recorded_one(tmp_path, monkeypatch):
    from dash_fixtures import detail_page

    logdir, root = tmp_path / "logs", tmp_path / "root"
    write_tb_restarted(str(logdir))
    assert _import("tensorboard", str(logdir), str(root))[0] == 0
    _ingest(root)
    at = detail_page(root, monkeypatch, "exp__a")
    assert not at.exception, at.exception
    text = " ".join(m.value for m in at.markdown)
    assert f"loss first went NaN at step {NAN_STEP}" in text  # its findings, from its imported values


def test_tensor_scalars_of_the_scalars_plugin_match_event_accumulators_tensors(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util
    from torch.utils.tensorboard import SummaryWriter

    logdir, root = tmp_path / "logs", tmp_path / "root"
    w = SummaryWriter(str(logdir / "tf2"))
    for s in range(100):
        w.add_scalar("eval/x", float("nan") if s == 9 else 0.1 * s, s, new_style=True)  # a 0-d tensor, not simple_value
    w.close()
    assert _import("tensorboard", str(logdir), str(root))[0] == 0
    _ingest(root)
    ea = EventAccumulator(str(logdir / "tf2"), size_guidance={"tensors": 0})
    ea.Reload()
    want = [(e.step, bits(tensor_util.make_ndarray(e.tensor_proto).item())) for e in ea.Tensors("eval/x")]
    assert column_points(steps_columns(str(root / "tf2")), "eval/x") == want and len(want) == 100
