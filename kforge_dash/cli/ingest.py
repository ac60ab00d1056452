"""`kforge-ingest PATH...`: a thin click wrapper over kforge_dash.pipeline (ingest, export, --watch)."""

from __future__ import annotations

import json
import os
import sys

# Ingest makes no BLAS call, but OpenBLAS (numpy's) starts a thread per core at import that spins
# waiting for work: ~0.1 CPU-s of an ingest's 4 on 2 cores. Before numpy is imported; a value the
# user set wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from kforge_dash.optional import MissingDependency, require

try:
    click = require("click", extra="ingest", purpose="kforge-ingest")
except MissingDependency as e:  # at the edge: a message, not a traceback
    raise SystemExit(str(e)) from e

from kforge_dash.cli.options import SpecType, spec_options, version_option  # noqa: E402
from kforge_dash.findings.thresholds import FINDINGS_SPECS, FindingsOptions  # noqa: E402  (dataclasses only)
from kforge_dash.ingest.option_spec import CONNECT_TIMEOUT  # noqa: E402
from kforge_dash.ingest.options import DEFAULT_ALPHA, INGEST_SPECS  # noqa: E402

_F = FindingsOptions()  # the defaults the options show


def _how(res) -> str:
    return "  [unchanged]" if res.skipped else "  [new parts appended]" if res.appended else ""


def _screen(res) -> list[str]:
    """The one-screen summary of one ingested run: its RunView (kforge_dash/run_view.py), as the pages and
    the report show it; labels from the column registry."""
    from kforge_dash import text
    from kforge_dash.run_view import run_view

    s = res.summary
    v = run_view(s)
    achieved = "" if v.values["mfu_waterfall.parts.achieved"] is None else \
        f"; {v.labelled('mfu_waterfall.parts.achieved')} over the job wall clock"
    recorded = "" if v.values["ranks"] == v.values["world_size"] else f" ({v.labelled('ranks')})"
    lines = [
        f"{s.get('run_name')}  ({res.run_dir}){_how(res)}",
        f"  {v.labelled('steps')} ({text.span(s.get('first_step'), s.get('last_step'))})   "
        f"{v.labelled('world_size')}{recorded}   {v.labelled('attempts')}   {v.labelled('restarts')}",
        f"  {v.labelled('tokens')}   {v.labelled('mean_tokens_per_sec')}",
        f"  {v.wall_times} (incl. downtime and startup)",
        f"  {v.labelled('mean_mfu')} (over the training time{achieved})",
        f"  {v.labelled('final_loss')} (mean over ranks)   {v.labelled('best_loss')}",
        f"  MFU inputs: {v.mfu_inputs}",
    ]
    if res.options is not None:
        lines.append(_options_line(res.options))
    if res.driver is not None:
        lines += _driver_lines(res.driver)
    lines += _findings_lines(s, v)
    nonfinite = {k: n for k, n in (s.get("nonfinite") or {}).items() if n}
    if nonfinite:
        lines.append("  non-finite: " + ", ".join(f"{k} {text.count(n)}" for k, n in nonfinite.items()))
    for name, e in (s.get("exports") or {}).items():
        if isinstance(e, dict):
            done = "ok " + str(e.get("path") or "") if e.get("ok") else "FAILED: " + str(e.get("error"))
            lines.append(f"  export {name}: {done}")
    warnings = s.get("warnings") or []
    if warnings:
        lines.append(f"  warnings ({len(warnings)}):")
        lines += [f"    - {w}" for w in warnings[:8]]
        if len(warnings) > 8:
            lines.append(f"    ... and {len(warnings) - 8} more in {res.ingested_dir}/summary.json")
    return lines


def _driver_lines(d) -> list[str]:
    """--dask, window by window: what this process received from the workers (ingest/shipped.py)."""
    from kforge_dash import text

    parts = [f"{text.size(d.rows)} rows for ranks.parquet", f"{text.size(d.steps)} per-step rows",
             f"{text.size(d.periods)} step-end periods", f"{text.size(d.other)} other"]
    per_row = None if not d.n_rows else 1e6 * d.worker_cpu_s / d.n_rows
    return [f"  dask: driver received {text.size(d.received)} from {text.counted(d.windows, 'window')} "
            f"({text.percent(d.fraction)} of the rows' {text.size(d.rows_arrow)}): {', '.join(parts)}",
            f"        workers {text.fixed(per_row, 2)} CPU-µs a row; driver {text.duration(d.driver_s / d.windows)} "
            f"a window on the results (receiving not counted)"]


def _options_line(decided) -> str:
    """Which options this ingest used that are not the defaults, and where each came from (given now,
    kept from an earlier ingest: RUN/ingested/options.json)."""
    from kforge_dash.ingest.options import DEFAULT

    shown = []
    for name, source in decided.sources.items():
        if source == DEFAULT:
            continue
        value = getattr(decided.findings, name.split(".", 1)[1]) if name.startswith("findings.") else getattr(decided, name)
        flag = "--" + name.rsplit(".", 1)[-1].replace("_", "-")
        shown.append(f"{flag} {','.join(value) if isinstance(value, tuple) else f'{value:g}'} ({source})")
    return "  options: " + ("; ".join(shown) + "; the others default" if shown else "all default")


def _findings_lines(s: dict, view) -> list[str]:
    """Goodput fraction and buckets, then the findings, most severe first."""
    from kforge_dash import text

    lines = []
    g = s.get("goodput")
    if isinstance(g, dict) and g.get("fraction") is not None:
        big = sorted(((v, k) for k, v in (g.get("buckets") or {}).items() if text.known(v) and v), reverse=True)[:4]
        lost = ", ".join(f"{k.replace('_', ' ')} {text.duration(v)}" for v, k in big)
        lines.append(f"  goodput {text.percent(g['fraction'])} ({text.duration(g.get('productive_s'))} of "
                     f"{text.duration(g.get('total_s'))} productive{'; lost: ' + lost if lost else ''}; "
                     f"{text.counted(g.get('wasted_steps') or 0, 'step')} recomputed)")
    if view.what_if:  # None when there is nothing to say (no straggler finding, no material saving)
        lines.append(f"  what-if: {view.what_if}")
    from kforge_dash.run_view import findings_of

    findings = findings_of(s)
    lines.append(f"  findings ({len(findings)}):" if findings else "  findings: none")
    for f, card in zip(findings[:10], view.cards):  # the run page's card: kind, then steps, ranks, hosts, phase
        lines.append(f"    [{card.severity}] {card.kind}{' · ' + card.facts if card.facts else ''}: {f.get('message')}")
        if f.get("cause"):  # a straggler's hardware cause (hw_throttle during its steps)
            lines.append(f"      cause: {f['cause']}")
        if f.get("kind") == "hang":  # where each group of ranks stands, their lines, the collective
            from kforge_dash.browse.hang import hang_lines

            lines += [f"      {line}" for line in hang_lines(f)]
    if len(findings) > 10:
        lines.append(f"    ... and {len(findings) - 10} more in summary.json")
    return lines


def _report(result, *, as_json: bool, quiet: bool, only_changed: bool = False, json_lines: bool = False) -> None:
    """Print one pass: a screen per run (or JSON on stdout), errors on stderr."""
    from kforge_dash.findings.host_table import host_lines, host_table
    from kforge_dash.pipeline import NO_RUNS_YET, failed_exports

    shown = [r for r in result.ok if not (only_changed and r.skipped)]
    hosts = host_table(r.summary for r in result.ok)  # unchanged runs too: from their summary.json
    waiting = [] if only_changed else result.waiting  # --watch: said once, not on every poll
    if as_json:
        click.echo(json.dumps({
            "runs": [{"run_dir": r.run_dir, "skipped": r.skipped, "appended": r.appended, "summary": r.summary,
                      "options": None if r.options is None else r.options.to_dict(),
                      "driver": None if r.driver is None else r.driver.to_dict()} for r in shown],
            "failed": [{"run_dir": f.run_dir, "error": f.error} for f in result.failed]
            + [{"run_dir": None, "error": e} for e in result.errors],
            "waiting": [{"run_dir": w.run_dir, "reason": w.reason} for w in result.waiting],
            "hosts": hosts,
        }, indent=None if json_lines else 2, default=str))  # --watch: one JSON document per line and pass
    elif not quiet:
        for r in shown:
            click.echo("\n".join(_screen(r)))
        for w in waiting:  # not an error: a job before its first flush
            click.echo(f"{w.run_dir}  [waiting: {'no part file yet' if w.reason != NO_RUNS_YET else w.reason}]")
        if len(result.ok) > 1 and shown:  # across runs: which hosts keep doing it
            click.echo("\n".join(host_lines(hosts)))
    for msg in [f.error for f in result.failed] + result.errors + failed_exports(shown):  # even with --quiet
        click.echo(f"kforge-ingest: error: {msg}", err=True)


def _note_stale_tensorboard(result) -> None:
    """--no-tensorboard leaves an earlier export's event file in place: say so (on stderr) where it is
    really older than the run's ingested outputs (re-ingested since); a run skipped as unchanged, whose
    event file was written after its outputs, gets no note. Not called under --quiet."""
    from kforge_dash.contract import STEPS_FILE
    from kforge_dash.export.tensorboard import kforge_event_files, stale_export

    for r in result.ok:
        events = kforge_event_files(r.run_dir)
        try:
            # steps.parquet, not summary.json: the summary is rewritten after every export to record it
            older = bool(events) and os.path.getmtime(events[-1]) < os.path.getmtime(os.path.join(r.ingested_dir,
                                                                                                  STEPS_FILE))
        except OSError:  # gone meanwhile: nothing to say
            older = False
        note = stale_export(r.run_dir) if older else None
        if note:
            click.echo(f"kforge-ingest: note: {note}", err=True)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@spec_options(INGEST_SPECS, {"alpha": DEFAULT_ALPHA})
@click.option("--reset-options", is_flag=True,
              help="Forget the options kept with each run by earlier ingests (the ones given now are kept).")
@click.option("--watch", type=click.FloatRange(0, min_open=True), default=None, metavar="SECONDS",
              help="Re-ingest every SECONDS as new part files arrive (appending them), until Ctrl-C; "
                   "the W&B export of changed runs waits until then.")
@click.option("--force", is_flag=True, help="Re-ingest even when the shards are unchanged.")
@click.option("--no-tensorboard", is_flag=True, help="Do not export TensorBoard event files.")
@click.option("--no-wandb", is_flag=True, help="Do not export an offline W&B run.")
@click.option("--upload", is_flag=True, help="Also sync the W&B run (needs network and a login).")
@click.option("--wandb-project", default=None, help="W&B project name.")
@click.option("--wandb-entity", default=None, help="W&B entity (user or team).")
@spec_options(FINDINGS_SPECS, _F.to_dict())
@click.option("--dask", "dask_address", default=None, metavar="ADDRESS",
              help="Ingest on a Dask cluster: a scheduler address (tcp://HOST:8786), a scheduler file (PATH.json), "
                   "or local:N (N local worker processes, started and stopped here). Needs 'kforge[dask]'.")
@click.option("--dask-connect-timeout", "dask_connect_timeout", type=SpecType("connect_timeout_s", CONNECT_TIMEOUT),
              default=10.0, show_default=True, metavar="SECONDS", help=CONNECT_TIMEOUT.help)
@click.option("--on-finding", default=None, metavar="CMD",
              help="Run the shell command CMD once per new finding (with --watch: as they appear): the finding as JSON "
                   "on stdin, KFORGE_FINDING_KIND, KFORGE_FINDING_SEVERITY, KFORGE_RUN_DIR, KFORGE_RUN_NAME set. Never twice "
                   "for one finding (RUN/ingested/on_finding.json); a failure is reported and the watch goes on.")
@click.option("--on-finding-timeout", type=click.FloatRange(0, min_open=True), default=60.0, show_default=True,
              metavar="SECONDS", help="Kill an --on-finding command (and its children) after SECONDS.")
@click.option("--quiet", "-q", is_flag=True, help="Only errors.")
@click.option("--json", "as_json", is_flag=True,
              help="Print a machine-readable summary on stdout (with --watch: one JSON line per pass).")
@version_option("kforge-ingest")
def main(paths, *, watch, force, no_tensorboard, no_wandb, upload, wandb_project, wandb_entity, dask_address,
         dask_connect_timeout, on_finding, on_finding_timeout, quiet, as_json, reset_options, alpha, peak_tflops,
         flops_per_token, **thresholds):
    """Ingest kforge runs: PATH is a runs root (every run below it) or one run directory.

    The options that decide the outputs (--alpha, --peak-tflops, --flops-per-token and the findings
    thresholds) are kept with each run once given (RUN/ingested/options.json) and used by every later
    ingest of it, until given again or dropped with --reset-options; the screen says where each came from.

    Exit status: 0 all ingested (a run with no part file yet is waiting, not failed), 1 nothing could be
    ingested, 2 usage error (a PATH that does not exist too), 3 some runs or an --upload failed,
    130 interrupted (Ctrl-C: the runs finished are listed).
    """
    import warnings

    from kforge_dash.cli.on_finding import OnFinding, after_pass
    from kforge_dash.export.exporters import choose_exporters
    from kforge_dash.ingest.options import IngestOptions, IngestWarning
    from kforge_dash.pipeline import IngestInterrupted, ingest_paths
    from kforge_dash.pipeline import watch as watch_paths
    from kforge_dash.progress import progress_for

    _check_paths(paths)
    try:
        hook = None if on_finding is None else OnFinding(on_finding, on_finding_timeout)
    except ValueError as e:
        raise click.UsageError(str(e)) from None

    options = IngestOptions(alpha=alpha, peak_tflops=peak_tflops, flops_per_token=flops_per_token, force=force,
                            reset_options=reset_options,
                            findings={k: v for k, v in thresholds.items() if v is not None})  # those given now
    exporters = choose_exporters(tensorboard=not no_tensorboard, wandb=not no_wandb, upload=upload,
                                 wandb_project=wandb_project, wandb_entity=wandb_entity)
    if dask_address is not None and hook is not None:
        raise click.UsageError("--on-finding runs with a local ingest, not with --dask")
    if dask_address is not None:
        if watch is not None:
            raise click.UsageError("--dask and --watch: a watch pass appends a few new part files, which one "
                                   "machine does faster; run --watch without --dask")
        try:
            code = _on_dask(paths, dask_address, dask_connect_timeout, options=options, exporters=exporters,
                            quiet=quiet, as_json=as_json)
        except KeyboardInterrupt:
            code = _interrupted()
        sys.exit(code)
    try:
        with warnings.catch_warnings(), progress_for(quiet=quiet or as_json) as progress:
            warnings.simplefilter("ignore", IngestWarning)  # they are in each run's summary, printed below
            try:
                first = ingest_paths(paths, options=options, exporters=exporters, progress=progress,
                                     wait_for_runs=watch is not None)
            except IngestInterrupted as e:  # Ctrl-C: what finished, where it stopped; 130 as a shell's SIGINT
                _report(e.done, as_json=as_json, quiet=quiet)
                click.echo("\n".join(_interrupted_lines(e)), err=True)
                sys.exit(130)

            def report(r, **kw) -> None:
                _report(r, as_json=as_json, quiet=quiet, **kw)
                if hook is not None:
                    after_pass(hook, r, lambda msg: click.echo(f"kforge-ingest: on-finding: {msg}", err=True))

            report(first, json_lines=watch is not None)
            if no_tensorboard and not quiet:  # -q: only errors
                _note_stale_tensorboard(first)
            if watch is None:
                sys.exit(first.exit_code)
            if any(x.name in ("wandb", "upload") for x in exporters) and not (quiet or as_json):
                click.echo(f"watching every {watch:g}s; the W&B export of changed runs waits until Ctrl-C", err=True)
            sys.exit(watch_paths(paths, interval_s=watch, options=options, exporters=exporters, progress=progress,
                                 report=lambda r: report(r, only_changed=True, json_lines=True)))
    except KeyboardInterrupt:  # outside a run's ingest (printing, an --on-finding command): nothing half-done
        sys.exit(_interrupted())


def _interrupted() -> int:
    click.echo("kforge-ingest: interrupted (Ctrl-C)", err=True)
    return 130


def _check_paths(paths) -> None:
    """A PATH that does not exist is a usage error (exit 2), named, with the nearest names beside it."""
    import difflib

    for p in paths:
        if os.path.exists(p):
            continue
        parent = os.path.dirname(os.path.abspath(p))
        try:
            near = difflib.get_close_matches(os.path.basename(os.path.normpath(p)), os.listdir(parent), n=3)
        except OSError:
            near = []
        hint = f" (did you mean {', '.join(repr(os.path.join(os.path.dirname(p), n)) for n in near)}?)" if near else ""
        raise click.UsageError(f"{p!r}: no such file or directory{hint}")


def _interrupted_lines(e) -> list[str]:
    """What a Ctrl-C during a pass leaves: the runs finished, the one it stopped in, those not started."""
    done = [r.run_dir for r in e.done.ok] + [f.run_dir for f in e.done.failed] + [w.run_dir for w in e.done.waiting]
    lines = [f"kforge-ingest: interrupted (Ctrl-C) while ingesting {e.stopped_in}: its outputs from before, "
             "if any, stand (every output is replaced whole or not at all)",
             f"  finished ({len(done)}): " + (", ".join(os.path.basename(d) for d in done) or "none")]
    if e.not_started or e.paths_left:
        lines.append(f"  not started ({len(e.not_started)}): " + (", ".join(os.path.basename(d) for d in e.not_started)
                                                                  or "-")
                     + (f"; paths not reached: {', '.join(e.paths_left)}" if e.paths_left else ""))
    return lines


def _on_dask(paths, address, connect_timeout, *, options, exporters, quiet, as_json) -> int:
    """One pass on a Dask cluster (kforge_dash.cluster); the exit status."""
    import warnings

    from kforge_dash.ingest.options import IngestWarning
    from kforge_dash.optional import MissingDependency
    from kforge_dash.progress import progress_for

    try:
        from kforge_dash.cluster import ClusterError, DaskOptions, dask_client, ingest_paths_dask

        opts = DaskOptions(address=address, connect_timeout_s=connect_timeout)
    except (MissingDependency, ValueError) as e:
        raise click.UsageError(f"--dask: {e}") from None
    try:
        with dask_client(opts) as client, warnings.catch_warnings(), progress_for(quiet=quiet or as_json) as progress:
            warnings.simplefilter("ignore", IngestWarning)
            result = ingest_paths_dask(paths, options=options, exporters=exporters, client=client, opts=opts,
                                       progress=progress)
    except (ClusterError, MissingDependency) as e:
        click.echo(f"kforge-ingest: error: {e}", err=True)
        return 1
    _report(result, as_json=as_json, quiet=quiet)
    return result.exit_code


if __name__ == "__main__":  # python -m kforge_dash.cli.ingest, as the benchmarks run it
    main()
