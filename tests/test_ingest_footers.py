"""Part footers: the kforge metadata shared between parts is still checked part by part; parts sharing
a schema keep their own facts and a wrong column type is still refused; a footer is read from the
file's tail alone; a file that is no footer warns as pyarrow's own open words it."""

import os

import pyarrow as pa
import pyarrow.parquet as pq

from kforge_dash.ingest.inputs import shards


def test_parts_sharing_their_kforge_metadata_are_each_checked(tmp_path):
    """The parsed ``kforge`` metadata is shared between parts with the same bytes (a rank's parts):
    every part still gets its own warnings, and a newer major is refused part by part."""
    def part(name, kv: bytes):
        path = str(tmp_path / name)
        table = pa.table({"step": pa.array([1, 2], pa.int64()), "step_time_s": pa.array([0.5, 0.5], pa.float64())})
        pq.write_table(table.replace_schema_metadata({b"kforge": kv}), path)
        return path

    same = b'{"schema_version": "1.0", "rank": 3, "dropped_rows_total": 2}'
    newer = b'{"schema_version": "99.0", "rank": 0}'
    paths = [part("a.parquet", same), part("b.parquet", same), part("c.parquet", newer), part("d.parquet", newer),
             part("e.parquet", b"[1]")]  # JSON, but not an object: no kforge facts, rows kept, said so
    warnings = []
    got = [shards.read_part(p, 0, warnings) for p in paths]
    assert [None if g is None else g.dropped_rows_total for g in got] == [2, 2, None, None, None]
    assert got[4] is not None and (got[4].min_step, got[4].max_step) == (1, 2)
    assert warnings == [f"{p}: says rank 3 but lies under rank 0; counted as rank 0" for p in paths[:2]] + [
        f"{p}: written with kforge schema 99.0, newer than this kforge reads (1.0); upgrade kforge to ingest it; skipped"
        for p in paths[2:4]] + [f"{paths[4]}: unreadable kforge metadata (JSON, but not an object); rows kept"]


def _rchar() -> int:
    """Bytes this process has read through read()/pread() so far (page cache included)."""
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


def test_a_footer_is_read_from_the_file_tail_alone_and_bad_files_warn_as_before(tmp_path):
    from pyarrow._parquet import ParquetReader

    from kforge_dash.ingest.inputs import parquet_io

    n = 200_000  # a ~1.6 MB file: pyarrow alone reads its last 64 KB to find a ~1 KB footer
    big = str(tmp_path / "big.parquet")
    pq.write_table(pa.table({"step": pa.array(range(n), pa.int64()), "step_time_s": pa.array([0.5] * n, pa.float64())}),
                   big, compression="none")
    wide = str(tmp_path / "wide.parquet")  # a footer longer than the first read of the tail
    pq.write_table(pa.table({f"c{i:03d}": pa.array([1.0], pa.float64()) for i in range(300)}), wide)
    for path in (big, wide):
        assert parquet_io.read_metadata(path).equals(pq.read_metadata(path))
    parquet_io.read_metadata(big)  # (the first read of a tail is as long as the last footer needed)
    before = _rchar()
    parquet_io.read_metadata(big)
    assert 0 < _rchar() - before < 16 * 1024
    # Whatever is not a footer goes through pyarrow's own open, so the warning is what it always was.
    cases = {"empty.parquet": b"", "short.parquet": b"PAR1", "garbage.parquet": b"not parquet at all" * 100,
             "bad-thrift.parquet": b"PAR1" + b"\x07" * 50 + (50).to_bytes(4, "little") + b"PAR1",
             "too-long.parquet": b"PAR1" + b"\x00" * 20 + (10**6).to_bytes(4, "little") + b"PAR1"}
    paths = []
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        paths.append(str(tmp_path / name))
    paths += [str(tmp_path / "missing.parquet")]
    for path in paths:
        got, want = [], []
        assert parquet_io.open_footer(path, got) is None
        try:
            ParquetReader().open(path)  # the open ingest always used (pq.read_metadata words a folder otherwise)
        except Exception as e:
            want.append(f"{path}: corrupt or truncated part file ({type(e).__name__}: {e}); skipped")
        assert got == want and len(got) == 1
    # Not a regular file (a folder, a FIFO): never handed to pyarrow, said so plainly (regular_file.py).
    (tmp_path / "a-folder.parquet").mkdir()
    os.mkfifo(tmp_path / "a-pipe.parquet")
    for name, kind in (("a-folder.parquet", "a directory"), ("a-pipe.parquet", "a named pipe (FIFO)")):
        got = []
        assert parquet_io.open_footer(str(tmp_path / name), got) is None
        assert got == [f"{tmp_path / name}: {kind}, not a regular file: not read; skipped"]


def test_footers_sharing_a_schema_keep_their_own_facts_and_a_wrong_type_is_still_refused(tmp_path):
    from kforge_dash.ingest.inputs import parquet_io as footer_schema
    from kforge_dash.ingest.inputs.shards import read_part

    def part(name, steps, step_time):
        path = str(tmp_path / name)
        pq.write_table(pa.table({"step": pa.array(steps, pa.int64()), "step_time_s": step_time}), path)
        return path

    footer_schema._SCHEMA_FACTS.clear()
    a = part("a.parquet", [1, 2], pa.array([0.5, None], pa.float64()))
    b = part("b.parquet", [7, 9], pa.array([0.5, 0.5], pa.float64()))
    bad = part("bad.parquet", [3], pa.array([1], pa.int64()))  # step_time_s as int64: same names, other schema
    warnings = []
    pa_, pb, pbad = (read_part(p, 0, warnings) for p in (a, b, bad))
    assert len(footer_schema._SCHEMA_FACTS) == 2  # a and b share one entry
    assert (pa_.min_step, pa_.max_step, pa_.has_log_rows, pb.min_step, pb.max_step, pb.has_log_rows) == (1, 2, True, 7, 9, False)
    assert pa_.columns is pb.columns == {"step": "int64", "step_time_s": "double"}
    assert pbad is None and warnings == [f"{bad}: column 'step_time_s' is int64, expected double; skipped"]
