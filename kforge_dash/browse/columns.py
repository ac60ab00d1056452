"""Which charts the compare page opens with: the columns of an ingested steps.parquet that hold a
value (read from the Parquet footer alone), and the default charts among them."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from kforge_dash.browse.series import DEFAULT_CHARTS
from kforge_record.regular_file import check_regular_file


def metrics_with_values(path: str | Path) -> set[str]:
    """The columns of an ingested steps.parquet holding at least one non-null value, from the
    footer's statistics alone (a CPU run's mem_* columns are all null). A column without
    statistics counts as having values."""
    try:
        check_regular_file(path)  # a FIFO: refused, never blocks
        meta = pq.read_metadata(path)
    except Exception as e:  # pyarrow raises several types for a bad file; name the file
        raise ValueError(f"{path}: not a readable Parquet file ({e})") from None
    empty: set[str] | None = None
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        here = set()
        for i in range(rg.num_columns):
            c = rg.column(i)
            st = c.statistics
            if st is not None and st.has_null_count and st.null_count == rg.num_rows:
                here.add(c.path_in_schema)
        empty = here if empty is None else empty & here
    names = set(meta.schema.names)
    return names - (empty or set()) if meta.num_rows else set()


def default_metrics(available: list[str], with_values: set[str]) -> list[str]:
    """The charts a page opens with: DEFAULT_CHARTS that are offered and that some selected run
    has a value of (no chart, and no 'no mem_peak_bytes in …' note, for what no run recorded)."""
    return [m for m in DEFAULT_CHARTS if m in available and m in with_values]
