"""kforge-import wandb: offline runs written by wandb.init(mode="offline") + run.log, imported, ingested, and
compared bit for bit with wandb's own reader of the .wandb file (`wandb leet inspect --json`). No network."""

from __future__ import annotations

import glob
import json
import math
import os

from click.testing import CliRunner
from import_fixtures import bits, column_points, steps_columns, tree_bytes, wandb_history, write_wandb_run

from kforge_dash.cli.import_runs import main as import_main
from kforge_dash.pipeline import ingest_path


def _import(*args) -> tuple[int, str, str]:
    res = CliRunner().invoke(import_main, list(args), catch_exceptions=False)
    return res.exit_code, res.stdout, res.stderr


def _expected(history, key) -> list[tuple[int, bytes]]:
    return [(step, bits(float(item[key]))) for step, item in history if key in item]


def test_a_run_folder_matches_wandbs_reader_bit_for_bit(tmp_path, clean_wandb_env):
    run = write_wandb_run(str(tmp_path / "w"), name="baseline")
    [wfile] = glob.glob(os.path.join(run, "*.wandb"))
    run_id = os.path.basename(wfile)[len("run-"):-len(".wandb")]
    root = tmp_path / "root"
    code, out, err = _import("wandb", run, str(root))
    assert code == 0, err
    name = f"baseline-{run_id}"
    assert f"{name}: new" in out
    assert "'note'" in err  # the text values are named as left out
    ingest_path(str(root), tensorboard=False, wandb=False)

    history = wandb_history(wfile)
    cols = steps_columns(str(root / name))
    assert cols["step"] == [s for s, _ in history]
    assert cols["time"] == [item["_timestamp"] for _, item in history]
    for key, column in {"loss": "loss", "grad_norm": "grad_norm", "lr": "lr", "eval/acc": "eval/acc"}.items():
        assert column_points(cols, column) == _expected(history, key), key
    grad = dict(column_points(cols, "grad_norm"))
    assert grad[4] == bits(math.inf) and grad[5] == bits(-math.inf)
    assert math.isnan(dict(zip(cols["step"], cols["loss"]))[3])
    assert "note" not in cols and "_runtime" not in cols

    summary = json.loads((root / name / "ingested" / "summary.json").read_text())
    assert summary["hparams"] == {"lr": 0.003, "layers": 4, "optimizer": "adamw"}
    assert {"imported:wandb", "baseline"} <= set(summary["tags"])


def test_a_wandb_file_and_a_folder_of_runs_are_imported_idempotently(tmp_path, clean_wandb_env):
    first = write_wandb_run(str(tmp_path / "w1"), n=4)
    [wfile] = glob.glob(os.path.join(first, "*.wandb"))
    run_id = os.path.basename(wfile)[len("run-"):-len(".wandb")]
    root = tmp_path / "root"
    code, out, _ = _import("wandb", "--prefix", "wb-", wfile, str(root))  # the .wandb file itself
    assert code == 0 and f"wb-{run_id}: new, 5 steps" in out
    before = tree_bytes(str(root / f"wb-{run_id}"))
    code, out, _ = _import("wandb", "--prefix", "wb-", str(tmp_path / "w1"), str(root))  # a folder holding it
    assert code == 0 and f"wb-{run_id}: unchanged" in out
    assert tree_bytes(str(root / f"wb-{run_id}")) == before
    assert os.listdir(root) == [f"wb-{run_id}"]  # no duplicate, no temp folder left


def test_a_corrupt_wandb_record_is_an_error_naming_the_offset(tmp_path, clean_wandb_env):
    run = write_wandb_run(str(tmp_path / "w"), n=30)
    [wfile] = glob.glob(os.path.join(run, "*.wandb"))
    data = bytearray(open(wfile, "rb").read())
    data[len(data) // 2] ^= 0x10
    open(wfile, "wb").write(bytes(data))
    code, out, err = _import("wandb", wfile, str(tmp_path / "root"))
    assert code == 1 and wfile in err and "corrupt record at byte offset" in err
    assert ": new," in out  # the records before it are imported


def test_a_run_still_being_written_is_imported_up_to_its_last_whole_record_with_a_warning(tmp_path, clean_wandb_env):
    run = write_wandb_run(str(tmp_path / "w"), n=30)
    [wfile] = glob.glob(os.path.join(run, "*.wandb"))
    whole = wandb_history(wfile)
    data = open(wfile, "rb").read()
    open(wfile, "wb").write(data[:-60])  # the tail of a live (or killed) run: its last record half written
    code, out, err = _import("wandb", wfile, str(tmp_path / "root"))
    assert code == 0 and "at byte offset" in err and "stopped there" in err
    ingest_path(str(tmp_path / "root"), tensorboard=False, wandb=False)
    [name] = os.listdir(tmp_path / "root")
    cols = steps_columns(str(tmp_path / "root" / name))
    assert 0 < len(cols["step"]) <= len(whole)
    assert column_points(cols, "loss") == _expected(whole[:len(cols["step"])], "loss")
