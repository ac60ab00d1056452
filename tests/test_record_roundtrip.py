"""What end_step/log record is read back exactly, with pyarrow and with polars."""

import json
import math
import os
import time

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
import torch
from ingest_fixtures import warns_each

from kforge_record import Recorder
from kforge_record.check import check_run


def _attempt_dir(run):
    (rank,) = [d for d in os.listdir(run) if d.startswith("rank-")]
    (attempt,) = os.listdir(run / rank)
    return run / rank / attempt


def _read_polars(run):
    parts = sorted(str(p) for p in run.glob("rank-*/*/part-*.parquet"))
    return pl.concat([pl.read_parquet(p) for p in parts], how="diagonal_relaxed")


def test_round_trip_values_types_and_meta(tmp_path):
    run = tmp_path / "run-a"
    values = [0.5, float("nan"), float("inf"), -float("inf"), 1e-300]
    with Recorder(run, model={"flops_per_token": 6e9}, hparams={"lr": 3e-4, "nested": {"x": 1}},
                  tags=["baseline"], flush_every_steps=2, rank=0, world_size=1) as rec:
        for step, v in enumerate(values, start=1):
            rec.start_step()
            with rec.phase("data"):
                pass
            with rec.phase("fwd_bwd"):
                pass
            with rec.phase("fwd_bwd"):  # a phase entered twice in one step adds up
                pass
            extra = {"moe/aux_loss": v * 2} if step >= 3 else {}  # a name that appears mid-run
            rec.end_step(step, loss=v, grad_norm=1.5, lr=3e-4, tokens=4096, **extra)
        rec.log(5, **{"eval/loss": 2.25})

    df = _read_polars(run).sort("step", "step_time_s", nulls_last=True)
    train = df.filter(pl.col("step_time_s").is_not_null())
    assert train["step"].to_list() == [1, 2, 3, 4, 5]
    # NaN and inf are stored as they are, bit for bit.
    got = train["loss"].to_list()
    for a, b in zip(got, values):
        assert (math.isnan(a) and math.isnan(b)) or a == b
    assert train["tokens"].dtype == pl.Int64 and train["tokens"].to_list() == [4096] * 5
    assert train["grad_norm"].to_list() == [1.5] * 5
    # Missing is null, never 0.0: no CUDA here, so memory is null; the mid-run scalar is null before it appears.
    assert train["mem_allocated_bytes"].null_count() == 5
    aux = train["moe/aux_loss"].to_list()
    assert aux[:2] == [None, None] and aux[2] == math.inf and aux[3] == -math.inf
    assert (train["time/fwd_bwd_s"] >= 0).all() and (train["time/data_s"] >= 0).all()
    assert (train["step_time_s"] >= train["time/fwd_bwd_s"]).all()
    # log() adds a row for the step with only its scalars.
    logged = df.filter(pl.col("step_time_s").is_null())
    assert logged["step"].to_list() == [5] and logged["eval/loss"].to_list() == [2.25]
    assert logged["loss"].to_list() == [None]

    # The same files through pyarrow's own dataset reader (schemas unified across parts).
    files = sorted(str(p) for p in _attempt_dir(run).glob("part-*.parquet"))
    schema = pa.unify_schemas([pq.read_schema(f) for f in files])
    table = ds.dataset(files, schema=schema, format="parquet").to_table()
    assert table.num_rows == 6
    assert table.schema.field("step").type == pa.int64() and table.schema.field("loss").type == pa.float64()

    meta = json.loads((_attempt_dir(run) / "meta.json").read_text())
    assert meta["run_name"] == "run-a" and meta["rank"] == 0 and meta["world_size"] == 1
    assert meta["model"] == {"flops_per_token": 6e9} and meta["hparams"]["nested"] == {"x": 1}
    assert meta["tags"] == ["baseline"] and meta["device"]["type"] == "cpu"
    end = json.loads((_attempt_dir(run) / "end.json").read_text())
    assert end["reason"] == "close" and end["rows_written"] == 6 and end["dropped_rows_total"] == 0
    assert check_run(run) == []


def test_tensors_are_recorded_exactly(tmp_path):
    run = tmp_path / "run-t"
    w = torch.ones(3, requires_grad=True)
    loss = (w * torch.tensor([0.1, 0.2, 0.3])).sum()  # carries an autograd graph
    loss.backward()
    f32 = torch.tensor(0.1, dtype=torch.float32)
    bf16 = torch.tensor(3.140625, dtype=torch.bfloat16)
    nan = torch.tensor(float("nan"))
    with Recorder(run, rank=0, world_size=1) as rec:
        rec.end_step(1, loss=loss, grad_norm=f32, lr=torch.tensor(1e-4, dtype=torch.float64),
                     tokens=torch.tensor(2048), bf=bf16, np_scalar=np.float32(0.25))
        rec.end_step(2, loss=nan, grad_norm=torch.tensor(float("inf")), tokens=np.int64(7))
    df = _read_polars(run).sort("step")
    assert df["loss"][0] == loss.item()
    assert df["grad_norm"][0] == float(np.float32(0.1))  # the float32 value, widened exactly
    assert df["lr"][0] == 1e-4
    assert df["tokens"].to_list() == [2048, 7]
    assert df["bf"][0] == 3.140625 and df["np_scalar"][0] == 0.25
    assert math.isnan(df["loss"][1]) and df["grad_norm"][1] == math.inf


def test_bad_values_become_null_with_a_warning_and_never_raise(tmp_path):
    run = tmp_path / "run-b"
    said = ("'oops' for 'loss' is not a number", r"a tensor of shape \(2,\) was logged as 'grad_norm'")
    with warns_each(*said, category=RuntimeWarning):
        with Recorder(run, rank=0, world_size=1) as rec:
            rec.end_step(1, loss="oops", grad_norm=torch.ones(2), lr=0.1)
            rec.end_step(2, loss=0.5)
    df = _read_polars(run).sort("step")
    assert df["loss"].to_list() == [None, 0.5]
    assert df["grad_norm"].to_list() == [None, None]
    assert df["lr"].to_list() == [0.1, None]


def test_flush_thresholds_make_one_part_per_window(tmp_path):
    run = tmp_path / "run-f"
    rec = Recorder(run, rank=0, world_size=1, flush_every_steps=10, flush_every_s=3600)
    for step in range(1, 36):
        rec.end_step(step, loss=1.0)
    rec.flush()
    parts = sorted(p.name for p in _attempt_dir(run).glob("part-*.parquet"))
    sizes = [pq.read_metadata(_attempt_dir(run) / p).num_rows for p in parts]
    # Parts hold whole 10-step windows (several when the writer was busy), and flush() the last 5.
    assert sum(sizes) == 35 and all(n % 10 == 0 for n in sizes[:-1]) and sizes[-1] % 10 == 5
    for step in range(36, 41):
        rec.end_step(step, loss=1.0)
        time.sleep(0.02)
    time.sleep(0.05)
    assert len(list(_attempt_dir(run).glob("part-*.parquet"))) == len(parts), "no time-based flush at 3600 s"
    rec.close()
    rec.close()  # idempotent
    assert not list(_attempt_dir(run).glob(".*"))  # no temp file left behind


def test_tensor_changed_in_place_after_end_step_is_null_not_wrong(tmp_path):
    run = tmp_path / "run-i"
    acc = torch.zeros(())
    with pytest.warns(RuntimeWarning, match="modified in place"):
        with Recorder(run, rank=0, world_size=1, flush_every_steps=1000) as rec:
            for step in range(1, 4):
                acc += step
                rec.end_step(step, loss=acc, grad_norm=acc.clone())
                acc.zero_()  # the loop reuses its accumulator before the recorder flushed
    df = _read_polars(run).sort("step")
    assert df["loss"].to_list() == [None, None, None]
    assert df["grad_norm"].to_list() == [1.0, 2.0, 3.0]


def test_writer_falling_behind_coalesces_windows_into_fewer_parts(tmp_path):
    run = tmp_path / "run-c"
    rec = Recorder(run, rank=0, world_size=1, flush_every_steps=10, flush_every_s=3600)
    for step in range(1, 5001):  # back to back: far faster than one part write per 10 steps
        rec.end_step(step, loss=1.0)
    rec.close()
    parts = sorted(_attempt_dir(run).glob("part-*.parquet"))
    assert _read_polars(run)["step"].to_list() == list(range(1, 5001))
    assert len(parts) < 500  # some windows were merged while a write was in flight


def test_time_based_flush(tmp_path):
    run = tmp_path / "run-s"
    rec = Recorder(run, rank=0, world_size=1, flush_every_steps=1_000_000, flush_every_s=0.05)
    for step in range(1, 8):
        time.sleep(0.02)
        rec.end_step(step, loss=1.0)
    time.sleep(0.2)  # let the writer thread finish
    on_disk = _read_polars(run)["step"].to_list()
    assert len(on_disk) >= 3, "a slow loop is flushed by time, not only by step count"
    rec.close()


def test_out_of_range_integer_is_null_and_the_window_is_kept(tmp_path):
    run = tmp_path / "run-o"
    with pytest.warns(RuntimeWarning, match="64-bit integer"):
        with Recorder(run, rank=0, world_size=1, flush_every_steps=10) as rec:
            for step in range(1, 11):
                rec.end_step(step, loss=1.0, tokens=2**64 if step == 3 else 8)
    df = _read_polars(run).sort("step")
    assert df["step"].to_list() == list(range(1, 11))
    assert df["tokens"].to_list() == [8, 8, None] + [8] * 7
    assert rec.dropped_rows == 0


def test_strings_non_integral_tokens_and_huge_floats_are_null_not_guessed(tmp_path):
    run = tmp_path / "run-v"
    with pytest.warns(RuntimeWarning, match="not a"):
        with Recorder(run, rank=0, world_size=1, flush_every_steps=100) as rec:
            rec.end_step(1, loss="1.5", tokens=7.9, big=10**400)
            rec.end_step(2, loss=0.5, tokens=8, big=2.0)
    df = _read_polars(run).sort("step")
    assert df["loss"].to_list() == [None, 0.5]
    assert df["tokens"].to_list() == [None, 8]
    assert df["big"].to_list() == [None, 2.0]
    assert rec.dropped_rows == 0


def test_a_flushed_windows_tensors_are_released_when_flush_returns(tmp_path):
    """The writer thread frees a window's rows once written: the training thread does not keep
    them (nor the tensors they hold: a 0-dim view keeps its whole storage) until its next
    hand-over, where end_step would pay for freeing them."""
    import gc
    import weakref

    rec = Recorder(tmp_path / "run", rank=0, world_size=1, flush_every_steps=4, install_sigterm_handler=False)
    big = torch.zeros(1000)
    views = [big[i] for i in range(4)]  # each keeps big's storage alive
    alive = [weakref.ref(v) for v in views]
    storage = weakref.ref(big)
    for step, v in enumerate(views):
        rec.end_step(step, loss=v)  # the 4th hands the window over
    del views, v, big
    rec.flush()
    gc.collect()
    assert [r() is None for r in alive] == [True] * 4 and storage() is None
    rec.end_step(4, loss=1.0)
    rec.close()
    assert _read_polars(tmp_path / "run").sort("step")["loss"].to_list() == [0.0] * 4 + [1.0]
