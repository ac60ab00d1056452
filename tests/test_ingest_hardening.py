"""Ingest hardening (issue 11, items 8-15): one bad input is skipped with a warning naming the file,
never fails the run; one run's failure of any kind never ends the CLI; names stay names."""

import glob
import json
import os
import pickle
import subprocess
import sys

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from ingest_fixtures import close_all, flush_all, open_ranks, part_files, run_steps, warns_each

import kforge_dash.ingest.run as ingest_mod
from kforge_dash import pipeline
from kforge_dash.cli.ingest import main
from kforge_dash.ingest.options import IngestError, IngestOptions, IngestResult, IngestWarning
from kforge_dash.ingest.run import ingest_run
from kforge_dash.pipeline import ingest_path

NO_EXPORT = ["--no-tensorboard", "--no-wandb"]


def make_run(path, monkeypatch, *, world=1, steps=20):
    """Part files of exactly 5 steps each; loss = step."""
    recs = open_ranks(str(path), world, flush_every_steps=1000)
    run_steps(monkeypatch, recs, range(1, steps + 1), step_time=lambda r, s: 1.0,
              values=lambda r, s: {"loss": float(s), "tokens": 10}, flush_every=5)
    close_all(recs)
    return str(path)


def read_outputs(run_dir):
    """steps.parquet, ranks.parquet (pyarrow: a path, never a pattern) and summary.json."""
    d = os.path.join(run_dir, "ingested")
    with open(os.path.join(d, "summary.json")) as f:
        summary = json.load(f)
    return (pl.from_arrow(pq.read_table(os.path.join(d, "steps.parquet"))),
            pl.from_arrow(pq.read_table(os.path.join(d, "ranks.parquet"))), summary)


def runner():
    try:
        return CliRunner(mix_stderr=False)
    except TypeError:  # click >= 8.2 always keeps stderr apart
        return CliRunner()


def rewrite_part(path, change, **write_kw):
    t = change(pq.read_table(path))
    pq.write_table(t, path, **write_kw)


# -- 8. a null step in one part ---------------------------------------------------------------

@pytest.mark.parametrize("statistics", [True, False])
def test_a_part_with_a_null_step_is_skipped_with_a_warning_naming_it(tmp_path, monkeypatch, statistics):
    run = make_run(tmp_path / "run", monkeypatch)
    victim = sorted(part_files(run))[1]  # steps 6..10

    def null_step(t):
        steps = t.column("step").to_pylist()
        steps[2] = None
        return t.set_column(t.schema.get_field_index("step"), "step", pa.array(steps, pa.int64()))

    rewrite_part(victim, null_step, write_statistics=statistics)
    with pytest.warns(IngestWarning, match="have no step"):
        res = ingest_run(run)
    steps, ranks, summary = read_outputs(run)
    assert steps["step"].to_list() == [*range(1, 6), *range(11, 21)]
    assert steps["loss"].to_list() == [float(s) for s in [*range(1, 6), *range(11, 21)]]
    [warning] = [w for w in summary["warnings"] if victim in w]
    assert "no step" in warning and "skipped" in warning
    assert res.summary["steps"] == 15


# -- 9. wrong-typed meta.json fields ------------------------------------------------------------

def test_wrong_typed_meta_fields_are_ignored_with_a_warning_naming_file_and_key(tmp_path, monkeypatch):
    run = make_run(tmp_path / "run", monkeypatch, world=2)
    [meta_path] = glob.glob(os.path.join(glob.escape(run), "rank-00000", "*", "meta.json"))
    with open(meta_path) as f:
        meta = json.load(f)
    meta.update(device="gpu", peak_tflops="fast", world_size="two", counts_tokens="yes")
    with open(meta_path, "w") as f:
        json.dump(meta, f)
    with warns_each(*(f"meta.json: field '{key}' is str" for key in ("device", "peak_tflops", "world_size", "counts_tokens"))):
        ingest_run(run)
    steps, _, summary = read_outputs(run)
    assert steps.height == 20 and steps["tokens"].to_list() == [20] * 20  # rows of both ranks, tokens counted
    for key in ("device", "peak_tflops", "world_size", "counts_tokens"):
        assert [w for w in summary["warnings"] if meta_path in w and repr(key) in w and "ignored" in w], key
    assert summary["device"] is None and summary["peak_tflops"] is None
    assert summary["world_size"] == 2  # rank 1's meta.json says so


def test_peak_override_still_gives_mfu_when_the_recorded_peak_is_garbage(tmp_path, monkeypatch):
    run = make_run(tmp_path / "run", monkeypatch)
    [meta_path] = glob.glob(os.path.join(glob.escape(run), "rank-00000", "*", "meta.json"))
    with open(meta_path) as f:
        meta = json.load(f)
    meta.update(peak_tflops=[1, 2], device={"name": 7, "type": "cuda"})
    with open(meta_path, "w") as f:
        json.dump(meta, f)
    with warns_each("field 'device.name' is int 7", "field 'peak_tflops' is list"):
        res = ingest_run(run, options=IngestOptions(peak_tflops=100.0, flops_per_token=1e9))
    assert [w for w in res.summary["warnings"] if "'device.name'" in w and meta_path in w]
    assert res.summary["peak_tflops"] == 100.0 and res.summary["mean_mfu"] is not None


# -- 10. self-loop symlinks ---------------------------------------------------------------------

def test_self_loop_symlinks_are_skipped_with_a_warning(tmp_path, monkeypatch):
    run = make_run(tmp_path / "run", monkeypatch)
    loop_rank = os.path.join(run, "rank-00004")
    os.symlink("rank-00004", loop_rank)
    rank0 = os.path.join(run, "rank-00000")
    loop_attempt = os.path.join(rank0, "loop")
    os.symlink("loop", loop_attempt)
    [attempt] = [e.path for e in os.scandir(rank0) if e.name != "loop"]
    loop_part = os.path.join(attempt, "part-000099.parquet")
    os.symlink("part-000099.parquet", loop_part)
    with pytest.warns(IngestWarning, match="Too many levels of symbolic links"):
        res = ingest_run(run)
    assert res.summary["steps"] == 20
    for path in (loop_rank, loop_attempt, loop_part):
        assert [w for w in res.summary["warnings"] if path in w and "skipped" in w], path
    out = ingest_path(str(tmp_path), tensorboard=False, wandb=False)  # a runs root with the loops in it
    assert [type(r) for r in out] == [IngestResult]


# -- 11. run directories named like glob patterns --------------------------------------------------

@pytest.mark.parametrize("name", ["sweep[lr=3e-4]", "**bold**", "a?b{c,d}"])
def test_run_dirs_named_like_glob_patterns_ingest_append_and_export(tmp_path, monkeypatch, name):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = str(tmp_path / name)
    recs = open_ranks(run, 2, flush_every_steps=1000)
    clock = run_steps(monkeypatch, recs, range(1, 11), step_time=lambda r, s: 1.0)
    flush_all(recs)
    first = ingest_path(run, wandb=False)
    run_steps(monkeypatch, recs, range(11, 16), step_time=lambda r, s: 1.0, clock=clock)
    flush_all(recs)
    [res] = ingest_path(run, wandb=False)  # an append: reads the old outputs back
    close_all(recs)
    assert isinstance(first[0], IngestResult) and isinstance(res, IngestResult) and res.appended
    steps, ranks, summary = read_outputs(run)
    assert steps["step"].to_list() == list(range(1, 16)) and ranks.height == 30
    tb = summary["exports"]["tensorboard"]
    assert tb["ok"], tb
    acc = EventAccumulator(os.path.dirname(tb["path"]))
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/loss")] == list(range(1, 16))
    # the findings read ranks.parquet too: no warning that they could not
    assert not [w for w in summary["warnings"] if "finding" in w.lower()], summary["warnings"]


# -- 12. a NUL in a scalar name; a polars panic ------------------------------------------------------

def test_a_nul_in_a_column_name_skips_that_part_with_a_warning(tmp_path, monkeypatch):
    run = make_run(tmp_path / "run", monkeypatch)
    victim = sorted(part_files(run))[3]  # steps 16..20
    rewrite_part(victim, lambda t: t.append_column("eval\x00loss", pa.array([1.0] * t.num_rows)))
    with warns_each("NUL", "steps 16-20 were trained but not recorded"):  # its heartbeat got to step 20
        res = ingest_run(run)
    assert res.summary["last_step"] == 15
    [warning] = [w for w in res.summary["warnings"] if victim in w]
    assert "NUL" in warning


def test_a_polars_panic_in_one_run_is_that_runs_failure_exit_3(tmp_path, monkeypatch):
    root = tmp_path / "root"
    good, bad = make_run(root / "good", monkeypatch), make_run(root / "panics", monkeypatch)
    real = ingest_mod._ingest_locked

    def panicking(run_dir, *a):
        if run_dir == bad:
            raise pl.exceptions.PanicException("called `Result::unwrap()` on an `Err` value: NulError")
        return real(run_dir, *a)

    monkeypatch.setattr(ingest_mod, "_ingest_locked", panicking)
    r = runner().invoke(main, [str(root), "-q", *NO_EXPORT])
    assert r.exit_code == 3, r.output
    assert bad in r.stderr and "PanicException" in r.stderr and good not in r.stderr
    assert read_outputs(good)[0].height == 20


# -- 13. negative steps vs W&B ------------------------------------------------------------------------

def wandb_steps(offline_run: str) -> list[int]:
    """The history steps in the offline run, read by wandb's own reader."""
    [path] = glob.glob(os.path.join(glob.escape(offline_run), "*.wandb"))
    out = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", path],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    return [int(rec["history"]["step"]["num"]) for rec in map(json.loads, out.splitlines()) if rec["type"] == "history"]


def test_wandb_export_of_negative_steps_warns_and_counts_what_it_kept(tmp_path, monkeypatch, clean_wandb_env):
    from kforge_dash.export.run import export_run

    run = str(tmp_path / "run")
    recs = open_ranks(run, 1)
    run_steps(monkeypatch, recs, range(-5, 7), step_time=lambda r, s: 0.5,  # steps -5..6 (a warm-up before 0)
              values=lambda r, s: {"loss": 3.0 - 0.1 * s, "tokens": 100})
    close_all(recs)
    ingest_run(run)
    with pytest.warns(RuntimeWarning, match=r"5 step\(s\) below 0"):
        res = export_run(run, tensorboard=False)
    assert res.wandb.ok and res.wandb.points == 7
    assert wandb_steps(res.wandb.path) == list(range(0, 7))


# -- 14. temp files of a killed ingest or export -----------------------------------------------------------

def plant_temps(run) -> list[str]:
    ing = os.path.join(run, "ingested")
    paths = [os.path.join(ing, ".ranks.parquet.4194301.tmp"), os.path.join(ing, ".summary.json.77.tmp"),
             os.path.join(run, ".kforge-events.4194301.tmp")]  # TensorBoard's temp: in RUN/ itself
    for p in paths:
        with open(p, "wb") as f:
            f.write(b"half written")
    wandb_tmp = os.path.join(ing, ".wandb-k1ll3d.tmp")
    os.makedirs(os.path.join(wandb_tmp, "wandb"))
    return [*paths, wandb_tmp]


def test_temp_files_left_by_a_killed_ingest_are_removed_even_when_the_run_is_unchanged(tmp_path, monkeypatch):
    run = make_run(tmp_path / "run", monkeypatch)
    ingest_path(run, wandb=False)  # with the TensorBoard export
    before = {n: open(os.path.join(run, "ingested", n), "rb").read() for n in ("steps.parquet", "ranks.parquet")}
    temps = plant_temps(run)
    res = ingest_run(run)
    assert res.skipped
    assert [p for p in temps if os.path.exists(p)] == []
    assert {n: open(os.path.join(run, "ingested", n), "rb").read() for n in before} == before


def test_temp_files_of_a_live_ingest_or_export_are_left_alone(tmp_path, monkeypatch):
    run = make_run(tmp_path / "run", monkeypatch)
    ingest_path(run, wandb=False)
    temps = plant_temps(run)
    lock = os.path.join(run, "ingested", ".ingest.lock")
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from filelock import FileLock; l = FileLock(sys.argv[1]); "
                               "l.acquire(); print('held', flush=True); sys.stdin.read()", lock],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(IngestError, match="another kforge-ingest"):
            ingest_run(run, options=IngestOptions(lock_timeout_s=0.2))
        assert [p for p in temps if not os.path.exists(p)] == []  # a live one's: kept
    finally:
        holder.communicate("")
    assert ingest_run(run).skipped
    assert [p for p in temps if os.path.exists(p)] == []


def test_the_pipeline_exports_under_the_runs_ingest_lock(tmp_path, monkeypatch):
    from filelock import FileLock, Timeout

    import kforge_dash.export.exporters as exporters
    from kforge_dash.export.outcome import ExporterOutcome

    run = make_run(tmp_path / "run", monkeypatch)
    seen = []

    class Probe:
        name, needs = "tensorboard", None

        def export(self, history):
            try:
                FileLock(os.path.join(run, "ingested", ".ingest.lock")).acquire(timeout=0)
                seen.append("free")
            except Timeout:
                seen.append("held")
            return ExporterOutcome(ok=True, path="probe")

    monkeypatch.setattr(exporters, "choose_exporters", lambda **kw: [Probe()])
    r = runner().invoke(main, [run, "-q", "--no-wandb"])
    assert r.exit_code == 0, r.output
    assert seen == ["held"]


# -- 15. --watch before the first flush; a failed --upload ------------------------------------------------

def test_watch_before_the_first_flush_says_waiting_not_error(tmp_path, monkeypatch):
    run = str(tmp_path / "run")
    recs = open_ranks(run, 2)  # meta.json written, no part file yet
    ticks = []

    def fake_sleep(seconds):
        ticks.append(seconds)
        if len(ticks) == 1:
            run_steps(monkeypatch, recs, range(1, 6), step_time=lambda r, s: 0.5)
            flush_all(recs)
        else:
            raise KeyboardInterrupt

    monkeypatch.setattr(pipeline.time, "sleep", fake_sleep)
    r = runner().invoke(main, [run, "--watch", "1", "-q", *NO_EXPORT])
    assert r.exit_code == 0, r.output
    assert r.stderr == "" and r.stdout == ""
    assert read_outputs(run)[0]["step"].to_list() == [1, 2, 3, 4, 5]
    close_all(recs)


def test_a_run_with_no_part_yet_is_reported_as_waiting(tmp_path, monkeypatch):
    run = str(tmp_path / "run")
    recs = open_ranks(run, 1)
    try:
        r = runner().invoke(main, [run, *NO_EXPORT])
        assert r.exit_code == 0 and r.stderr == "", r.output
        assert "waiting" in r.stdout and run in r.stdout
        r = runner().invoke(main, [run, "--json", *NO_EXPORT])
        got = json.loads(r.stdout)
        assert r.exit_code == 0 and got["failed"] == [] and [w["run_dir"] for w in got["waiting"]] == [run]
    finally:
        close_all(recs)
    r = runner().invoke(main, [run, *NO_EXPORT])  # closed without a row: that is a failure, not a wait
    assert r.exit_code == 1 and "no readable rows" in r.stderr


class _Fake:
    def __init__(self, name, needs, ok):
        self.name, self.needs, self.ok = name, needs, ok

    def export(self, history):
        from kforge_dash.export.outcome import ExporterOutcome

        if self.ok:
            return ExporterOutcome(ok=True, path=self.name)
        return ExporterOutcome(ok=False, error="no network: cannot reach api.wandb.ai:443")


def test_a_failed_upload_is_printed_even_quiet_and_exits_non_zero(tmp_path, monkeypatch):
    import kforge_dash.export.exporters as exporters

    run = make_run(tmp_path / "run", monkeypatch)
    monkeypatch.setattr(exporters, "choose_exporters",
                        lambda **kw: [_Fake("wandb", None, True), _Fake("upload", "wandb", False)])
    r = runner().invoke(main, [run, "-q", "--upload"])
    assert r.exit_code == 3
    assert r.stdout == "" and run in r.stderr and "upload" in r.stderr and "no network" in r.stderr


# -- the per-window work runs anywhere ---------------------------------------------------------------------

def test_the_window_work_is_one_function_of_plain_values(tmp_path, monkeypatch):
    from kforge_dash.ingest.plan import make_plan
    from kforge_dash.ingest.read import overlapping_parts
    from kforge_dash.ingest.run import WindowTask, ingest_window, plan_windows

    run = make_run(tmp_path / "run", monkeypatch, world=2)
    ingest_run(run)
    inputs = ingest_mod._list_inputs(run, os.path.join(run, "ingested"), ingest_mod.IngestOptions(force=True), [])
    plan = make_plan(inputs, [], force=True, chunk_rows=10)
    windows = plan_windows(plan.files, 10)
    assert len(windows) > 1
    tasks = [WindowTask(lo, hi, overlapping_parts(plan.files, lo, hi), plan.spec) for lo, hi in windows]
    got = [pickle.loads(pickle.dumps(ingest_window(pickle.loads(pickle.dumps(t))))) for t in tasks]
    steps = pl.concat([g.steps for g in got]).sort("step")
    want = read_outputs(run)[0].select(steps.columns)
    assert steps.equals(want)
    assert sum(g.rows.num_rows for g in got) == 40
