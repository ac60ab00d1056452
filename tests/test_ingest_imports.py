"""What an ingest imports: not the recorder (only the on-disk contract's helpers of kforge_record),
not pandas; the schema alone needs neither pyarrow nor numpy."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python(code: str, **env) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OPENBLAS_")}
    out = subprocess.run([sys.executable, "-c", code], env=dict(clean, PYTHONPATH=ROOT, **env), cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_ingest_does_not_import_the_recorder():
    got = _python("import sys\nfrom kforge_dash.ingest.run import ingest_run\n"
                  "print(sorted(m for m in sys.modules if m.startswith('kforge_record.')))")
    # The on-disk contract's helpers only: heartbeat.bin's reader, whether a writer is gone
    # (leftovers, env: a killed launch's lost steps are told only once its processes are gone), the checks
    # every option shares with the Recorder's keywords (checks), and the one gate every reader opens
    # files through (regular_file: a FIFO is never opened).
    assert got == ("['kforge_record.atomic', 'kforge_record.checks', 'kforge_record.env', 'kforge_record.heartbeat', "
                   "'kforge_record.leftovers', 'kforge_record.model', 'kforge_record.regular_file', "
                   "'kforge_record.schema', 'kforge_record.version']")
    assert "kforge_record.recorder" not in got and "kforge_record.writer" not in got
    # The schema alone (what kforge_dash.contract reads) needs neither pyarrow nor numpy.
    assert _python("import sys, kforge_record.schema\nprint('pyarrow' in sys.modules, 'numpy' in sys.modules)") == "False False"
    assert _python("import kforge_record\nfrom kforge_record import ModelSpec, Recorder\nimport kforge_record.recorder as r\n"
                   "print(Recorder is r.Recorder is kforge_record.Recorder, ModelSpec.__name__)") == "True ModelSpec"


def test_an_ingest_does_not_import_pandas(tmp_path):
    """pyarrow's pa.array and pq.read_table import pandas (~0.2 s of every ingest's start)."""
    import shutil
    import subprocess
    import sys

    import pandas  # noqa: F401 (installed here, so the check below can fail)

    run = tmp_path / "preempted"  # two launches; parts that mix log and end_step rows
    shutil.copytree("sample_runs/preempted", run, ignore=shutil.ignore_patterns("ingested"))
    code = ("import sys, warnings; warnings.simplefilter('ignore')\nfrom kforge_dash.ingest.run import ingest_run\n"
            "from kforge_dash.ingest.options import IngestOptions\n"
            f"ingest_run({str(run)!r})\ningest_run({str(run)!r}, IngestOptions(force=True))\nprint('pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False"]
