"""What summary.json and the CLI say about the exports when one fails: an exporter that raises or is
not installed, W&B and negative steps, a failed upload (printed even with -q, exit 3)."""

import glob
import json
import os
import subprocess
import sys

import pytest
from ingest_fixtures import close_all, open_ranks, read_outputs, run_steps
from parts_fixtures import make_run, runner, small_run

from kforge_dash.cli.ingest import main
from kforge_dash.ingest.run import ingest_run
from kforge_dash.pipeline import ingest_path


class _RaisingExporter:
    """An exporter with a bug of its own: it raises instead of reporting an outcome."""

    needs = None

    def __init__(self, name):
        self.name = name

    def export(self, history):
        raise RuntimeError("boom")


@pytest.mark.parametrize("how", ["raises", "unavailable"])
@pytest.mark.parametrize("asked", [{"tensorboard": True, "wandb": False, "upload": False},
                                   {"tensorboard": False, "wandb": False, "upload": True}])
def test_export_fallbacks_have_the_shape_of_export_result(tmp_path, monkeypatch, how, asked):
    import sys

    from kforge_dash.export.exporters import choose_exporters
    from kforge_dash.export.run import ExporterOutcome, ExportResult

    run = small_run(str(tmp_path / "run"), monkeypatch)
    exporters = choose_exporters(**asked)
    if how == "raises":
        exporters = [_RaisingExporter(x.name) for x in exporters]
        error = "RuntimeError: boom"
    else:  # the exporters' packages are not installed
        for mod in ("tensorboard.compat.proto.event_pb2", "tensorboard.summary.writer.record_writer", "wandb"):
            monkeypatch.setitem(sys.modules, mod, None)
        error = None
    out = ingest_path(run, exporters=exporters)[0]
    # what ExportResult.to_dict gives when every asked-for exporter failed
    bad = ExporterOutcome(ok=False, error="x")
    wandb = asked["wandb"] or asked["upload"]
    want = ExportResult(run_dir=run, tensorboard=bad if asked["tensorboard"] else None, wandb=bad if wandb else None,
                        upload=bad if asked["upload"] else None).to_dict()
    got = read_outputs(run)[2]["exports"]
    assert got == out.summary["exports"]
    assert got.keys() == want.keys()
    for k, v in want.items():
        if v is None:
            assert got[k] is None
        else:
            assert got[k].keys() == v.keys() and got[k]["ok"] is False and got[k]["path"] is None
            if error:
                assert got[k]["error"] == error
            elif k == "upload":
                assert got[k]["error"] == "not run: the wandb export failed"
            else:
                assert "pip install 'kforge[ingest]'" in got[k]["error"]


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

    run = make_run(tmp_path / "run", monkeypatch, world=1)
    monkeypatch.setattr(exporters, "choose_exporters",
                        lambda **kw: [_Fake("wandb", None, True), _Fake("upload", "wandb", False)])
    r = runner().invoke(main, [run, "-q", "--upload"])
    assert r.exit_code == 3
    assert r.stdout == "" and run in r.stderr and "upload" in r.stderr and "no network" in r.stderr
