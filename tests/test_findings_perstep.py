"""The per-step facts over ranks by every way perstep has (grid_units' row groups, step windows as
numpy matrices, polars' group-by), each checked against the rules written plainly
(tests/reference_math.reference_perstep), never against another way: a grid, a rank missing a step,
restarts (one inside a straggler block), NaN and null in phases, ties, -0.0; in many windows as in
one; a window with a row twice where another is missing is no matrix."""

from __future__ import annotations

import os

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute below
import pyarrow.parquet as pq
import pytest
from findings_fixtures import Clock, close_all, drive, install, nan_run, open_ranks
from reference_math import perstep_rows, reference_perstep

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


def _grid(ranks, steps, *, attempt=0, seed=0, neg0=True, nan=True):
    """ranks.parquet-like rows of ``ranks`` x ``steps``, rank by rank: times with ties, NaN, and
    -0.0 (``neg0``: the blocks' ranks x steps way steps aside for a sign bit)."""
    rng = np.random.default_rng(seed)
    n = len(ranks) * len(steps)
    def vals():  # ties from a few values; most values noisy, so that the order of a sum shows in its bits
        v = rng.choice([0.25, 0.5, 0.125, -0.0 if neg0 else 0.0, 0.0, 0.75, np.nan if nan else 1.0, 1.5], n)
        return np.where(rng.random(n) < 0.7, v + rng.random(n) / 3, v)

    ckpt = pa.array(np.full(n, 0.5), mask=np.tile(np.asarray(steps) % 4 != 0, len(ranks)))  # null but every 4th
    return pa.table({"step": np.tile(np.asarray(steps, np.int64), len(ranks)),
                     "rank": np.repeat(np.asarray(ranks, np.int64), len(steps)),
                     "attempt": np.full(n, attempt, np.int64), "step_time_s": rng.choice([1.0, 2.0, 1.5, 2.5], n),
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


WAYS = ("default", "no-units", "no-matrices")


def _per_step(monkeypatch, facts, way):
    """perstep.per_step in small windows (many of each, two threads), by ``way``: as it chooses,
    with grid_units off, or with grid_units and the matrices off (polars' group-by alone)."""
    with monkeypatch.context() as m:
        m.setattr(perstep, "WINDOW_ROWS", 60)
        m.setattr(perstep, "usable_cpus", lambda: 2)
        if way != "default":
            m.setattr(grid_units, "plan", lambda path: None)
        if way == "no-matrices":
            m.setattr(Window, "of", classmethod(lambda cls, df, buf=None, **kw: None))
        return perstep.per_step(facts)


def _units(facts):
    st = facts.steps.select("step", pl.col("step_work_median_s").alias("_st"))
    return perstep._by_units(facts, st, perstep.block_size(facts.steps.height))


def _same_value(got, want, exact):
    if want is None or want != want:  # null, or NaN (a per-step NaN is written as null)
        return got is None or got != got if want != want else got is None
    return got == want if exact else got == pytest.approx(want, rel=1e-12, abs=1e-15)


def _check(facts, got, *, nan_median_either=False):
    """``got`` (per_step's two frames) against reference_perstep over ranks.parquet's rows; True when
    a block's median excess was NaN in the reference and a number in ``got`` (``nan_median_either``)."""
    rows = perstep_rows(pq.read_table(facts.ranks_path).to_pylist(), facts.phases)
    st = dict(zip(facts.steps["step"].to_list(), facts.steps["step_work_median_s"].to_list()))
    W = perstep.block_size(facts.steps.height)
    want_steps, want_blocks = reference_perstep(rows, facts.phases.own, facts.phases.data[0], W, st)
    med, blk = got
    assert sorted(med["step"].to_list()) == sorted(want_steps)
    assert blk.height == len(want_blocks)
    either = False
    # a step's facts are actual ranks' values: exact; a block's medians and sums are means of two
    # middle values and sums, which the ways compute in other orders: the last bit may differ
    for frame, want, key, exact in ((med, want_steps, lambda r: r["step"], True),
                                    (blk, want_blocks, lambda r: (r["rank"], r["attempt"], r["_block"]), False)):
        for row in frame.iter_rows(named=True):
            for c, v in want[key(row)].items():
                if nan_median_either and c.endswith("\0ex") and v != v and row[c] == row[c]:
                    either = True
                    continue
                assert _same_value(row[c], v, exact), (key(row), c, row[c], v)
    return either


@pytest.mark.parametrize("ranks,neg0", [([0, 2, 3, 7, 8, 11], True), ([0, 2, 3, 7, 8, 11], False), ([4], False)])
def test_a_grid_gives_the_reference_facts_every_way(tmp_path, monkeypatch, ranks, neg0):
    # units of 10, 7 and 23 steps, each in two row groups of ranks (ranks not contiguous); blocks
    # of 13 steps cut across units (a carry); NaN, ties, -0.0 or not, one rank or six, and a
    # checkpoint phase null but every 4th step
    spans = [range(3, 300), range(300, 413), range(413, 1250)]
    halves = (ranks[:2], ranks[2:]) if len(ranks) > 1 else (ranks,)
    tables = [_grid(rs, sp, seed=i * 2 + j, neg0=neg0) for i, sp in enumerate(spans) for j, rs in enumerate(halves)]
    facts = _facts(tmp_path / "ranks.parquet", tables)
    assert _units(facts) is not None  # one full grid: grid_units takes it
    for way in WAYS:
        got = _per_step(monkeypatch, facts, way)
        # polars' median (the group-by way) leaves NaN out where numpy's and the reference's give NaN
        skipped = _check(facts, got, nan_median_either=way == "no-matrices")
        assert skipped == (way == "no-matrices")
        assert got[0]["ckpt_max"].null_count() == 1247 - 312  # null where no rank checkpointed


@pytest.mark.parametrize("case", ["missing", "attempts", "null", "order", "gap", "step-major", "restart-in-block"])
def test_a_run_that_is_not_one_grid_gives_the_reference_facts(tmp_path, monkeypatch, case):
    a, b = _grid([0, 1, 2], range(1, 13), seed=1, nan=False), _grid([0, 1, 2], range(13, 30), seed=2, nan=False)
    if case == "missing":  # rank 1 lacks step 20
        b = b.filter(pa.compute.invert(pa.compute.and_(pa.compute.equal(b["rank"], 1), pa.compute.equal(b["step"], 20))))
    elif case == "attempts":  # a restart between the units
        b = _grid([0, 1, 2], range(13, 30), attempt=1, seed=2, nan=False)
    elif case == "restart-in-block":  # a restart at step 17, inside a 5-step block: two attempts in it
        b = pa.concat_tables([_grid([0, 1, 2], range(13, 17), seed=2, nan=False),
                              _grid([0, 1, 2], range(17, 30), attempt=1, seed=3, nan=False)])
    elif case == "null":  # an own phase not timed at one row
        b = b.set_column(4, "time/data_s", pa.array([None] + b["time/data_s"].to_pylist()[1:], pa.float64()))
    elif case == "order":  # the units written out of step order
        a, b = b, a
    elif case == "gap":  # no step 13..14 at all
        b = _grid([0, 1, 2], range(15, 30), seed=2, nan=False)
    elif case == "step-major":  # rows step by step, not rank by rank
        b = b.sort_by([("step", "ascending"), ("rank", "ascending")])
    facts = _facts(tmp_path / "ranks.parquet", [a, b])
    assert _units(facts) is None
    for way in WAYS:
        got = _per_step(monkeypatch, facts, way)
        assert got[0].height == (27 if case == "gap" else 29)
        _check(facts, got)


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


def test_every_way_keeps_the_sign_of_zero(tmp_path, monkeypatch):
    # ranks' own work -0.0, 2, 0.0, 3, 0.0, 1 at every step: the median rank's is a zero and rank 0's
    # excess a zero throughout, where sums of zeros may keep or lose the sign by the order they
    # run in: the matrices' cost is +0.0
    t = _grid(list(range(6)), range(1, 1001), neg0=False)
    col = np.repeat([-0.0, 2.0, 0.0, 3.0, 0.0, 1.0], 1000)
    t = t.set_column(t.schema.get_field_index("time/data_s"), "time/data_s", pa.array(col))
    facts = _facts(tmp_path / "ranks.parquet", [t.slice(0, 3000), t.slice(3000)])
    assert _units(facts) is not None
    for way in WAYS:
        got = _per_step(monkeypatch, facts, way)
        _check(facts, got, nan_median_either=way == "no-matrices")
        cost = got[1].filter(pl.col("rank") == 0)["time/data_s\0cost"].to_numpy()
        # (the group-by way's one-step last block sums a lone -0.0 to -0.0: the matrices' sums are +0.0)
        assert (cost == 0).all() and (way == "no-matrices" or not np.signbit(cost).any()), way


def test_units_too_big_to_hold_are_read_in_pieces(tmp_path, monkeypatch):
    # the grid above with room for about a third of its largest unit: that unit is read in three
    # pieces of steps (each decoding its row groups again); with room for almost nothing, more
    # pieces than MAX_PIECES: the step windows. The reference's facts either way
    ranks, spans = [0, 2, 3, 7, 8, 11], [range(3, 300), range(300, 413), range(413, 1250)]
    tables = [_grid(rs, sp, seed=i * 2 + j) for i, sp in enumerate(spans) for j, rs in enumerate((ranks[:2], ranks[2:]))]
    facts = _facts(tmp_path / "ranks.parquet", tables)
    assert len(grid_units._pieces(grid_units.plan(facts.ranks_path)[0], 6, 13)) == 3
    for unit_bytes, pieces in ((100_000, 1 + 1 + 3), (1_000, None)):
        monkeypatch.setattr(grid_units, "UNIT_BYTES", unit_bytes)
        assert (grid_units._pieces(grid_units.plan(facts.ranks_path)[0], 6, 13) or [None]).__len__() == (pieces or 1)
        assert (_units(facts) is None) == (pieces is None)
        _check(facts, _per_step(monkeypatch, facts, "default"))


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
def test_per_step_facts_are_the_reference_in_one_window_and_in_many_two_at_a_time(tmp_path, monkeypatch):
    from kforge_dash.findings.finding import classify_phases

    run = nan_run(tmp_path, monkeypatch)
    ingest_run(run)
    steps = pl.read_parquet(f"{run}/ingested/steps.parquet")
    o = FindingsOptions()
    facts = RunFacts(steps=steps, ranks_path=f"{run}/ingested/ranks.parquet", launches=[], summary={"ranks": [0, 1, 2, 3]},
                     opts=o, phases=classify_phases(steps.columns, o), hosts={})
    monkeypatch.setattr(grid_units, "plan", lambda path: None)  # step windows
    _check(facts, perstep.per_step(facts))
    monkeypatch.setattr(perstep, "WINDOW_ROWS", 40)  # 5-step windows (one straggler block each)
    monkeypatch.setattr(perstep, "usable_cpus", lambda: 2)
    assert len(perstep.windows(facts, perstep.WINDOW_ROWS // 2)) == 9  # [0, 5), [5, 10) ... [40, 41)
    _check(facts, perstep.per_step(facts))
