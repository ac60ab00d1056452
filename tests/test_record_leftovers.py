"""What a new Recorder removes from the earlier attempt folders of its rank (kforge_record/leftovers.py):
replaced parts only when a whole merged part vouches for their rows, temp files only when no
live writer can own them, and never an exception into the training loop."""

import json
import os
import shutil
import subprocess
import sys
import time
import warnings

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import kforge_record.leftovers as leftovers
from kforge_record import Recorder
from kforge_record.compact import Compactor
from kforge_record.env import hostname, process_identity, process_start_time
from kforge_record.schema import END_FILE, META_FILE

TMP = ".part-000003.parquet.tmp"
MERGED = "part-000000-000009.parquet"
REPLACED = [f"part-{i:06d}.parquet" for i in range(10)]


def _start_and_close(run):
    """A new attempt of rank 0 (a resumed job): its recorder cleans the earlier folders."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rec = Recorder(run, rank=0, world_size=1, install_sigterm_handler=False)
        rec.end_step(1, loss=1.0)
        rec.close()
    return [str(w.message) for w in caught if "kforge_record" in str(w.message)]


def _folder(run, name, *, meta=None, end=False, tmp_age_s=0.0):
    d = run / "rank-00000" / name
    d.mkdir(parents=True)
    if meta is not None:
        (d / META_FILE).write_text(json.dumps(meta))
    if end:
        (d / END_FILE).write_text("{}")
    (d / TMP).write_bytes(b"half a part")
    t = time.time() - tmp_age_s
    os.utime(d / TMP, (t, t))
    return d


def _dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_temp_files_go_only_where_no_live_writer_can_own_them(tmp_path):
    run = tmp_path / "run"
    me = {"host": hostname(), "pid": os.getpid(), "process_start_time": process_start_time()}
    kept = {
        "live": _folder(run, "a-live", meta=me),
        "other host, fresh": _folder(run, "b-elsewhere", meta={**me, "host": "not-" + hostname()}),
        "no meta.json, fresh": _folder(run, "c-nometa"),
    }
    removed = {
        "closed (end.json)": _folder(run, "d-closed", meta=me, end=True),
        "pid gone": _folder(run, "e-dead", meta={**me, "pid": _dead_pid()}),
        "pid reused": _folder(run, "f-reused", meta={**me, "process_start_time": me["process_start_time"] - 3600}),
        "other host, stale": _folder(run, "g-stale", meta={**me, "host": "not-" + hostname()},
                                     tmp_age_s=leftovers.STALE_TMP_S + 60),
        "no meta.json, stale": _folder(run, "h-nometa-stale", tmp_age_s=leftovers.STALE_TMP_S + 60),
    }
    _start_and_close(run)
    assert {k: (d / TMP).exists() for k, d in kept.items()} == dict.fromkeys(kept, True)
    assert {k: (d / TMP).exists() for k, d in removed.items()} == dict.fromkeys(removed, False)


def _killed_mid_merge(run, name="a-killed"):
    """An attempt folder as a kill after publishing its first merged part leaves it: the merged
    part beside every part it replaces (copies of them put back), written by a dead process."""
    d = run / "rank-00000" / name
    d.mkdir(parents=True)
    (d / META_FILE).write_text(json.dumps({"host": hostname(), "pid": _dead_pid()}))
    c = Compactor(str(d), warn=None)
    for i in range(10):
        t = pa.table({"step": pa.array([i, i], pa.int64())})
        pq.write_table(t, d / REPLACED[i])
        shutil.copy(d / REPLACED[i], _copy_path(d, i))
        c.part_written(i, 2, t)
    for i in range(10):
        os.replace(_copy_path(d, i), d / REPLACED[i])
    assert sorted(os.listdir(d)) == [META_FILE, MERGED, *REPLACED]
    return d


def _copy_path(d, i):
    return d.parent / f"copy-{d.name}-{i}"


def test_replaced_parts_go_when_the_merged_part_lists_them(tmp_path):
    run = tmp_path / "run"
    d = _killed_mid_merge(run)
    assert _start_and_close(run) == []
    assert sorted(os.listdir(d)) == [META_FILE, MERGED]
    assert pq.read_table(d / MERGED).column("step").to_pylist() == [i for i in range(10) for _ in range(2)]


def test_a_part_replaced_twice_goes_when_the_top_merged_part_lists_its_first_merge(tmp_path):
    """part-000003 left beside part-000000-000099, whose replaces names part-000000-000009 (gone)."""
    run = tmp_path / "run"
    d = run / "rank-00000" / "a-killed"
    d.mkdir(parents=True)
    c = Compactor(str(d), warn=None)
    for i in range(100):
        t = pa.table({"step": pa.array([i], pa.int64())})
        pq.write_table(t, d / f"part-{i:06d}.parquet")
        if i == 3:
            shutil.copy(d / "part-000003.parquet", run / "keep")
        c.part_written(i, 1, t)
    os.replace(run / "keep", d / "part-000003.parquet")
    assert sorted(os.listdir(d)) == ["part-000000-000099.parquet", "part-000003.parquet"]
    _start_and_close(run)
    assert os.listdir(d) == ["part-000000-000099.parquet"]


def test_a_replaced_part_stays_unless_the_merged_part_provably_holds_its_rows(tmp_path):
    run = tmp_path / "run"
    unreadable = _killed_mid_merge(run, "a-unreadable")
    with open(unreadable / MERGED, "r+b") as f:  # the footer gone (a damaged or half-written file)
        f.truncate(os.path.getsize(unreadable / MERGED) - 20)
    other_rows = _killed_mid_merge(run, "b-other-rows")
    pq.write_table(pa.table({"step": pa.array([4, 4, 4], pa.int64())}), other_rows / REPLACED[4])
    said = _start_and_close(run)
    assert sorted(os.listdir(unreadable)) == [META_FILE, MERGED, *REPLACED]
    assert sorted(os.listdir(other_rows)) == [META_FILE, MERGED, REPLACED[4]]
    assert any(str(unreadable / REPLACED[0]) in w and "footer cannot be read" in w for w in said)
    assert any(str(other_rows / REPLACED[4]) in w and "holds 3 rows where the merged part holds 2" in w for w in said)


def test_a_failing_clean_up_is_a_warning_and_recording_goes_on(tmp_path, monkeypatch):
    run = tmp_path / "run"
    d = _killed_mid_merge(run)

    def refuse(path):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(leftovers, "_remove", refuse)
    said = _start_and_close(run)
    assert any("could not remove what a killed merge left" in w and str(d) in w for w in said)
    assert sorted(os.listdir(d)) == [META_FILE, MERGED, *REPLACED]
    (mine,) = [p for p in (run / "rank-00000").iterdir() if p.name != d.name]
    assert pq.read_table(next(mine.glob("part-*.parquet"))).column("step").to_pylist() == [1]


def test_a_replaced_part_the_writer_could_not_remove_goes_at_close(tmp_path, monkeypatch):
    real = os.remove
    refusing = [True]

    def remove(path, *a, **k):
        if refusing[0] and os.path.basename(str(path)) in REPLACED:
            raise PermissionError(13, "Permission denied", path)
        return real(path, *a, **k)

    monkeypatch.setattr(os, "remove", remove)
    rec = Recorder(tmp_path / "run", rank=0, world_size=1, flush_every_steps=1, install_sigterm_handler=False)
    with pytest.warns(RuntimeWarning, match="could not remove part-000000.parquet, replaced by " + MERGED):
        for step in range(1, 13):
            rec.end_step(step, loss=1.0)
            rec.flush()
    d = rec.attempt_dir
    assert sorted(n for n in os.listdir(d) if n.startswith("part-")) == sorted([MERGED, *REPLACED, "part-000010.parquet",
                                                                               "part-000011.parquet"])
    refusing[0] = False
    rec.close()
    assert sorted(n for n in os.listdir(d) if n.startswith("part-")) == [MERGED, "part-000010.parquet", "part-000011.parquet"]


def _claimed_not_filled(run, name, pid):
    """A kill between the O_EXCL claim of a merged name and the rename that fills it (a filesystem
    without hard links): an empty merged part beside all ten parts it was to replace."""
    d = run / "rank-00000" / name
    d.mkdir(parents=True)
    (d / META_FILE).write_text(json.dumps({"host": hostname(), "pid": pid, "process_start_time": process_start_time()}))
    for i in range(10):
        pq.write_table(pa.table({"step": pa.array([i], pa.int64())}), d / REPLACED[i])
    (d / MERGED).write_bytes(b"")
    return d


def test_an_empty_merged_part_goes_once_its_writer_is_gone(tmp_path):
    run = tmp_path / "run"
    dead = _claimed_not_filled(run, "a-dead", _dead_pid())
    live = _claimed_not_filled(run, "b-live", os.getpid())
    _start_and_close(run)
    assert sorted(os.listdir(dead)) == [META_FILE, *REPLACED]
    assert sorted(os.listdir(live)) == [META_FILE, MERGED, *REPLACED]  # it may be filled any moment


def test_a_publish_whose_temp_file_a_clean_up_removed_is_still_a_success(tmp_path, monkeypatch):
    """The clean-up may remove a live writer's temp file right after the link published it: the
    write succeeded (its rows must not be written again under the next name)."""
    import kforge_record.atomic as atomic

    tmp, path = tmp_path / ".part-000000.parquet.tmp", tmp_path / "part-000000.parquet"
    tmp.write_bytes(b"rows")
    real_link = os.link

    def link_then_clean_up(src, dst):
        real_link(src, dst)
        os.remove(src)  # leftovers.py, from another process, between the link and our remove

    monkeypatch.setattr(atomic.os, "link", link_then_clean_up)
    atomic.publish_new(str(tmp), str(path))  # no error: published
    assert path.read_bytes() == b"rows" and not tmp.exists()


def test_an_empty_merged_part_filled_while_its_writer_was_judged_stays(tmp_path, monkeypatch):
    """Between the size check and the removal a publish may fill the claimed name (its writer
    misjudged as gone): the now-whole merged part must stay."""
    run = tmp_path / "run"
    d = _claimed_not_filled(run, "a-filled", _dead_pid())
    real = leftovers.folder_writer_gone

    def filled_meanwhile(folder):
        (d / MERGED).write_bytes(b"a whole merged part")
        return real(folder)

    monkeypatch.setattr(leftovers, "folder_writer_gone", filled_meanwhile)
    _start_and_close(run)
    assert (d / MERGED).read_bytes() == b"a whole merged part"


def test_a_writer_is_judged_by_its_exact_identity_not_the_wall_clock(tmp_path):
    """meta.json's ``process`` (boot, pid namespace, start in clock ticks) decides: a live writer
    whose wall clock stepped stays live, a reused pid is gone, another pid namespace is unknown."""
    run = tmp_path / "run"
    me = process_identity()
    assert None not in me.values()  # (Linux /proc: what CI runs on)
    stepped = _folder(run, "a-clock-stepped", meta={"host": hostname(), "pid": os.getpid(), "process": me,
                                                    "process_start_time": process_start_time() - 100})
    reused = _folder(run, "b-pid-reused", meta={"host": hostname(), "pid": os.getpid(), "process_start_time":
                                                process_start_time(), "process": dict(me, start_ticks=me["start_ticks"] - 1)})
    other_ns = _folder(run, "c-other-namespace", meta={"host": hostname(), "pid": _dead_pid(), "process_start_time": None,
                                                       "process": dict(me, pid_ns=me["pid_ns"] + 1)})
    _start_and_close(run)
    assert (stepped / TMP).exists()  # its writer runs: the temp file may be its next part
    assert not (reused / TMP).exists()
    assert (other_ns / TMP).exists()  # its pids are not visible from here: only the age rule applies
    new = [d for d in (run / "rank-00000").iterdir() if d.name not in {"a-clock-stepped", "b-pid-reused",
                                                                       "c-other-namespace"}]
    assert json.loads((new[0] / META_FILE).read_text())["process"] == me
