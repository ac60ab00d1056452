"""Logs of other trackers, written by their own writers, and read back by their own readers (kforge-import tests)."""

from __future__ import annotations

import glob
import json
import math
import os
import struct
import subprocess
import sys

import pyarrow.parquet as pq
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.record_writer import RecordWriter

NAN_STEP, INF_STEP, NEG_INF_STEP = 5, 6, 7
PURGE_STEP = 15
FIRST_LAST = 40  # the first session's last step


def write_tb_restarted(logdir: str) -> None:
    """A run with NaN and +/-inf, then a restart with purge_step (torch's SummaryWriter), and a second run."""
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(os.path.join(logdir, "exp", "a"))
    for s in range(1, FIRST_LAST + 1):  # > 64 events a session: the bulk path is taken
        w.add_scalar("train/loss", math.nan if s == NAN_STEP else 1.0 / s + 1e-9 * s, s)
        w.add_scalar("lr", math.inf if s == INF_STEP else -math.inf if s == NEG_INF_STEP else 1e-3 * s, s)
        w.add_scalar("eval/acc", 0.1 * s, s)
    w.close()
    w = SummaryWriter(os.path.join(logdir, "exp", "a"), purge_step=PURGE_STEP)
    for s in range(17, 60):
        w.add_scalar("train/loss", 2.0 / s, s)
        w.add_scalar("time", 3.0 * s, s)  # a name kforge reserves
    w.close()
    w = SummaryWriter(os.path.join(logdir, "b"))
    for s in range(0, 30, 3):
        w.add_scalar("loss", 0.5 * s, s)
        w.add_scalar("train/loss", 0.25 * s, s)  # two tags that could be the loss: neither is mapped
    w.close()


def write_events(path: str, events: list) -> None:
    """Raw events through TensorBoard's own record writer."""
    with open(path, "wb") as f:
        rw = RecordWriter(f)
        for e in events:
            rw.write(e.SerializeToString())
        rw.flush()


def scalar_event(step: int, tag: str, value: float, wall: float) -> event_pb2.Event:
    return event_pb2.Event(step=step, wall_time=wall,
                           summary=summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)]))


def ea_scalars(run_folder: str) -> dict[str, list[tuple[int, float, float]]]:
    """{tag: [(step, wall_time, value)]} as TensorBoard's EventAccumulator keeps them (size_guidance 0)."""
    ea = EventAccumulator(run_folder, size_guidance={"scalars": 0})
    ea.Reload()
    return {t: [(e.step, e.wall_time, e.value) for e in ea.Scalars(t)] for t in ea.Tags()["scalars"]}


def bits(x: float) -> bytes:
    return struct.pack("<d", x)


def steps_columns(run_dir: str) -> dict[str, list]:
    return pq.read_table(os.path.join(run_dir, "ingested", "steps.parquet")).to_pydict()


def column_points(cols: dict[str, list], column: str) -> list[tuple[int, bytes]]:
    """(step, value bits) of the non-null values of one steps.parquet column."""
    return [(s, bits(v)) for s, v in zip(cols["step"], cols[column]) if v is not None]


def last_per_step(points: list[tuple[int, float, float]]) -> list[tuple[int, bytes]]:
    """A tag's points with one per step (the last written), by step, as bits."""
    by_step = {}
    for step, _, value in points:
        by_step[step] = value
    return [(s, bits(by_step[s])) for s in sorted(by_step)]


def write_wandb_run(folder: str, *, name: str | None = None, n: int = 12) -> str:
    """An offline W&B run through wandb's own writer, in a child process (wandb's service is per process).
    Returns its offline run folder."""
    code = f"""
import math, wandb
run = wandb.init(mode="offline", dir={folder!r}, project="baselines", name={name!r},
                 config={{"lr": 0.003, "layers": 4, "optimizer": "adamw"}}, tags=["baseline"])
for s in range({n}):
    grad = math.inf if s == 4 else -math.inf if s == 5 else 0.5 + s
    loss = math.nan if s == 3 else 1.0 / (s + 1)
    run.log({{"loss": loss, "grad_norm": grad, "lr": 0.003, "eval/acc": 0.1 * s, "note": "text"}})
run.log({{"eval/acc": 0.99}}, step={n + 5})
run.finish()
"""
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120, capture_output=True)
    [run] = glob.glob(os.path.join(folder, "wandb", "offline-run-*"))
    return run


_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def wandb_history(wandb_file: str) -> list[tuple[int, dict]]:
    """[(step, item)] from wandb's own reader of the .wandb file (`wandb leet inspect --json`)."""
    out = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", wandb_file],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    rows = []
    for line in out.splitlines():
        rec = json.loads(line)
        if rec["type"] == "history":
            item = {k: _NONFINITE.get(v, v) if isinstance(v, str) else v for k, v in rec["history"]["item"].items()}
            rows.append((int(rec["history"]["step"].get("num", 0)), item))
    return rows


def tree_bytes(folder: str) -> dict[str, bytes]:
    """Every file under ``folder`` (but ingest's outputs) -> its bytes."""
    out = {}
    for d, dirs, files in os.walk(folder):
        dirs[:] = [x for x in dirs if x != "ingested"]
        for f in files:
            p = os.path.join(d, f)
            if not f.startswith("events.out.tfevents"):  # ingest's TensorBoard export
                out[os.path.relpath(p, folder)] = open(p, "rb").read()
    return out
