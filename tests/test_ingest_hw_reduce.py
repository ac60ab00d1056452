"""steps.parquet's hw/throttle_reasons is the bitwise OR of the ranks' NVML bitmasks (int64, null where
no rank reported one), whether a window is a full grid (every rank the same steps) or not (a rank
missing a step), read whole or in batches of ranks (a window bigger than chunk_rows). The other hw/
columns stay means over reporting ranks."""

import os

import polars as pl
import pytest
from ingest_fixtures import FakeClock, close_all, open_ranks, run_steps

import kforge_dash.ingest.rowpass.reduce as reduce
import kforge_record.recorder as recorder_mod
from kforge_dash.ingest.options import IngestOptions
from kforge_dash.ingest.run import ingest_run

REASONS, CLOCK = "hw/throttle_reasons", "hw/sm_clock_mhz"
RANKS, STEPS = 3, range(1, 13)


def _reported(r: int, s: int):
    """Rank r's throttle reasons at step s, or None: ranks 0 and 1 both report on steps % 3 == 0
    (0x4 power cap, 0x20 thermal), rank 1 alone on steps % 3 == 1 (rank 0 gives NaN at step 4,
    which counts as no report), nobody on steps % 3 == 2; rank 2 never."""
    if r == 0 and s % 3 == 0:
        return float(0x4)
    if r == 0 and s == 4:
        return float("nan")
    if r == 1 and s % 3 in (0, 1):
        return float(0x20)
    return None


def _record(run: str, monkeypatch, *, skip: set) -> None:
    """Every rank ends every step but those in ``skip`` ((rank, step) never ended)."""
    clock = FakeClock()
    monkeypatch.setattr(recorder_mod, "perf_counter", clock)
    recs = open_ranks(run, RANKS, flush_every_steps=10**6, hw_every_s=0)  # one part per rank: one window
    for s in STEPS:
        for r, rec in recs.items():
            if (r, s) in skip:
                continue
            rec.start_step()
            clock.t += 0.1
            v = {"loss": 1.0 / s, "tokens": 100}
            if _reported(r, s) is not None:
                v[REASONS] = _reported(r, s)
                v[CLOCK] = 1000.0 + 100 * r
            rec.end_step(s, **v)
    close_all(recs)


class Paths:
    """Which layouts an ingest's batches took (a full grid or not), and how many batches it added."""

    def __init__(self, monkeypatch):
        self.grid, self.not_grid, self.batches = 0, 0, 0
        real_grid, real_add = reduce._grid, reduce.StepAcc.add

        def grid(df, buf):
            g = real_grid(df, buf)
            if g is None:
                self.not_grid += 1
            else:
                self.grid += 1
            return g

        def add(acc, df):
            self.batches += 1
            return real_add(acc, df)

        monkeypatch.setattr(reduce, "_grid", grid)
        monkeypatch.setattr(reduce.StepAcc, "add", add)


def _steps_file(run: str) -> str:
    return os.path.join(run, "ingested", "steps.parquet")


@pytest.mark.parametrize("grid", [True, False], ids=["grid", "not-a-grid"])
def test_throttle_reasons_are_or_ed_over_ranks_on_every_reduction_path(tmp_path, monkeypatch, grid):
    run = str(tmp_path / "run")
    skip = set() if grid else {(2, 5)}  # rank 2 misses step 5: the group-by path
    _record(run, monkeypatch, skip=skip)

    whole = Paths(monkeypatch)
    ingest_run(run)
    assert (whole.grid > 0, whole.not_grid > 0, whole.batches) == (grid, not grid, 1)  # one window, one batch
    with open(_steps_file(run), "rb") as f:
        one_read = f.read()
    steps = pl.read_parquet(_steps_file(run))

    assert steps.schema[REASONS] == pl.Int64
    want = {s: (0x24 if s % 3 == 0 else 0x20 if s % 3 == 1 else None) for s in STEPS}
    assert dict(zip(steps["step"].to_list(), steps[REASONS].to_list())) == want
    assert steps.filter(pl.col("step") == 3)[REASONS].item() == 0x4 | 0x20  # 36, not the mean 18.0
    # The SM clock stays the mean over the ranks that reported one.
    assert steps.schema[CLOCK] == pl.Float64
    assert steps.filter(pl.col("step") == 3)[CLOCK].item() == 1050.0
    assert steps.filter(pl.col("step") == 2)[CLOCK].item() is None
    # ranks.parquet keeps each rank's own bitmask.
    ranks = pl.read_parquet(os.path.join(run, "ingested", "ranks.parquet")).filter(pl.col("step") == 3).sort("rank")
    assert ranks[REASONS].to_list() == [4.0, 32.0, None]

    batched = Paths(monkeypatch)
    ingest_run(run, options=IngestOptions(chunk_rows=5, force=True))  # the window (3 x 12 rows) in batches of ranks
    assert batched.batches >= RANKS
    with open(_steps_file(run), "rb") as f:
        assert f.read() == one_read  # the very same file


def test_throttle_reasons_are_null_when_no_rank_ever_reported_one(tmp_path, monkeypatch):
    run = str(tmp_path / "run")
    recs = open_ranks(run, 2, hw_every_s=0)
    run_steps(monkeypatch, recs, range(1, 8), step_time=lambda r, s: 0.1,
              values=lambda r, s: {"loss": 1.0, **({REASONS: float("nan")} if r == 0 else {})})
    close_all(recs)
    ingest_run(run)
    steps = pl.read_parquet(_steps_file(run))
    assert steps.schema[REASONS] == pl.Int64
    assert steps[REASONS].null_count() == steps.height == 7
