"""What ingest pays before and around the rows: footers read ahead on threads (the same plan and
warnings, in the listing's order, as on one thread), imports it does not need, and numpy's idle
BLAS threads."""

import os
import subprocess
import sys
import threading

import pyarrow as pa
import pyarrow.parquet as pq
from ingest_fixtures import close_all, flush_all, open_ranks, part_files, read_outputs, run_steps

import kforge_dash.ingest.footers as footers
import kforge_dash.ingest.parquet_io as parquet_io
from kforge_dash.ingest import plan as plan_mod
from kforge_dash.ingest import run as run_mod
from kforge_dash.ingest import shards
from kforge_dash.ingest.options import IngestOptions, PartVanished
from kforge_dash.ingest.run import ingest_run
from kforge_record import compact
from kforge_record.schema import part_span

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _values(r, s):
    return {"loss": 1.0 / s, "tokens": 100}


def _many_parts(tmp_path, monkeypatch):
    """3 ranks x 10 parts, two of them with a footer that cannot be read."""
    run = str(tmp_path / "many")
    recs = open_ranks(run, 3, flush_every_steps=4, merge_parts=False)
    run_steps(monkeypatch, recs, range(1, 41), step_time=lambda r, s: 0.1 + 0.01 * r, values=_values, flush_every=4)
    close_all(recs)
    parts = sorted(part_files(run))
    with open(parts[4], "r+b") as f:
        f.truncate(100)
    with open(parts[21], "wb") as f:
        f.write(b"not parquet")
    return run, parts


def _plan(run):
    warnings = []
    opts = IngestOptions(force=True)
    inputs = run_mod._list_inputs(run, os.path.join(run, "ingested"), opts, warnings)
    plan = plan_mod.make_plan(inputs, opts, warnings)
    return (plan.files, plan.first_ended, plan.last_ended, plan.spec, [a.parts for a in plan.attempts],
            list(plan.cache.entries.items())), warnings  # the manifest's rows in the listing's order too


def test_footers_read_on_threads_give_the_plan_and_warnings_of_one_thread(tmp_path, monkeypatch):
    run, parts = _many_parts(tmp_path, monkeypatch)
    monkeypatch.setattr(footers, "THREADS", 1)
    alone, alone_warnings = _plan(run)
    assert [w.split(":")[0] for w in alone_warnings if "corrupt" in w] == [parts[4], parts[21]]

    real = parquet_io.read_metadata
    readers, done = set(), []
    last_read = threading.Event()

    def spied(path):
        readers.add(threading.current_thread().name)
        if path == parts[0]:  # the listing's first part comes back last: results must not follow completion order
            assert last_read.wait(10)
        try:
            return real(path)
        finally:
            done.append(path)
            if path == parts[-1]:
                last_read.set()

    monkeypatch.setattr(parquet_io, "read_metadata", spied)
    monkeypatch.setattr(footers, "THREADS_MIN_PARTS", 1)
    monkeypatch.setattr(footers, "THREADS", 2)
    monkeypatch.setattr(footers, "CHUNK", 3)
    threaded, threaded_warnings = _plan(run)
    assert len(readers) == 2 and threading.current_thread().name not in readers
    assert done.index(parts[-1]) < done.index(parts[0])
    assert threaded_warnings == alone_warnings
    assert threaded == alone
    assert not [t for t in threading.enumerate() if t.name.startswith("kforge-footers")]


def test_a_part_merged_away_under_threaded_footer_reads_lists_again_and_leaves_no_thread(tmp_path, monkeypatch):
    run = tmp_path / "run"
    recs = open_ranks(str(run), 2, flush_every_steps=2, merge_parts=False)
    run_steps(monkeypatch, recs, range(1, 21), step_time=lambda r, s: 0.1, flush_every=2)
    flush_all(recs)
    want = ingest_run(run, force=True).summary
    real = shards.stat_inputs
    merged = []

    def stat_then_merge(listing):  # the recorder merges right after ingest listed the folders
        out = real(listing)
        if not merged:
            for af in listing:
                c = compact.Compactor(af.dir, warn=None)
                for p in af.parts:
                    c.part_written(part_span(os.path.basename(p)).first, pq.read_metadata(p).num_rows)
            merged.append(True)
        return out

    vanished_on = []
    read_attempt = shards.read_attempt

    def spied(*a, **k):
        try:
            return read_attempt(*a, **k)
        except PartVanished:
            vanished_on.append(threading.current_thread().name)
            raise

    monkeypatch.setattr(shards, "stat_inputs", stat_then_merge)
    monkeypatch.setattr(shards, "read_attempt", spied)
    monkeypatch.setattr(footers, "THREADS_MIN_PARTS", 1)
    monkeypatch.setattr(footers, "THREADS", 2)
    monkeypatch.setattr(footers, "CHUNK", 2)
    got = ingest_run(run, force=True).summary
    close_all(recs)
    assert vanished_on and all(name.startswith("kforge-footers") for name in vanished_on)
    assert merged and got["steps"] == want["steps"] == 20 and got["ranks"] == [0, 1]
    assert not [w for w in got["warnings"] if "part" in w]
    assert read_outputs(str(run))[1].height == 40
    assert not [t for t in threading.enumerate() if t.name.startswith("kforge-footers")]


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
             part("e.parquet", b"[1]")]  # JSON, but not an object: no kforge facts, rows kept
    warnings = []
    got = [shards.read_part(p, 0, warnings) for p in paths]
    assert [None if g is None else g.dropped_rows_total for g in got] == [2, 2, None, None, None]
    assert got[4] is not None and (got[4].min_step, got[4].max_step) == (1, 2)
    assert warnings == [f"{p}: says rank 3 but lies under rank 0; counted as rank 0" for p in paths[:2]] + [
        f"{p}: written with kforge schema 99.0, newer than this kforge reads (1.0); upgrade kforge to ingest it; skipped"
        for p in paths[2:4]]


def _python(code: str, **env) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OPENBLAS_")}
    out = subprocess.run([sys.executable, "-c", code], env=dict(clean, PYTHONPATH=ROOT, **env), cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_ingest_does_not_import_the_recorder():
    got = _python("import sys\nfrom kforge_dash.ingest.run import ingest_run\n"
                  "print(sorted(m for m in sys.modules if m.startswith('kforge_record.')))")
    assert got == "['kforge_record.atomic', 'kforge_record.model', 'kforge_record.schema', 'kforge_record.version']"
    # The schema alone (what kforge_dash.contract reads) needs neither pyarrow nor numpy.
    assert _python("import sys, kforge_record.schema\nprint('pyarrow' in sys.modules, 'numpy' in sys.modules)") == "False False"
    assert _python("import kforge_record\nfrom kforge_record import ModelSpec, Recorder\nimport kforge_record.recorder as r\n"
                   "print(Recorder is r.Recorder is kforge_record.Recorder, ModelSpec.__name__)") == "True ModelSpec"


_TIMEOUT = """
import ctypes, os
import kforge_dash.ingest.run
import numpy
(lib,) = {line.split()[-1] for line in open("/proc/self/maps") if "openblas" in line}
print(ctypes.CDLL(lib).openblas_thread_timeout(), os.environ.get("OPENBLAS_THREAD_TIMEOUT"))
"""


def test_numpy_blas_threads_sleep_when_idle_and_the_environment_is_left_alone():
    """numpy's OpenBLAS (this environment's numpy links it) reads OPENBLAS_THREAD_TIMEOUT as it loads."""
    assert _python(_TIMEOUT) == "4 None"
    assert _python(_TIMEOUT, OPENBLAS_THREAD_TIMEOUT="9") == "9 9"  # the user's choice wins
