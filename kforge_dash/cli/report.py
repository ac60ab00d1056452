"""`kforge-report PATH... -o report.html [--runs NAME ...]`: a thin click wrapper over browse/report.py."""

from __future__ import annotations

import sys

try:
    import click
except ImportError as e:  # optional dependency, imported at the edge
    raise SystemExit("kforge-report needs the dash extra: pip install 'kforge[dash]'") from e


from kforge_dash.cli.options import version_option  # noqa: E402


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="The HTML file to write.")
@click.option("--runs", "runs", multiple=True, metavar="NAME", help="Only these runs (repeat the option); default: all.")
@click.option("--metrics", "metrics", multiple=True, metavar="NAME", help="Charts to draw (repeat); default: the dashboard's.")
@click.option("--smoothing", type=click.FloatRange(0, 1, max_open=True), default=0.0, show_default=True,
              help="EMA weight per step (as the dashboard's slider); 0 draws the recorded values only.")
@click.option("--title", default="kforge report", show_default=True)
@version_option("kforge-report")
def main(paths, output, runs, metrics, smoothing, title) -> None:
    """One self-contained HTML report of the ingested runs under PATH (a runs root or a run directory).

    Exit status: 0 written, 1 nothing to report, 2 usage error (e.g. an output path that cannot be
    written). A missing output folder is created.
    """
    from kforge_dash.browse.report import ReportOptions, write_report

    options = ReportOptions(metrics=tuple(metrics) or None, smoothing=smoothing, title=title)
    try:
        unknown = _unknown_metrics(list(paths), list(runs) or None, list(metrics))
        if unknown:  # nothing written: a report without a chart asked for would pass for a complete one
            click.echo(f"kforge-report: error: {unknown}", err=True)
            sys.exit(2)
        report = write_report(list(paths), output, runs=list(runs) or None, options=options)
    except ValueError as e:
        click.echo(f"kforge-report: error: {e}", err=True)
        sys.exit(1)
    except OSError as e:  # the -o path: one line naming it, no traceback
        reason = e.strerror if e.filename is None and e.strerror else str(e)
        click.echo(f"kforge-report: error: -o {output}: cannot write it: {reason}", err=True)
        sys.exit(2)
    from kforge_dash.text import counted

    for note in report.notes:
        click.echo(f"kforge-report: {note}", err=True)
    size = len(report.html.encode("utf-8"))
    click.echo(f"kforge-report: {output}: {counted(len(report.runs), 'run')}, {counted(len(report.metrics), 'chart')}, "
               f"{size / 1e6:.1f} MB", err=True)


def _unknown_metrics(paths: list[str], runs: list[str] | None, metrics: list[str]) -> str | None:
    """One line naming each --metrics name that no chosen run has, with the nearest known names; None when
    every name is known (or when there is no run to check: write_report says what is wrong then).
    One unknown name among known ones is an error too: its chart would be missing from the report."""
    import difflib

    from kforge_dash.browse import series
    from kforge_dash.browse.report import find_runs

    chosen = find_runs(paths, runs).runs if metrics else []
    if not chosen:
        return None
    have = series.available_metrics([series.steps_schema(r.source().steps_path) for r in chosen])
    unknown = [m for m in dict.fromkeys(metrics) if m not in have]
    if not unknown:
        return None
    parts, guessed = [], True
    for m in unknown:
        listed = [x.strip() for x in m.split(",")]
        if len(listed) > 1 and all(x in have for x in listed):  # "loss,tokens_per_sec": one name per option
            parts.append(f"{m!r} (one name per option: {' '.join('--metrics ' + x for x in listed)})")
            continue
        near = difflib.get_close_matches(m, have, n=3)
        guessed &= bool(near)
        parts.append(repr(m) + (f" (did you mean {', '.join(map(repr, near))}?)" if near else ""))
    known = "" if guessed else f" (known: {', '.join(have[:8])}{f', ... ({len(have)} in all)' if len(have) > 8 else ''})"
    return f"--metrics {'; '.join(parts)}: no such metric in the runs reported{known}"


if __name__ == "__main__":
    main()
