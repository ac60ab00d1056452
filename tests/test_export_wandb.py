"""W&B export, read back with wandb's own reader of the .wandb transaction log (`wandb leet inspect --json`).

wandb 0.31 has no Python reader of .wandb files any more (the old DataStore is gone); its reader is
in wandb-core, exposed as `wandb leet inspect --json FILE`: one JSON record per line. No network.
"""

from __future__ import annotations

import datetime
import glob
import json
import math
import os
import socket
import subprocess
import sys
import threading
import time
import warnings

import pyarrow.parquet as pq
from export_fixtures import INF_GRAD_STEP, NAN_LOSS_STEP, TAGS, expected_points, make_ingested_run, read_back, same
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from kforge_dash.export.run import export_run

_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def read_wandb(offline_run: str) -> dict:
    """{"run": run record, "history": [(step, item)], "summary": folded summary, "exit": exit record}."""
    [path] = glob.glob(os.path.join(offline_run, "*.wandb"))
    out = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", path],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    got = {"run": None, "history": [], "summary": {}, "exit": None}
    for line in out.splitlines():
        rec = json.loads(line)
        kind = rec["type"]
        if kind == "run":
            got["run"] = rec["run"]
        elif kind == "history":
            item = {k: _NONFINITE.get(v, v) if isinstance(v, str) else v for k, v in rec["history"]["item"].items()}
            got["history"].append((int(rec["history"]["step"]["num"]), item))
        elif kind == "summary":
            got["summary"].update(rec["summary"]["update"])
        elif kind == "exit":
            got["exit"] = rec["exit"]
    return got


def one_offline_run(run_dir: str) -> str:
    runs = glob.glob(os.path.join(run_dir, "ingested", "wandb", "offline-run-*"))
    assert len(runs) == 1, runs
    return runs[0]


def expected_rows(run_dir: str) -> list[tuple[int, float, dict]]:
    """[(step, time, {tag: value})] from steps.parquet via pyarrow, nulls left out, memory in GiB."""
    out = []
    for row in pq.read_table(os.path.join(run_dir, "ingested", "steps.parquet")).to_pylist():
        vals = {TAGS.get(c, c): (v / 2**30 if c.startswith("mem_") else float(v))
                for c, v in row.items() if c not in ("step", "time") and v is not None}
        out.append((row["step"], row["time"], vals))
    return out


def eq(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def check_history(got: dict, run_dir: str) -> None:
    want = expected_rows(run_dir)
    assert [s for s, _ in got["history"]] == [s for s, _, _ in want]  # every step once, in order
    for (step, item), (wstep, wtime, vals) in zip(got["history"], want):
        assert item["_step"] == step == wstep
        assert item["_timestamp"] == wtime
        metrics = {k: v for k, v in item.items() if not k.startswith("_")}
        assert metrics.keys() == vals.keys(), step
        assert all(eq(float(metrics[k]), vals[k]) for k in vals), step


def test_history_config_summary_and_run_id(tmp_path, clean_wandb_env):
    run = make_ingested_run(tmp_path, "run-w", n_steps=30, world_size=2)
    res = export_run(run, tensorboard=False)
    assert res.ok and res.tensorboard is None, res.errors
    got = read_wandb(one_offline_run(run))
    check_history(got, run)
    assert res.wandb.points == 30 and got["exit"]["exit_code"] == 0  # its runtime: the export's own (module doc)
    loss = dict((s, i["1_train/loss"]) for s, i in got["history"])
    assert math.isnan(loss[NAN_LOSS_STEP])  # NaN is carried as it is ...
    assert dict((s, i["1_train/grad_norm"]) for s, i in got["history"])[INF_GRAD_STEP] == math.inf

    summary = json.load(open(os.path.join(run, "ingested", "summary.json")))
    r = got["run"]
    assert r["run_id"] == res.wandb.run_id and r["project"] == "kforge" and r["display_name"] == "run-w"
    assert r["tags"] == ["baseline"]
    config = {k: v for k, v in r["config"]["update"].items() if k != "_wandb"}
    compared = ("final_loss", "best_loss", "mean_mfu", "mean_tokens_per_sec", "tokens", "steps", "wall_time_s")
    rest = {k: v for k, v in summary.items() if k not in (*compared, "hparams", "model", "world_size", "device", "exports")}
    assert config == {**summary["hparams"], "model": summary["model"], "world_size": 2, "device": summary["device"],
                      "kforge": rest}
    s = got["summary"]
    # The summary keeps what a W&B user compares across runs; the rest is in config (above).
    ours = {k: v for k, v in s.items() if k.startswith("kforge/")}
    lineage = {"kforge/lineage": s["kforge/lineage"]} if summary["restarts"] else {}  # the restarts as text
    assert ours == {**{f"kforge/{k}": summary[k] for k in compared}, "kforge/restarts": len(summary["restarts"]),
                    **lineage}
    assert not summary["restarts"] or "resumed at step" in s["kforge/lineage"]
    # The run starts when the training did (the first launch), and runs as long as it did.
    start = datetime.datetime.fromisoformat(r["start_time"].replace("Z", "+00:00")).timestamp()
    first_start = min(a["start_time"] for a in summary["attempts"])
    assert abs(start - first_start) < 1e-3
    last_time = pq.read_table(os.path.join(run, "ingested", "steps.parquet"))["time"].to_pylist()[-1]
    assert int(r["runtime"]) == round(last_time - first_start) > 0
    # ... and counted, since W&B charts skip non-finite points: counts computed here from the Parquet file.
    rows = pq.read_table(os.path.join(run, "ingested", "steps.parquet")).to_pylist()
    for col in ("loss", "grad_norm"):
        n = sum(1 for row in rows if row[col] is not None and not math.isfinite(row[col]))
        assert n >= 1 and s[f"nonfinite/{TAGS[col]}"] == n
    assert not [k for k in s if k.startswith("nonfinite/") and k not in ("nonfinite/1_train/loss", "nonfinite/1_train/grad_norm")]


def test_reexport_twice_one_run_same_id_no_duplicate(tmp_path, clean_wandb_env):
    run = make_ingested_run(tmp_path, n_steps=12)
    ids = [export_run(run, tensorboard=False).wandb.run_id for _ in range(2)]
    assert ids[0] == ids[1]
    got = read_wandb(one_offline_run(run))  # one offline run dir only
    assert got["run"]["run_id"] == ids[0]
    check_history(got, run)
    make_ingested_run(tmp_path, n_steps=25)  # the run went on; the id stays, the history is the new one
    res = export_run(run, tensorboard=False)
    assert res.wandb.run_id == ids[0]
    check_history(read_wandb(one_offline_run(run)), run)
    leftovers = [n for n in os.listdir(os.path.join(run, "ingested")) if n.startswith(".")]
    assert leftovers == []


def test_run_id_is_stable_per_run_and_differs_between_runs(tmp_path, clean_wandb_env):
    from kforge_dash.export.wandb import run_id_for

    def summary(run):
        return json.load(open(os.path.join(run, "ingested", "summary.json")))

    a = make_ingested_run(tmp_path / "a", "same-name", n_steps=3)
    b = make_ingested_run(tmp_path / "b", "same-name", n_steps=3)  # copied elsewhere: same run
    c = make_ingested_run(tmp_path / "c", "same-name", n_steps=3, first_attempt_id="20261201T000000.000000Z")
    d = make_ingested_run(tmp_path / "d", "other-name", n_steps=3)
    ids = [run_id_for(summary(x)) for x in (a, b, c, d)]
    assert ids[0] == ids[1] and len(set(ids)) == 3
    assert all(len(i) <= 64 and i.replace("-", "").isalnum() for i in ids)  # W&B's id alphabet


def test_project_and_entity_from_options_or_environment(tmp_path, clean_wandb_env, monkeypatch):
    run = make_ingested_run(tmp_path, n_steps=3)
    monkeypatch.setenv("WANDB_PROJECT", "from-env")
    monkeypatch.setenv("WANDB_ENTITY", "team-env")
    monkeypatch.setenv("WANDB_MODE", "online")  # a cluster-wide default must not send us online ...
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "elsewhere"))  # ... nor elsewhere
    res = export_run(run, tensorboard=False)
    assert res.wandb.ok and res.wandb.path == one_offline_run(run) and not (tmp_path / "elsewhere").exists()
    r = read_wandb(one_offline_run(run))["run"]
    assert (r["project"], r["entity"]) == ("from-env", "team-env")
    export_run(run, tensorboard=False, wandb_project="from-option", wandb_entity="team-opt")
    r = read_wandb(one_offline_run(run))["run"]
    assert (r["project"], r["entity"]) == ("from-option", "team-opt")


def test_hparam_named_like_a_kforge_key_keeps_its_name(tmp_path, clean_wandb_env):
    run = make_ingested_run(tmp_path, n_steps=3, hparams={"model": "llama-7b", "lr": 1e-3})
    export_run(run, tensorboard=False)
    config = read_wandb(one_offline_run(run))["run"]["config"]["update"]
    assert config["model"] == "llama-7b" and config["kforge/model"] == {"flops_per_token": 6.7e9}


def test_summary_carries_goodput_and_findings_when_ingest_has_them(tmp_path, clean_wandb_env):
    run = make_ingested_run(tmp_path, n_steps=5)
    path = os.path.join(run, "ingested", "summary.json")
    summary = json.load(open(path))
    summary.update(goodput={"fraction": 0.87, "lost_s": 12.0}, findings=[{"kind": "straggler"}, {"kind": "spike"}])
    json.dump(summary, open(path, "w"))
    export_run(run, tensorboard=False)
    got = read_wandb(one_offline_run(run))
    assert got["summary"]["kforge/goodput"] == 0.87 and got["summary"]["kforge/findings"] == 2
    assert got["run"]["config"]["update"]["kforge"]["goodput"] == {"fraction": 0.87, "lost_s": 12.0}


# -- upload: every failure is reported, quickly, and the offline run stays ---------------------------------

def _silent_server():
    """A TCP server that accepts connections and never answers (a black-holed API endpoint)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    conns = []

    def accept():
        while True:
            try:
                conns.append(srv.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.getsockname()[1]}"


def _closed_port_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


def test_upload_without_login_says_so(tmp_path, clean_wandb_env, monkeypatch):
    srv, url = _silent_server()
    monkeypatch.setenv("WANDB_BASE_URL", url)
    run = make_ingested_run(tmp_path, n_steps=3)
    try:
        res = export_run(run, tensorboard=False, upload=True, upload_timeout_s=60)
    finally:
        srv.close()
    assert res.wandb.ok and not res.upload.ok and not res.ok
    assert "not logged in" in res.upload.error and "wandb login" in res.upload.error
    assert res.upload.seconds < 30
    check_history(read_wandb(one_offline_run(run)), run)


def test_upload_without_network_says_so_fast(tmp_path, clean_wandb_env, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", _closed_port_url())
    run = make_ingested_run(tmp_path, n_steps=3)
    res = export_run(run, tensorboard=False, upload=True, upload_timeout_s=60)
    assert res.wandb.ok and not res.upload.ok
    assert res.upload.error.startswith("no network") and res.upload.seconds < 10


def test_upload_to_a_server_that_never_answers_times_out(tmp_path, clean_wandb_env, monkeypatch):
    srv, url = _silent_server()
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", url)
    run = make_ingested_run(tmp_path, n_steps=3)
    t0 = time.monotonic()
    try:
        res = export_run(run, tensorboard=False, upload=True, upload_timeout_s=3)
    finally:
        srv.close()
    assert res.wandb.ok and not res.upload.ok
    assert "did not finish within 3s" in res.upload.error
    assert time.monotonic() - t0 < 60


# -- the whole pipeline: shards from the recorder -> kforge ingest -> export -----------------------------

def test_recorder_to_ingest_to_export(tmp_path, clean_wandb_env):
    from kforge_dash.ingest.run import ingest_run
    from kforge_record import Recorder

    run = str(tmp_path / "pipeline")
    for rank in range(2):
        rec = Recorder(run, rank=rank, world_size=2, model={"flops_per_token": 1e6}, hparams={"lr": 1e-3},
                       install_sigterm_handler=False, flush_every_steps=7)
        for step in range(1, 31):
            with rec.phase("fwd_bwd"):
                pass
            loss = math.nan if step == 13 else 1.0 / step + rank
            rec.end_step(step, loss=loss, grad_norm=0.5 * step, lr=1e-3, tokens=128, acc=0.01 * step)
            if step % 10 == 0:
                rec.log(step, **{"eval/loss": 2.0 - step / 100})
        rec.close()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "ran on CPU: MFU is null" is ingest's business, not export's
        ingest_run(run)
    res = export_run(run, upload=False)
    assert res.ok, res.errors
    # TensorBoard: every point of every tag equals ingest's steps.parquet / ranks.parquet.
    got, want = read_back(run), expected_points(run)
    # summary.json's findings are text summaries, never scalar cards (tests/test_findings_outputs.py)
    assert not {t for t in got if t.startswith("findings/")}
    ea = EventAccumulator(run, size_guidance={"tensors": 0})
    ea.Reload()
    assert "findings/nonfinite" in ea.Tags()["tensors"]
    assert set(got) == set(want) and all(same(got[t], want[t]) for t in want)
    assert {"1_train/loss", "time/fwd_bwd_s", "acc", "eval/loss", "ranks/step_time_s/00001"} <= set(got)
    assert math.isnan(dict((s, v) for s, _, v in got["1_train/loss"])[13])
    # W&B: every row equals steps.parquet.
    wb = read_wandb(one_offline_run(run))
    check_history(wb, run)
    assert len(wb["history"]) == 30 and wb["run"]["config"]["update"]["lr"] == 1e-3
