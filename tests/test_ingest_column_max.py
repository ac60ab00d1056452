"""parquet_io.column_max: a part's last time from its footer's statistics, or from its values when
the writer kept none; the same answer either way (goodput's last record of a launch uses it)."""

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kforge_dash.ingest.inputs.parquet_io import column_max


@pytest.mark.parametrize("stats", [True, False])
@pytest.mark.parametrize("values", [[3.0, None, 7.5, 1.0], [None, None], [2.0]])
def test_column_max_equals_the_values_max_with_or_without_statistics(tmp_path, stats, values):
    path = str(tmp_path / "part.parquet")
    table = pa.table({"step": pa.array(range(len(values)), pa.int64()), "time": pa.array(values, pa.float64())})
    pq.write_table(table, path, row_group_size=2, write_statistics=stats)
    assert pq.read_metadata(path).num_row_groups == (len(values) + 1) // 2
    want = pl.read_parquet(path)["time"].max()
    assert column_max(path, "time") == want


def test_column_max_of_a_column_the_file_lacks_is_none(tmp_path):
    path = str(tmp_path / "part.parquet")
    pq.write_table(pa.table({"step": pa.array([1, 2], pa.int64())}), path)
    assert column_max(path, "time") is None
