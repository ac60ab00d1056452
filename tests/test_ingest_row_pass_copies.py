"""The row pass's work space reused from batch to batch (buffers.Buffers and its callers): each
batch's values copied from polars' chunks, whatever their count, offsets and nulls, into buffers
kept from a bigger or smaller batch before; and the cheap checks that read them (dedup_rows'
step order, coalescing's key order, the slowest rank) give what the whole-frame polars
expressions give; an Arrow array made from numpy values and a mask is what pa.array makes."""

import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from kforge_dash.ingest.rowpass import coalesce, window
from kforge_dash.ingest.rowpass.buffers import Buffers
from kforge_dash.ingest.rowpass.ranks_writer import arrow_table
from kforge_dash.ingest.rowpass.reduce import Layout


def _column(rng, n: int, dtype, nulls: bool) -> pl.Series:
    values = rng.integers(-50, 50, n) if dtype == pl.Int64 else rng.random(n)
    s = pl.Series("x", values, dtype)
    return s.set(pl.Series(rng.random(n) < 0.3), None) if nulls else s


def _chunked(rng, dtype, nulls: bool) -> pl.Series:
    """Chunks of odd lengths that start at odd offsets into their buffers (slices: bit offsets
    of the validity bitmaps not multiples of 8), some without any null."""
    a, b = _column(rng, 1000, dtype, nulls), _column(rng, 37, dtype, nulls)
    return pl.concat([a.slice(3, 501), b.slice(5, 19), _column(rng, 20, dtype, False), a.slice(13)], rechunk=False)


@pytest.mark.parametrize("dtype", [pl.Int64, pl.Float64])
@pytest.mark.parametrize("nulls", [False, True])
def test_a_column_copied_into_a_reused_buffer_is_its_values_and_nulls(dtype, nulls):
    rng = np.random.default_rng(0)
    buf = Buffers()
    fill = -7 if dtype == pl.Int64 else -7.5
    # Big, then small, then big again: the same buffer each time, what it held before overwritten.
    for s in (_chunked(rng, dtype, nulls), _column(rng, 10, dtype, nulls).slice(1), _chunked(rng, dtype, nulls)):
        assert s.n_chunks() > 1 or len(s) < 20
        values, has = buf.column("v", s, fill)
        assert values.tolist() == s.fill_null(fill).to_list()
        if s.null_count():
            assert has.tolist() == s.is_not_null().to_list()
        else:
            assert has is None


def test_boolean_columns_keep_their_own_path():
    buf = Buffers()
    s = pl.concat([pl.Series([True, None, False] * 5), pl.Series([None, True])], rechunk=False)
    values, has = buf.column("c", s, False)
    assert values.tolist() == s.fill_null(False).to_list()
    assert has.tolist() == s.is_not_null().to_list()


def _polars_steps_increase(df: pl.DataFrame) -> bool:
    """The whole-frame expression dedup_rows used: within a block, no step at or below the last."""
    log = pl.col("step_time_s").is_null()
    same = ((pl.col("rank") == pl.col("rank").shift(1)) & (pl.col("attempt") == pl.col("attempt").shift(1))
            & (log == log.shift(1))).fill_null(False)
    return not df.select((same & (pl.col("step") <= pl.col("step").shift(1))).any()).item()


def _blocks(rng) -> pl.DataFrame:
    parts = []
    for _ in range(int(rng.integers(1, 6))):
        n = int(rng.integers(0, 8))
        steps = np.sort(rng.choice(50, n, replace=False)) if rng.random() < 0.7 else rng.integers(0, 10, n)
        parts.append(pl.DataFrame({
            "step": steps.astype(np.int64), "rank": np.full(n, rng.integers(0, 3), np.int64),
            "attempt": np.full(n, rng.integers(0, 2), np.int64),
            "step_time_s": pl.Series([None if rng.random() < 0.2 else 1.0 for _ in range(n)], dtype=pl.Float64)}))
    return pl.concat(parts, rechunk=False)


def test_the_step_order_check_agrees_with_the_polars_expression():
    rng = np.random.default_rng(1)
    buf, kinds = Buffers(), set()
    for _ in range(400):  # frames of 0-40 rows, one buffer for all
        df = _blocks(rng)
        want = _polars_steps_increase(df)
        kinds.add(want)
        assert window._steps_increase(df, buf) == want
    assert kinds == {True, False}


def test_steps_falling_where_a_block_starts_are_no_repeat():
    # Rank 1 starts again at step 0, the log rows of steps never ended come last, attempt 1
    # starts over: nothing to de-duplicate. Then step 5 of rank 1 twice: the last row kept.
    df = pl.DataFrame({"step": [3, 4, 5, 0, 5, 2, 9, 0], "rank": [0, 0, 0, 1, 1, 0, 1, 1],
                       "attempt": [0, 0, 0, 0, 0, 0, 0, 1],
                       "step_time_s": [1.0, 1.0, 1.0, 1.0, 1.0, None, None, 1.0]})
    repeats = {}
    assert window.dedup_rows(df, repeats, Buffers()) is df and not repeats
    twice = pl.concat([df.slice(0, 5), pl.DataFrame({"step": [5], "rank": [1], "attempt": [0], "step_time_s": [2.0]}),
                       df.slice(5)])
    out = window.dedup_rows(twice, repeats, Buffers())
    assert repeats == {(1, 0): 1}
    assert out.filter((pl.col("rank") == 1) & (pl.col("step") == 5))["step_time_s"].to_list() == [2.0]


def test_the_key_order_check_of_coalescing_reuses_its_buffer_across_sizes():
    buf = Buffers()
    agg = pl.DataFrame({"rank": [0, 1], "step": [2, 7]})
    for n, shuffle in ((40, False), (9, True), (30, False)):
        ends = pl.DataFrame({"rank": np.repeat([0, 1], n // 2 + 1)[:n], "step": np.tile(np.arange(n // 2 + 1), 2)[:n]})
        if shuffle:
            ends = ends.reverse()
        found = coalesce._match_sorted(ends, agg, buf)
        assert (found is None) == shuffle


def test_the_slowest_rank_is_the_lowest_with_the_longest_step_in_every_batch_size():
    rng = np.random.default_rng(2)
    buf = Buffers()
    for ranks, steps in ((8, 50), (3, 7), (5, 400)):
        times = rng.integers(1, 4, (ranks, steps)) / 4  # few distinct values: ties
        df = pl.DataFrame({"rank": np.repeat(np.arange(10, 10 + ranks), steps), "step": np.tile(np.arange(steps), ranks),
                           "step_time_s": times.ravel()})
        lay = Layout(df, buf)
        s = lay("step_time_s", None, "s")[0]
        assert lay.lowest(s == s.max(axis=0))[1].tolist() == (10 + times.argmax(axis=0)).tolist()


def test_rows_for_ranks_parquet_keep_their_chunks_without_a_copy():
    a = pl.DataFrame({"step": [1, 2], "loss": [0.5, None], "_counts": [True, False]})
    df = pl.concat([a, a], rechunk=False)
    t = arrow_table(df, exclude=("_counts",))
    assert t.column_names == ["step", "loss"]
    assert t.column("loss").num_chunks == 2
    assert t.column("loss").chunk(1).buffers()[1].address == df["loss"].get_chunks()[1].to_arrow().buffers()[1].address
    assert t.to_pydict() == {"step": [1, 2, 1, 2], "loss": [0.5, None, 0.5, None]}
    assert arrow_table(df.clear()).schema == pa.schema([("step", pa.int64()), ("loss", pa.float64()), ("_counts", pa.bool_())])


def test_np_array_is_pa_array():
    from kforge_dash.ingest.rowpass.arrays import np_array

    for values in (np.array([1.5, np.nan, -np.inf, 4.0]), np.arange(4, dtype=np.int64), np.arange(4, dtype=np.uint32),
                   np.arange(8, dtype=np.float64)[::2], np.array([], np.float64), np.array([True, False, True, True])):
        for mask in (None, np.array([False, True, False, True])[:len(values)], np.zeros(len(values), bool)):
            want, got = pa.array(values, mask=mask), np_array(values, mask)
            assert got.type == want.type and got.null_count == want.null_count
            assert got.is_valid().equals(want.is_valid())
            fill = False if values.dtype.kind == "b" else 0
            assert np.array_equal(got.fill_null(fill).to_numpy(zero_copy_only=False),
                                  want.fill_null(fill).to_numpy(zero_copy_only=False), equal_nan=values.dtype.kind == "f")
