"""kforge-report's -o path: a missing folder is made; a path that cannot be written is a
usage error on one line naming it, never a traceback."""

from click.testing import CliRunner
from dash_fixtures import write_run

from kforge_dash.cli.report import main


def test_a_missing_output_folder_is_created(tmp_path):
    write_run(tmp_path / "runs", "a", n=30)
    out = tmp_path / "MISSING" / "deeper" / "r.html"
    r = CliRunner().invoke(main, [str(tmp_path / "runs"), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert out.is_file() and out.read_text().startswith("<!DOCTYPE html>")
    assert not [p for p in out.parent.iterdir() if p.name != "r.html"]  # no temp file left


def test_an_output_path_that_cannot_be_written_is_a_usage_error_naming_it(tmp_path):
    write_run(tmp_path / "runs", "a", n=30)
    (tmp_path / "afile").write_text("not a folder")
    bad = tmp_path / "afile" / "deeper" / "r.html"
    r = CliRunner().invoke(main, [str(tmp_path / "runs"), "-o", str(bad)])
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit), r.output
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert len(lines) == 1 and str(bad) in lines[0] and "Traceback" not in r.output, r.output


def test_the_default_charts_skip_a_metric_no_run_has(sample_runs_copy, tmp_path):
    """CPU runs have memory columns that are null throughout: no chart for them and no note saying so
    for every run (the report used to open with 'no mem_peak_bytes in' all seven runs)."""
    import polars as pl

    from kforge_dash.browse.report import write_report

    steps = pl.read_parquet(sample_runs_copy / "straggler" / "ingested" / "steps.parquet")
    assert "mem_peak_bytes" in steps.columns and steps["mem_peak_bytes"].null_count() == len(steps)
    report = write_report([sample_runs_copy], tmp_path / "r.html")
    assert "mem_peak_bytes" not in report.metrics and not [n for n in report.notes if "mem_peak_bytes" in n]
    assert {"loss", "grad_norm", "lr"} <= set(report.metrics)


def test_an_unknown_metric_is_a_usage_error_with_the_nearest_names_and_writes_nothing(tmp_path):
    """`--metrics nosuch` wrote a report with 0 charts and exited 0."""
    write_run(tmp_path / "runs", "a", n=30)
    out = tmp_path / "r.html"
    r = CliRunner().invoke(main, [str(tmp_path / "runs"), "-o", str(out), "--metrics", "nosuch"])
    assert r.exit_code == 2 and not out.exists(), r.output
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("kforge-report: error: --metrics 'nosuch': no such metric")
    assert "(known: loss, " in lines[0]
    # a typo among known names: an error too, naming only the typo, with the nearest known name
    r = CliRunner().invoke(main, [str(tmp_path / "runs"), "-o", str(out), "--metrics", "loss", "--metrics", "grad_nrom"])
    assert r.exit_code == 2 and not out.exists(), r.output
    assert r.output.strip() == ("kforge-report: error: --metrics 'grad_nrom' (did you mean 'grad_norm'?): "
                                "no such metric in the runs reported")
    # known names joined by a comma: said to take one name per option (not "did you mean" the same names)
    r = CliRunner().invoke(main, [str(tmp_path / "runs"), "-o", str(out), "--metrics", "loss,grad_norm"])
    assert r.exit_code == 2 and not out.exists(), r.output
    assert r.output.strip() == ("kforge-report: error: --metrics 'loss,grad_norm' (one name per option: --metrics loss "
                                "--metrics grad_norm): no such metric in the runs reported")
    r = CliRunner().invoke(main, [str(tmp_path / "runs"), "-o", str(out), "--metrics", "loss", "--metrics", "grad_norm"])
    assert r.exit_code == 0 and out.is_file() and "2 charts" in r.output, r.output
