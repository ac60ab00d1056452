"""One definition and validation of each option (issue 30 point 3): the CLI's click options are made
from the specs that IngestOptions, FindingsOptions, DaskOptions (and the Recorder, where they overlap)
validate with, so the same bad value gets the same one-line error everywhere; a bool is not a number."""

import dataclasses
import re
from pathlib import Path

import pytest
from parts_fixtures import runner

from kforge_dash.cli.ingest import main
from kforge_dash.findings.thresholds import FINDINGS_SPECS, FindingsOptions
from kforge_dash.ingest.options import INGEST_SPECS, IngestOptions

ROOT = Path(__file__).resolve().parent.parent
SPECS = {**INGEST_SPECS, **FINDINGS_SPECS}


def python_error(name: str, value) -> str:
    kw = {name: value} if name in INGEST_SPECS else {"findings": {name: value}}
    with pytest.raises((ValueError, TypeError)) as e:
        IngestOptions(**kw)
    return str(e.value)


def cli_error(tmp_path, flag: str, text: str) -> str:
    r = runner().invoke(main, [str(tmp_path), flag, text])
    assert r.exit_code == 2, r.output
    (line,) = [x for x in r.stderr.splitlines() if x.startswith("Error:")]
    return line.split(f"Invalid value for '{flag}': ", 1)[1]


def test_every_findings_threshold_has_one_spec_and_one_cli_option():
    assert [f.name for f in dataclasses.fields(FindingsOptions)] == list(FINDINGS_SPECS)
    flags = {o for p in main.params for o in p.opts}
    for name, spec in SPECS.items():
        assert spec.flag(name) in flags, name
        param = next(p for p in main.params if spec.flag(name) in p.opts)
        assert param.help.startswith(spec.help) and param.default is None  # not given: the kept value, else the default
    helps = {p.name: getattr(p, "help", None) for p in main.params}
    for k, v in dataclasses.asdict(FindingsOptions()).items():
        shown = ",".join(v) if isinstance(v, tuple) else f"{v:g}" if isinstance(v, float) else str(v)
        assert helps[k].endswith(f"[default: {shown}]"), k


# one bad text per kind of value; a bool (True) is refused by every numeric option in Python
# (any text is a list of globs, '' none: the glob options have no bad text, only bad Python values)
BAD = {"alpha": "1.5", "peak_tflops": "0", "flops_per_token": "-1", "spike_window": "1", "straggler_min_steps": "1.5",
       "spike_k": "nan"}
GLOBS = [n for n, s in SPECS.items() if s.metavar == "GLOBS"]


@pytest.mark.parametrize("name", [n for n in SPECS if n not in GLOBS])
def test_the_same_bad_value_gets_the_same_error_from_python_and_the_cli(tmp_path, name):
    spec = SPECS[name]
    text = BAD.get(name, "0")
    got_cli = cli_error(tmp_path, spec.flag(name), text)
    assert got_cli == python_error(name, spec.parse(text))
    assert got_cli.startswith(f"{name}: must be ")
    assert python_error(name, True).endswith("got True")  # bool is not a number


@pytest.mark.parametrize("name", GLOBS)
def test_glob_options_refuse_a_string_or_an_empty_pattern(name):
    assert python_error(name, "data*") == f"{name}: must be a tuple of non-empty glob patterns, got 'data*'"
    assert python_error(name, ("data*", "")).startswith(f"{name}: must be a tuple of non-empty glob patterns")
    assert SPECS[name].parse(" data* ,, *loader*") == ("data*", "*loader*") and SPECS[name].parse("") == ()


def test_ingest_options_refuse_bools_like_the_recorder():
    from kforge_record import Recorder

    for kw in (dict(alpha=True), dict(peak_tflops=True), dict(chunk_rows=True), dict(lock_timeout_s=True)):
        with pytest.raises(ValueError, match=rf"^{next(iter(kw))}: must be .*, got True$"):
            IngestOptions(**kw)
    with pytest.raises(ValueError) as rec:
        Recorder("/nonexistent/run", rank=0, world_size=1, peak_tflops=True, install_sigterm_handler=False)
    assert str(rec.value) == python_error("peak_tflops", True)


def test_dask_connect_timeout_is_checked_as_the_cli_checks_it(tmp_path):
    from kforge_dash.cluster import DaskOptions

    with pytest.raises(ValueError) as e:
        DaskOptions(address="local:1", connect_timeout_s=0.0)
    assert cli_error(tmp_path, "--dask-connect-timeout", "0") == str(e.value)
    with pytest.raises(ValueError, match="got True"):
        DaskOptions(address="local:1", connect_timeout_s=True)


def test_one_place_takes_the_runs_ingest_lock():
    """The run's ingest lock is taken by kforge_dash/ingest/lock.py only (ingest, the pipeline's export and
    export_run call it); the other file lock is the on-finding watchers' own, on another file."""
    from kforge_dash.cli import on_finding
    from kforge_dash.contract import LOCK_FILE

    users = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "kforge_dash").rglob("*.py") if "FileLock(" in p.read_text())
    assert users == ["kforge_dash/cli/on_finding.py", "kforge_dash/ingest/lock.py"]
    assert on_finding.LOCK_FILE != LOCK_FILE
    named = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "kforge_dash").rglob("*.py")
                   if re.search(r"import[^\n]*\bLOCK_FILE\b|\n    LOCK_FILE,", p.read_text()))
    assert named == ["kforge_dash/ingest/lock.py"]


def test_every_kforge_command_says_its_version():
    from kforge_dash.cli import dash, report
    from kforge_record.version import __version__

    for cmd, prog in ((main, "kforge-ingest"), (dash.main, "kforge-dash"), (report.main, "kforge-report")):
        r = runner().invoke(cmd, ["--version"])
        assert r.exit_code == 0 and r.stdout.strip() == f"{prog} {__version__}", (prog, r.output)


def test_ingest_options_given_as_a_mapping_travel_to_dask_workers():
    """IngestOptions is pickled to a Dask worker (cluster._whole_run): thresholds given as a mapping too."""
    import pickle

    o = IngestOptions(peak_tflops=312, findings={"wait_phases": ("fwd*",)}, reset_options=True)
    back = pickle.loads(pickle.dumps(o))
    assert back == o and back.given() == {"peak_tflops": 312.0, "findings": {"wait_phases": ["fwd*"]}}
    assert IngestOptions(findings=FindingsOptions(spike_k=8.0)).given()["findings"]["spike_k"] == 8.0  # a whole set: all given
