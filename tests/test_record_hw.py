"""GPU telemetry: sampled on a thread of its own from NVML (a fake pynvml here), stored on the step
that had ended when each reading was taken, read back with pyarrow and through ingest; a hung NVML
call stalls neither the writer nor the loop."""

from __future__ import annotations

import json
import threading
import time
import types
import warnings

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import kforge_record.env as env_mod
import kforge_record.hw as hw_mod
from kforge_dash import ingest_run
from kforge_record import Recorder
from kforge_record.hw import HwSampler
from kforge_record.schema import HW_COLUMNS
from kforge_record.warn import Warner


def fake_nvml(clock_mhz=lambda: 1980, reasons=lambda: 0):
    """A pynvml stand-in that records when, and on which thread, it was read."""
    m = types.ModuleType("pynvml")
    m.NVML_TEMPERATURE_GPU, m.NVML_CLOCK_SM = 0, 1
    m.reads = []  # (time.time(), thread name, value of the SM clock)
    # Writer threads of recorders that earlier tests left open (a hung write, say) sample too once the
    # process looks like a CUDA one: their reads are answered but neither counted nor numbered.
    elder = m.elder = {t.ident for t in threading.enumerate()}
    m.nvmlInit = lambda: None
    m.nvmlDeviceGetHandleByIndex = lambda i: ("gpu", i)
    m.nvmlDeviceGetHandleByUUID = lambda u: ("gpu", u)

    def util(h):
        if threading.get_ident() not in elder:
            m.reads.append([time.time(), threading.current_thread().name, None])
        return types.SimpleNamespace(gpu=97, memory=40)

    def clock(h, kind):
        assert kind == m.NVML_CLOCK_SM
        if threading.get_ident() in elder:
            return 1980
        v = clock_mhz()
        m.reads[-1][2] = v
        return v

    m.nvmlDeviceGetUtilizationRates = util
    m.nvmlDeviceGetTemperature = lambda h, sensor: 71
    m.nvmlDeviceGetPowerUsage = lambda h: 612_500  # mW
    m.nvmlDeviceGetClockInfo = clock
    m.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: reasons()
    return m


def _as_cuda_process(monkeypatch):
    """The process looks as if it used CUDA device 0 (this machine has none)."""
    monkeypatch.setattr(env_mod, "cuda_in_use", lambda: True)
    monkeypatch.setattr(env_mod, "device_info", lambda: {"type": "cuda", "index": 0, "name": "Fake", "total_memory_bytes": 1})


def _rows(run):
    parts = sorted(run.glob("rank-*/*/part-*.parquet"))
    return pa.concat_tables([pq.read_table(p) for p in parts], promote_options="default")


def test_readings_are_taken_on_a_thread_of_their_own_and_land_on_the_step_that_had_ended(tmp_path, monkeypatch):
    _as_cuda_process(monkeypatch)
    n = {"i": 0}

    def clock():  # every reading gets its own value, so each can be found again
        n["i"] += 1
        return 1000 + n["i"]

    nvml = fake_nvml(clock_mhz=clock, reasons=lambda: 0x40 | 0x4)
    monkeypatch.setitem(__import__("sys").modules, "pynvml", nvml)
    run = tmp_path / "run"
    with Recorder(run, rank=0, world_size=1, hw_every_s=0.02, flush_every_steps=7, memory_every_steps=0,
                  install_sigterm_handler=False) as rec:
        for step in range(1, 81):
            time.sleep(0.005)
            rec.end_step(step, loss=1.0)
    t = _rows(run)
    assert set(HW_COLUMNS) <= set(t.column_names)
    assert t.schema.field("hw/throttle_reasons").type == pa.float64()  # the bitmask, exactly (like every scalar)
    # neither the loop's thread nor the writer's (a hung call there would stop every flush)
    assert len(nvml.reads) >= 5 and {name for _, name, _ in nvml.reads} == {"kforge-record-hw"}
    ends = sorted((s, tm) for s, tm, st in zip(t["step"].to_pylist(), t["time"].to_pylist(), t["step_time_s"].to_pylist())
                  if st is not None)
    where = {}  # clock value -> the step whose row (or a row of its own for that step) holds it
    for s, v in zip(t["step"].to_pylist(), t["hw/sm_clock_mhz"].to_pylist()):
        if v is not None:
            where[int(v)] = s
    kept = 0
    for tf, _, v in nvml.reads:
        before = [s for s, tm in ends if tm <= tf]
        if not before:
            assert v not in where  # read before any step ended: it belongs to none
            continue
        later = [w for w2, _, w in nvml.reads if w2 > tf and [s for s, tm in ends if tm <= w2][-1:] == before[-1:]]
        if later:  # a later reading of the same step won
            continue
        # the step that had ended when it was read (a step ending within the read itself may take it)
        assert where[v] in (before[-1], before[-1] + 1), (v, where.get(v), before[-1])
        kept += 1
    assert kept >= 5
    row = t.filter(pa.compute.is_valid(t["hw/sm_clock_mhz"])).slice(0, 1).to_pylist()[0]
    assert (row["hw/gpu_util_pct"], row["hw/gpu_temp_c"], row["hw/gpu_power_w"], row["hw/throttle_reasons"]) == (
        97.0, 71.0, 612.5, 0x44)


def test_readings_of_steps_written_already_are_coalesced_by_ingest_without_a_clash(tmp_path, monkeypatch):
    """Every step written at once (flush_every_steps=1), several readings a step: each step keeps its
    last reading, in ranks.parquet, and ingest warns of no value set twice."""
    _as_cuda_process(monkeypatch)
    n = {"i": 0}

    def clock():
        n["i"] += 1
        return 1000 + n["i"]

    nvml = fake_nvml(clock_mhz=clock)
    monkeypatch.setitem(__import__("sys").modules, "pynvml", nvml)
    run = tmp_path / "run"
    with Recorder(run, rank=0, world_size=1, hw_every_s=0.01, flush_every_steps=1, memory_every_steps=0,
                  peak_tflops=100.0, install_sigterm_handler=False) as rec:  # the fake GPU has no peak in the table
        for step in range(1, 11):
            time.sleep(0.06)
            rec.end_step(step, loss=1.0)
    raw = _rows(run)
    own = [v for v, st in zip(raw["hw/sm_clock_mhz"].to_pylist(), raw["step_time_s"].to_pylist()) if v is not None and st is None]
    assert own  # readings of steps written already went out as rows of their own
    res = ingest_run(run)
    assert not [w for w in res.summary["warnings"] if "hw/" in w]
    import polars as pl

    ranks = pl.read_parquet(run / "ingested" / "ranks.parquet").sort("step")
    assert ranks.height == 10  # no extra rows: coalesced into the steps
    got = dict(zip(ranks["step"].to_list(), ranks["hw/sm_clock_mhz"].to_list()))
    ends = dict(zip(ranks["step"].to_list(), ranks["time"].to_list()))
    for step in range(1, 10):  # the last reading before the next step ended
        mine = [v for tf, _, v in nvml.reads if ends[step] <= tf < ends[step + 1] - 0.002]
        if mine:
            assert got[step] >= mine[-1] and got[step] <= mine[-1] + 1


def test_without_nvml_nothing_is_recorded_and_one_warning_is_given(tmp_path, monkeypatch):
    _as_cuda_process(monkeypatch)
    monkeypatch.setitem(__import__("sys").modules, "pynvml", None)  # import pynvml -> ImportError
    run = tmp_path / "no-nvml"
    with pytest.warns(RuntimeWarning, match="GPU telemetry is off") as got:
        # recorders that earlier tests left open say it too, once each, now that the process looks
        # like a CUDA one; this recorder's line (its rank and run named) is the one counted.
        with Recorder(run, rank=5, world_size=8, hw_every_s=0.01, flush_every_steps=5, memory_every_steps=0,
                      install_sigterm_handler=False) as rec:
            for step in range(1, 31):
                time.sleep(0.004)
                rec.end_step(step, loss=1.0)
    assert len([w for w in got if "(rank 5, run 'no-nvml')" in str(w.message) and "GPU telemetry" in str(w.message)]) == 1
    assert not set(HW_COLUMNS) & set(_rows(run).column_names)


def test_a_cpu_process_samples_nothing_and_says_nothing(tmp_path, monkeypatch):
    nvml = fake_nvml()
    monkeypatch.setitem(__import__("sys").modules, "pynvml", nvml)
    monkeypatch.setattr(env_mod, "cuda_in_use", lambda: False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with Recorder(tmp_path / "run", rank=0, world_size=1, hw_every_s=0.01, flush_every_steps=5,
                      install_sigterm_handler=False) as rec:
            for step in range(1, 21):
                time.sleep(0.003)
                rec.end_step(step, loss=1.0)
    assert nvml.reads == [] and not set(HW_COLUMNS) & set(_rows(tmp_path / "run").column_names)


def test_an_unsupported_field_is_null_and_warned_once():
    nvml = fake_nvml()

    def unsupported(h):
        raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")

    nvml.nvmlDeviceGetPowerUsage = unsupported
    import sys

    sys.modules["pynvml"], saved = nvml, sys.modules.get("pynvml")
    try:
        s = HwSampler(1.0, Warner("test"), lambda: (True, 0, None))
        with pytest.warns(RuntimeWarning, match="hw/gpu_power_w cannot be read") as got:
            for _ in range(3):
                s.sample()
    finally:
        sys.modules["pynvml"] = saved
    assert len(got) == 1 and s.samples == 3
    (row,) = s.attach([(1, time.time() + 10, 0.1, None, None, None, None, None, None, None, None, None)]) or [None]
    assert row[10] is None  # no step had ended before these readings: they belong to none
    assert s.drain() == []


def test_hw_every_s_is_validated():
    with pytest.raises(ValueError, match="hw_every_s"):
        Recorder("/tmp/never-made-kforge-hw", hw_every_s=-1, rank=0, world_size=1)


def test_the_sampler_feeds_the_throttle_finding(tmp_path, monkeypatch):
    """End to end: readings taken on the sampling thread while the (fake) GPU throttles become an
    hw_throttle finding on the steps that ran then."""
    _as_cuda_process(monkeypatch)
    hot = {"on": False}
    nvml = fake_nvml(clock_mhz=lambda: 1200 if hot["on"] else 1980, reasons=lambda: 0x44 if hot["on"] else 0x4)
    monkeypatch.setitem(__import__("sys").modules, "pynvml", nvml)
    run = tmp_path / "run"
    with Recorder(run, rank=0, world_size=1, hw_every_s=0.03, flush_every_steps=10, memory_every_steps=0,
                  peak_tflops=100.0, install_sigterm_handler=False) as rec:  # the fake GPU has no peak in the table
        for step in range(1, 121):
            hot["on"] = 40 <= step <= 80  # this step's work runs throttled
            time.sleep(0.02)
            rec.end_step(step, loss=1.0)
    s = ingest_run(run).summary
    (f,) = [f for f in s["findings"] if f["kind"] == "hw_throttle"]
    # a reading taken while step s runs belongs to step s - 1 (the step that had ended)
    assert f["ranks"] == [0] and 38 <= f["first_step"] <= 44 and 76 <= f["last_step"] <= 80
    assert f["reasons"] == ["sw_power_cap", "hw_thermal_slowdown"] and "from 1,980 to 1,200 MHz" in f["message"]


@pytest.mark.timeout(120)  # the old code (sampling on the writer thread) fails after close_timeout_s, not hangs
@pytest.mark.parametrize("hang_in", ["nvmlInit", "the 4th reading"])
def test_a_hung_nvml_call_stalls_neither_the_writer_nor_the_loop_and_is_warned_once(tmp_path, monkeypatch, hang_in):
    """NVML never returns from its init, or answers a few reads and then never returns (a GPU fallen
    off the bus): end_step never waits for the writer, every row is written, close() returns at
    once, and one warning says it."""
    _as_cuda_process(monkeypatch)
    monkeypatch.setattr(hw_mod, "HANG_S", 0.5, raising=False)  # 10 s in a job: the test need not wait that long
    never = threading.Event()  # set only after the test, to let the stuck thread end
    nvml = fake_nvml()
    init, util = nvml.nvmlInit, nvml.nvmlDeviceGetUtilizationRates

    def init_then_hang():
        init()
        if threading.get_ident() not in nvml.elder and hang_in == "nvmlInit":
            never.wait()

    def util_then_hang(h):
        got = util(h)
        if threading.get_ident() not in nvml.elder and len(nvml.reads) > 3:
            never.wait()
        return got

    nvml.nvmlInit, nvml.nvmlDeviceGetUtilizationRates = init_then_hang, util_then_hang
    monkeypatch.setitem(__import__("sys").modules, "pynvml", nvml)
    run = tmp_path / "run"
    try:
        with pytest.warns(RuntimeWarning, match=r"NVML call hung for [0-9.]+ s on rank 3; telemetry off") as got:
            rec = Recorder(run, rank=3, world_size=4, hw_every_s=0.02, flush_every_steps=10, memory_every_steps=0,
                           close_timeout_s=10, install_sigterm_handler=False)
            for step in range(1, 601):  # 600 rows: more than the writer may lag behind (256) before end_step waits
                time.sleep(0.002)
                rec.end_step(step, loss=1.0)
            t0 = time.monotonic()
            rec.close()
            close_s = time.monotonic() - t0
    finally:
        never.set()
    assert len(nvml.reads) == (0 if hang_in == "nvmlInit" else 4)  # the sampler asked no more once a call hung
    hung = [w for w in got if "NVML call hung" in str(w.message) and "(rank 3, run 'run')" in str(w.message)]
    assert len(hung) == 1
    assert not [w for w in got if "(rank 3, run 'run')" in str(w.message) and "writer thread" in str(w.message)]
    assert close_s < 5  # the join of the stuck thread is bounded (hw.JOIN_S = 1 s), not close_timeout_s
    t = _rows(run)
    ended = [s for s, st in zip(t["step"].to_pylist(), t["step_time_s"].to_pylist()) if st is not None]
    assert sorted(ended) == list(range(1, 601))
    (end_file,) = run.glob("rank-*/*/end.json")
    end = json.loads(end_file.read_text())
    assert end["reason"] == "close" and end["rows_written"] >= 600 and end["dropped_rows_total"] == 0
    assert end["writer_wait_s"] < 1.0  # end_step kept its pace (a stuck writer makes it wait stall_s = 2 s)
