"""The per-step facts over ranks: through numpy matrices and through polars' group-by, each the facts of
the rules written plainly (tests/reference_math.reference_perstep); in many windows as in one; a
window with a row twice where another is missing is no matrix."""

from __future__ import annotations

import os

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute below
import pyarrow.parquet as pq
import pytest
from findings_fixtures import Clock, close_all, drive, install, nan_run, open_ranks
from reference_math import reference_perstep

from kforge_dash import ingest_run
from kforge_dash.findings import grid_units, perstep
from kforge_dash.findings.finding import Phases, RunFacts, classify_phases
from kforge_dash.findings.matrix import Window
from kforge_dash.findings.thresholds import FindingsOptions


def _window(run_dir):
    out = os.path.join(run_dir, "ingested")
    steps = pl.read_parquet(os.path.join(out, "steps.parquet"))
    o = FindingsOptions()
    facts = RunFacts(steps=steps, ranks_path=os.path.join(out, "ranks.parquet"), launches=[], summary={}, opts=o,
                     phases=classify_phases(steps.columns, o))
    ph = facts.phases
    lf = pl.scan_parquet(facts.ranks_path).filter(pl.col("step_time_s").is_not_null()).select(
        "step", "rank", "attempt", "step_time_s", *ph.own, perstep.own_work(ph.own).alias("_own"),
        perstep.own_work(ph.data).alias("_data"), perstep.own_work(ph.checkpoint).alias("_ckpt"),
        perstep.own_work(ph.eval).alias("_eval"), perstep.own_work(ph.wait).fill_null(0.0).alias("_wait"))
    st = steps.select("step", pl.col("step_work_median_s").alias("_st"))
    return lf.collect(), ph, st


def _like(got: pl.DataFrame, want: dict, key) -> None:
    for row in got.iter_rows(named=True):
        for c, v in want[key(row)].items():
            assert row[c] == (None if v is None else pytest.approx(v, rel=1e-12, abs=1e-15)), (key(row), c, row[c], v)


def test_matrix_and_group_by_give_the_reference_facts(tmp_path, monkeypatch):
    clock = install(monkeypatch, Clock())
    recs = open_ranks(tmp_path / "r", 4)

    def phases(r, s):  # rank 3 slow to load; rank 0 checkpoints every 10 steps; ties in the wait
        ph = [("data", 0.01 + (0.02 if r == 3 else 0.0) + 0.001 * ((r * 7 + s) % 5)), ("optimizer", 0.005)]
        return ph + ([("checkpoint", 0.1)] if r == 0 and s % 10 == 0 else [])

    drive(recs, range(1, 61), clock, phases=phases)
    close_all(recs)
    ingest_run(recs[0].run_dir)
    df, ph, st = _window(recs[0].run_dir)
    win = Window.of(df)
    fast = win.per_step(ph.own, ph.data)
    slow = perstep._grouped(df.lazy(), ph)
    W = 5
    want_steps, want_blocks = reference_perstep(df.to_dicts(), ph.own, "_data", W,
                                                dict(zip(st["step"].to_list(), st["_st"].to_list())))
    assert fast is not None
    for med in (fast, slow):  # each way against the rules written plainly, not against each other
        _like(med, want_steps, lambda row: row["step"])
    assert fast["ckpt_max"].null_count() == 54  # null where no rank checkpointed, never 0.0
    assert fast.filter(pl.col("step") == 10)["ckpt_max"].item() == pytest.approx(0.1)
    # no eval phase timed (a column null throughout, never gathered): null, and the critical rank's
    # side work is its checkpoint alone
    assert fast["eval_max"].null_count() == 60 and fast["crit_side"].null_count() == 0
    # straggler blocks (sums may differ in the last bit from the reference's: another order of additions)
    fb = win.blocks(fast, fast.join(st, on="step")["_st"].to_numpy(), ph.own, W)
    sb = perstep._blocks_grouped(df, slow.join(st, on="step"), ph.own, W).sort("rank", "_block")
    fb = fb.select(sb.columns).sort("rank", "_block")
    assert fb.schema == sb.schema and fb.height == sb.height == len(want_blocks) == 4 * 13  # steps 1-4, ..., 60
    for blk in (fb, sb):
        _like(blk, want_blocks, lambda row: (row["rank"], row["attempt"], row["_block"]))
    assert fb.filter(pl.col("rank") == 3)["time/data_s\0ex"].min() > 0.015  # rank 3's slow loader
    # a step without one of the ranks is not a matrix: the group-by way takes it
    assert Window.of(df.filter(~((pl.col("step") == 5) & (pl.col("rank") == 2)))) is None


# --- grid_units.py: ranks.parquet read row group by row group, windows cut from whole units ----------

OWN = ("time/data_s", "time/opt_s")
PHASES = Phases(own=OWN, wait=("time/fwd_bwd_s",), data=("time/data_s",), checkpoint=("time/checkpoint_s",), eval=())


def _grid(ranks, steps, *, attempt=0, seed=0, neg0=True):
    """ranks.parquet-like rows of ``ranks`` x ``steps``, rank by rank: times with ties, NaN, and
    -0.0 (``neg0``: the blocks' ranks x steps way steps aside for a sign bit)."""
    rng = np.random.default_rng(seed)
    n = len(ranks) * len(steps)
    def vals():  # ties from a few values; most values noisy, so that the order of a sum shows in its bits
        v = rng.choice([0.25, 0.5, 0.125, -0.0 if neg0 else 0.0, 0.0, 0.75, np.nan, 1.5], n)
        return np.where(rng.random(n) < 0.7, v + rng.random(n) / 3, v)

    ckpt = pa.array(np.full(n, 0.5), mask=np.tile(np.asarray(steps) % 4 != 0, len(ranks)))  # null but every 4th
    return pa.table({"step": np.tile(np.asarray(steps, np.int64), len(ranks)),
                     "rank": np.repeat(np.asarray(ranks, np.int64), len(steps)),
                     "attempt": np.full(n, attempt, np.int64), "step_time_s": rng.choice([1.0, 2.0, 1.5, np.nan], n),
                     "time/data_s": vals(), "time/opt_s": vals(), "time/fwd_bwd_s": rng.choice([0.0, 0.5, -0.0], n),
                     "time/checkpoint_s": ckpt})


def _facts(path, tables):
    """Write ``tables`` as ranks.parquet, one row group each; RunFacts over it."""
    with pq.ParquetWriter(path, tables[0].schema) as w:
        for t in tables:
            w.write_table(t)
    steps = sorted(set(pa.concat_tables(tables).column("step").to_pylist()))
    st = pl.DataFrame({"step": steps, "step_work_median_s": np.linspace(1.0, 2.0, len(steps))})
    return RunFacts(steps=st, ranks_path=str(path), launches=[], summary={}, opts=FindingsOptions(), phases=PHASES)


def _bits(df: pl.DataFrame):
    return [(c, df[c].is_null().to_list(), df[c].fill_null(0).to_numpy().view(np.uint64).tolist()
             if df[c].dtype == pl.Float64 else df[c].to_list()) for c in df.columns]


def _both(monkeypatch, facts):
    """(per_step by units or None, per_step by step windows); small windows: many of each."""
    monkeypatch.setattr(perstep, "WINDOW_ROWS", 60)
    st = facts.steps.select("step", pl.col("step_work_median_s").alias("_st"))
    fast = perstep._by_units(facts, st, perstep.block_size(facts.steps.height))
    monkeypatch.setattr(grid_units, "plan", lambda path: None)
    return fast, perstep.per_step(facts)


def _same(fast, slow):
    med = pl.concat(fast[0], how="vertical")
    blk = pl.concat(fast[1], how="vertical")
    assert _bits(med) == _bits(slow[0]) and _bits(blk) == _bits(slow[1])


@pytest.mark.parametrize("ranks,neg0", [([0, 2, 3, 7, 8, 11], True), ([0, 2, 3, 7, 8, 11], False), ([4], False)])
def test_units_give_the_step_windows_bits(tmp_path, monkeypatch, ranks, neg0):
    # units of 10, 7 and 23 steps, each in two row groups of ranks (ranks not contiguous); blocks
    # of 5 steps cut across units (a carry); NaN, ties, -0.0 or not, one rank or six, and a
    # checkpoint phase null but every 4th step
    # (1,247 steps: blocks of 13, longer than numpy's pairwise sums add one by one)
    spans = [range(3, 300), range(300, 413), range(413, 1250)]
    halves = (ranks[:2], ranks[2:]) if len(ranks) > 1 else (ranks,)
    tables = [_grid(rs, sp, seed=i * 2 + j, neg0=neg0) for i, sp in enumerate(spans) for j, rs in enumerate(halves)]
    fast, slow = _both(monkeypatch, _facts(tmp_path / "ranks.parquet", tables))
    assert fast is not None and len(fast[0]) > 3
    _same(fast, slow)
    assert slow[0]["ckpt_max"].null_count() == 1247 - 312  # null where no rank checkpointed


@pytest.mark.parametrize("case", ["missing", "attempts", "null", "order", "gap", "step-major"])
def test_units_step_aside_where_the_run_is_not_one_grid(tmp_path, monkeypatch, case):
    a, b = _grid([0, 1, 2], range(1, 13), seed=1), _grid([0, 1, 2], range(13, 30), seed=2)
    if case == "missing":  # rank 1 lacks step 20
        b = b.filter(pa.compute.invert(pa.compute.and_(pa.compute.equal(b["rank"], 1), pa.compute.equal(b["step"], 20))))
    elif case == "attempts":  # a restart between the units
        b = _grid([0, 1, 2], range(13, 30), attempt=1, seed=2)
    elif case == "null":  # an own phase not timed at one row
        b = b.set_column(4, "time/data_s", pa.array([None] + b["time/data_s"].to_pylist()[1:], pa.float64()))
    elif case == "order":  # the units written out of step order
        a, b = b, a
    elif case == "gap":  # no step 13..14 at all
        b = _grid([0, 1, 2], range(15, 30), seed=2)
    elif case == "step-major":  # rows step by step, not rank by rank
        b = b.sort_by([("step", "ascending"), ("rank", "ascending")])
    fast, slow = _both(monkeypatch, _facts(tmp_path / "ranks.parquet", [a, b]))
    assert fast is None
    assert slow[0].height == (27 if case == "gap" else 29)


def test_a_sum_over_one_phase_is_the_phase():
    # the matrices use an own-work phase for the sum over it alone (perstep's alias): exact only
    # if polars' sum keeps -0.0, NaN (and its sign) and null
    x = pl.DataFrame({"a": [-0.0, 0.0, float("nan"), None, 1.5, -float("nan")]})
    got = x.select(perstep.own_work(["a"]).alias("o"))["o"]
    assert got.is_null().to_list() == x["a"].is_null().to_list()
    assert got.fill_null(0).to_numpy().view(np.uint64).tolist() == x["a"].fill_null(0).to_numpy().view(np.uint64).tolist()


def test_segments_fill_the_same_matrix_as_the_index(tmp_path):
    # two row-pass windows (segments) in one findings window, ranks not contiguous
    t = pa.concat_tables([_grid([1, 4, 5], range(1, 8)), _grid([1, 4, 5], range(8, 12), seed=3)])
    df = pl.from_arrow(t)
    seg = Window.of(df)
    assert seg is not None and seg.segments == [(0, 1, 7), (21, 8, 4)]
    idx = Window.of(df.sample(fraction=1.0, shuffle=True, seed=0))  # any other order: the index
    assert idx is not None and idx.segments is None
    for c in ("step_time_s", "time/data_s"):
        assert np.array_equal(seg.col(c), idx.col(c), equal_nan=True)
    assert Window.of(pl.from_arrow(pa.concat_tables([t, t.slice(0, 1)]))) is None  # a (rank, step) twice


def test_units_keep_the_sign_of_zero(tmp_path, monkeypatch):
    # ranks' own work -0.0, 2, 0.0, 3, 0.0, 1 at every step: the median rank's is a zero (np.partition
    # picks a +0.0 from this order) and rank 0's excess -0.0 throughout, where sums and means of
    # zeros may keep or lose the sign by the order they run in: still the step windows' bits
    t = _grid(list(range(6)), range(1, 1001), neg0=False)
    col = np.repeat([-0.0, 2.0, 0.0, 3.0, 0.0, 1.0], 1000)
    t = t.set_column(t.schema.get_field_index("time/data_s"), "time/data_s", pa.array(col))
    fast, slow = _both(monkeypatch, _facts(tmp_path / "ranks.parquet", [t.slice(0, 3000), t.slice(3000)]))
    assert fast is not None
    _same(fast, slow)
    cost = slow[1].filter(pl.col("rank") == 0)["time/data_s\0cost"].to_numpy()
    assert (cost == 0).all() and not np.signbit(cost).any()


def test_units_too_big_to_hold_are_read_in_pieces(tmp_path, monkeypatch):
    # the same run as above with room for about a third of its largest unit: that unit is read in
    # three pieces of steps (each decoding its row groups again), the same bits; with room for
    # almost nothing, more pieces than MAX_PIECES: the step windows
    ranks, spans = [0, 2, 3, 7, 8, 11], [range(3, 300), range(300, 413), range(413, 1250)]
    tables = [_grid(rs, sp, seed=i * 2 + j) for i, sp in enumerate(spans) for j, rs in enumerate((ranks[:2], ranks[2:]))]
    facts = _facts(tmp_path / "ranks.parquet", tables)
    assert len(grid_units._pieces(grid_units.plan(facts.ranks_path)[0], 6, 13)) == 3
    monkeypatch.setattr(grid_units, "UNIT_BYTES", 100_000)
    assert len(grid_units._pieces(grid_units.plan(facts.ranks_path)[0], 6, 13)) == 1 + 1 + 3
    fast, slow = _both(monkeypatch, facts)
    assert fast is not None
    _same(fast, slow)
    monkeypatch.undo()
    monkeypatch.setattr(grid_units, "UNIT_BYTES", 1_000)
    assert _both(monkeypatch, facts)[0] is None


def test_window_matrix_refuses_a_row_twice_where_another_is_missing():
    from kforge_dash.findings.matrix import Window

    steps, ranks = [1, 1, 2, 2], [0, 1, 0, 1]
    df = pl.DataFrame({"step": steps, "rank": ranks, "v": [1.0, 2.0, 3.0, 4.0]})
    win = Window.of(df.reverse())
    assert win.col("v").tolist() == [[1.0, 2.0], [3.0, 4.0]]  # steps x ranks, whatever the row order
    # (2, 1) missing and (1, 0) twice: as many rows as cells, but no matrix
    assert Window.of(df.with_columns(pl.Series("step", [1, 1, 2, 1]), pl.Series("rank", [0, 1, 0, 0]))) is None
    # ranks 0, 1, 3 (rank 2 recorded nothing): still a matrix, its columns the ranks present
    gap = Window.of(pl.DataFrame({"step": steps + [1, 2], "rank": ranks + [3, 3], "v": [1.0, 2, 3, 4, 5, 6]}))
    assert gap.ranks.tolist() == [0, 1, 3] and gap.col("v").tolist() == [[1.0, 2.0, 5.0], [3.0, 4.0, 6.0]]


@pytest.mark.filterwarnings("ignore::kforge_dash.ingest.options.IngestWarning")
def test_per_step_facts_are_the_same_in_many_windows_two_at_a_time(tmp_path, monkeypatch):
    from kforge_dash.findings import perstep
    from kforge_dash.findings.finding import classify_phases

    run = nan_run(tmp_path, monkeypatch)
    ingest_run(run)
    steps = pl.read_parquet(f"{run}/ingested/steps.parquet")
    o = FindingsOptions()
    facts = RunFacts(steps=steps, ranks_path=f"{run}/ingested/ranks.parquet", launches=[], summary={"ranks": [0, 1, 2, 3]},
                     opts=o, phases=classify_phases(steps.columns, o), hosts={})
    whole = perstep.per_step(facts)
    monkeypatch.setattr(perstep, "WINDOW_ROWS", 40)  # 5-step windows (one straggler block each)
    monkeypatch.setattr(perstep, "usable_cpus", lambda: 2)
    assert len(perstep.windows(facts, perstep.WINDOW_ROWS // 2)) == 9  # [0, 5), [5, 10) ... [40, 41)
    many = perstep.per_step(facts)
    for a, b in zip(whole, many):
        assert a.height and a.equals(b, null_equal=True)
