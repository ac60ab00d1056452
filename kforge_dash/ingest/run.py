"""Ingest one run: merge ranks and restarts, derive throughput/MFU/EMA, write RUN/ingested/.

``ingest_run`` reads top to bottom: unchanged? -> plan -> rows -> derive -> write -> summarise.
The plan is made from metadata only (meta.json, end.json, Parquet footers: step ranges, which
files hold Recorder.log rows; plan.py); the rows are then read in step windows (rows.py, one
window = window.ingest_window), so memory is bounded by the window however long the run is.
Outputs go to temp names and are renamed at the end, so a failed ingest never damages the last
good one. See docs/CONTRACT.md for the columns, the summary keys and the rules.
"""

from __future__ import annotations

import os
import warnings as _warnings
from dataclasses import replace

from kforge_dash.contract import (
    EMA_METRICS,
    INGESTED_DIR,
    RANKS_FILE,
    STEP_HEAD,
    STEPS_FILE,
    SUMMARY_FILE,
    read_summary_file,
)
from kforge_dash.optional import require
from kforge_record.atomic import atomic_path, write_json_atomic

pl = require("polars", extra="ingest", purpose="kforge-ingest")

from kforge_dash.findings import analyse_run  # noqa: E402  (after the polars check)
from kforge_dash.findings.hang_evidence import watchdog_dump_stats  # noqa: E402
from kforge_dash.ingest.inputs import shards as _shards  # noqa: E402
from kforge_dash.ingest.inputs.launches import launch_flops, world_size_of  # noqa: E402
from kforge_dash.ingest.inputs.manifest import output_stat, save_manifest  # noqa: E402
from kforge_dash.ingest.inputs.plan import IngestInputs, IngestPlan, make_plan  # noqa: E402
from kforge_dash.ingest.inputs.read import plan_windows, read_window  # noqa: E402  (public here too: see __all__)
from kforge_dash.ingest.kept import decide, read_kept, save_kept  # noqa: E402
from kforge_dash.ingest.lineage.restarts import killed_since  # noqa: E402
from kforge_dash.ingest.lineage.rollbacks import (  # noqa: E402
    Lineage,
    apply_fix,
    find_rollbacks,
    holds_tails,
    warn_duplicates,
    write_superseded,
)
from kforge_dash.ingest.lock import LockBusy, run_lock  # noqa: E402
from kforge_dash.ingest.options import (  # noqa: E402
    DecidedOptions,
    IngestError,
    IngestNotReady,
    IngestOptions,
    IngestResult,
    IngestWarning,
    PartVanished,
)
from kforge_dash.ingest.rowpass.append import attempts_state  # noqa: E402
from kforge_dash.ingest.rowpass.reduce import ema_expr, reduce_steps  # noqa: E402
from kforge_dash.ingest.rowpass.rows import Rows, discard_ranks, publish_ranks, read_rows  # noqa: E402
from kforge_dash.ingest.rowpass.window import WindowTask, ingest_window  # noqa: E402
from kforge_dash.ingest.summary import SummaryInput, build_summary  # noqa: E402
from kforge_dash.ingest.temps import remove_stale_temps  # noqa: E402
from kforge_dash.progress import NullProgress  # noqa: E402

__all__ = ["ingest_run", "ingest_window", "plan_windows", "read_window", "reduce_steps", "WindowTask"]

# Bump when the outputs' meaning changes: a new version re-ingests unchanged shards.
INGEST_VERSION = "9"  # 9: in-process rollbacks are restarts (restarts[].in_process, why, ranks, wasted_s),
# superseded.parquet, the periods of the steps after a rollback without the superseded steps' time;
# 8: steps.parquet step_time_s the period between step ends (mean over ranks), the ranks' own
# times as step_work_s/_min_s/_median_s; goodput's between_steps bucket; findings cost_s, grad_norm_spike,
# immaterial findings info, what-if over found stragglers;
# hang, desync and replica_divergence findings, hang evidence in the fingerprint;
# summary.json hparams_changed (the hparams a resume changed, per launch);
# summary.json findings_options and phases (what ingest decided); 7: a missing_ranks finding;
# 6: steps.parquet hw/throttle_reasons an int64 OR over ranks (was a float mean)


def ingest_run(run_dir, options: IngestOptions | None = None, *, progress=None, windows=None) -> IngestResult:
    """Ingest one run directory into RUN/ingested/. Raises IngestError when nothing can be ingested.

    ``options``: an IngestOptions, e.g. ``ingest_run(run, IngestOptions(alpha=0.05))``; an option not
    given is the one kept with the run by an earlier ingest, else its default (kept.py); option
    keywords are taken by kforge_dash.pipeline.ingest_path.
    ``progress`` (kforge_dash.progress; silent by default) hears of lock waits and windows done.
    ``windows``: where the step windows run, an object whose ``map(ingest_window, tasks)`` yields
    their WindowRows in order (kforge_dash.cluster.DaskWindows); default: here, one after the other.
    """
    opts = options if options is not None else IngestOptions()
    if not isinstance(opts, IngestOptions):
        raise TypeError(f"ingest_run: options must be an IngestOptions, got {type(opts).__name__}")
    progress = progress if progress is not None else NullProgress()
    run_dir = _checked_run_dir(run_dir)
    out_dir = os.path.join(run_dir, INGESTED_DIR)
    os.makedirs(out_dir, exist_ok=True)
    try:
        with run_lock(out_dir, timeout_s=opts.lock_timeout_s, on_wait=lambda: progress.lock_wait(run_dir)):
            remove_stale_temps(out_dir)  # also when the run turns out unchanged
            result = _ingest_relisting(run_dir, out_dir, opts, progress, windows)
    except LockBusy as e:
        raise IngestError(f"{run_dir}: {e}; try again when it finishes") from None
    for w in result.summary.get("warnings", []) if not result.skipped else []:
        _warnings.warn(w, IngestWarning, stacklevel=2)
    progress.done(run_dir)
    return result


def _checked_run_dir(run_dir) -> str:
    run_dir = os.path.abspath(os.fspath(run_dir))
    if not os.path.isdir(run_dir):
        raise IngestError(f"{run_dir}: {'not a directory' if os.path.exists(run_dir) else 'no such directory'}")
    if not _shards.is_run_dir(run_dir):
        raise IngestError(f"{run_dir}: not a kforge run (no rank-NNNNN/ folders inside)")
    return run_dir


_RELISTS = 5


def _ingest_relisting(run_dir: str, out_dir: str, opts: IngestOptions, progress, windows=None) -> IngestResult:
    """_ingest_locked, again from a fresh listing when a listed part vanished meanwhile (the
    recorder of a running job merged it: kforge_record/compact.py). Nothing is published by the
    pass that met the gap: every output goes to a temp name first."""
    for _ in range(_RELISTS - 1):
        try:
            return _ingest_locked(run_dir, out_dir, opts, progress, windows)
        except PartVanished:
            continue
    try:
        return _ingest_locked(run_dir, out_dir, opts, progress, windows)
    except PartVanished as e:
        raise IngestError(f"{e}; part files kept vanishing during {_RELISTS} listings, try again") from None


def _ingest_locked(run_dir: str, out_dir: str, opts: IngestOptions, progress, windows=None) -> IngestResult:
    warnings: list[str] = []
    kept = read_kept(out_dir, warnings)
    decided = decide(opts, kept)  # given now, else kept with the run, else default
    inputs = _list_inputs(run_dir, out_dir, decided, warnings)
    prev = None if opts.force else _unchanged_summary(inputs)
    if prev is not None:
        save_kept(out_dir, decided, kept)
        return IngestResult(run_dir, prev, True, options=decided)
    plan = make_plan(inputs, warnings, force=opts.force, chunk_rows=opts.chunk_rows)
    mark = len(warnings)
    rows = read_rows(plan, progress, warnings, windows)
    try:  # ranks.parquet stays under its temp name until every output is written (_write_outputs)
        return _ingest_rows(plan, rows, decided, kept, progress, warnings, windows, mark)
    except BaseException:
        discard_ranks(rows.ranks_tmp)
        raise


def _ingest_rows(plan: IngestPlan, rows: Rows, decided: DecidedOptions, kept, progress, warnings: list[str],
                 windows, mark: int) -> IngestResult:
    """What follows the row pass: rollbacks, the derived columns, the outputs and the summary. ``mark``: where
    the row pass's warnings start (a second pass gives them again)."""
    run_dir, out_dir, inputs = plan.run_dir, plan.out_dir, plan.inputs
    lineage = find_rollbacks(plan, rows.repeats, rows.bad)  # steps that went back: in-process restarts
    if holds_tails(rows.ranks_tmp, lineage):  # a rollback's pass stopped below where it went
        # back from: its abandoned rows are on the kept line; read again, without them (rare: one more row pass)
        del warnings[mark:]
        plan = replace(plan, spec=replace(plan.spec, tails=lineage.tails), append=None)
        rows = read_rows(plan, progress, warnings, windows)  # (the same temp name: the first pass's rows gone)
    warnings.extend(lineage.warnings)
    warn_duplicates(lineage.duplicates, warnings)
    flops = {launch.index: launch_flops(launch, warnings, flops_per_token=decided.flops_per_token,
                                        peak_tflops=decided.peak_tflops)
             for launch in plan.launches if launch.parts()}
    steps = _derive(apply_fix(rows.steps, lineage, from_step=rows.periods_from, fresh=rows.wrote), plan.launches, flops,
                    decided.alpha)
    _write_outputs(plan, rows, steps, lineage)
    summary = build_summary(SummaryInput(
        run_dir=run_dir, steps=steps, launches=plan.launches, flops=flops, first_ended=plan.first_ended,
        last_ended=plan.last_ended, ranks=sorted(rows.rank_ids), attempts=plan.attempts, alpha=decided.alpha,
        warnings=warnings, input_digest=inputs.digest, rollbacks=tuple(lineage.restarts)))
    # findings, goodput: read from the outputs just written
    summary.update(analyse_run(out_dir, steps, plan.launches, summary, decided.findings, warnings))
    write_json_atomic(os.path.join(out_dir, SUMMARY_FILE), summary)
    save_kept(out_dir, decided, kept)  # after the outputs: a failed ingest keeps nothing new
    return IngestResult(run_dir, summary, False, appended=rows.appended, options=decided)


def _list_inputs(run_dir: str, out_dir: str, opts: DecidedOptions, warnings: list[str]) -> IngestInputs:
    listing = _shards.list_attempts(run_dir, warnings)
    if not listing:
        raise IngestNotReady(f"{run_dir}: no attempt folders under its rank-NNNNN/ folders (nothing recorded yet)")
    stats = _shards.stat_inputs(listing)
    option_key = {"v": INGEST_VERSION, "alpha": opts.alpha, "peak": opts.peak_tflops, "fpt": opts.flops_per_token,
                  "findings": opts.findings.to_dict()}
    # The folder's name is the run's name (summary.json): a renamed run is summarised again.
    # PyTorch's own flight-recorder dumps (meta.json fr.dump_file + rank) may lie outside the run: in the digest too
    digest = _shards.input_digest(run_dir, stats, {**option_key, "run_name": os.path.basename(run_dir),
                                                   "fr_dumps": watchdog_dump_stats(listing)})
    return IngestInputs(run_dir, out_dir, listing, stats, option_key, digest)


def _unchanged_summary(inputs: IngestInputs) -> dict | None:
    """The last summary when it was made from these very inputs and options and its outputs are there."""
    path = os.path.join(inputs.out_dir, SUMMARY_FILE)
    if not os.path.exists(path):
        return None
    try:
        prev = read_summary_file(path)
    except ValueError:
        return None  # unreadable summary: ingest again
    if prev.get("fingerprint") == inputs.digest and all(
            os.path.exists(os.path.join(inputs.out_dir, n)) for n in (STEPS_FILE, RANKS_FILE)):
        return None if killed_since(prev, inputs.listing) else prev
    return None


def _write_outputs(plan: IngestPlan, rows: Rows, steps: pl.DataFrame, lineage: Lineage) -> None:
    """ranks.parquet (written by the row pass under its temp name), steps.parquet, superseded.parquet,
    then the manifest that describes them."""
    if rows.wrote:
        publish_ranks(rows, plan.out_dir)
        with atomic_path(os.path.join(plan.out_dir, STEPS_FILE)) as steps_tmp:
            steps.write_parquet(steps_tmp, compression="zstd", statistics=True)
    write_superseded(plan.out_dir, lineage)
    plan.cache.mark_bad(rows.bad)
    inputs = plan.inputs
    save_manifest(plan.out_dir, plan.cache, {
        "v": INGEST_VERSION, "options": inputs.option_key, "attempts": attempts_state(inputs.listing, inputs.stats),
        "cutoff": {str(k): v for k, v in plan.spec.cutoff.items()}, "cols": plan.spec.cols, "rename": plan.spec.rename,
        "repeats": [[r, a, n] for (r, a), n in sorted(rows.repeats.items())], "ranks": sorted(rows.rank_ids),
        "outputs": {"steps": output_stat(plan.out_dir, STEPS_FILE), "ranks": output_stat(plan.out_dir, RANKS_FILE)},
    })


def _derive(steps: pl.DataFrame, launches, flops: dict, alpha: float) -> pl.DataFrame:
    """tokens/s, MFU (per launch: its world size, FLOPs and peak: ``flops``, launch index ->
    launch_flops()) and the EMAs (``alpha``)."""
    scale = {}
    for launch in launches:
        info = flops.get(launch.index)
        if info and info["flops_per_token"] and info["peak_tflops"]:
            scale[launch.index] = info["flops_per_token"] / (world_size_of(launch) * info["peak_tflops"] * 1e12)
    steps = steps.with_columns(
        (pl.col("tokens").cast(pl.Float64) / pl.col("step_time_s")).alias("tokens_per_sec")
    ).with_columns(
        (pl.col("tokens_per_sec") * pl.col("attempt").replace_strict(scale, default=None, return_dtype=pl.Float64)).alias("mfu")
    ).with_columns([ema_expr(m, alpha=alpha).alias(f"{m}_ema") for m in EMA_METRICS])
    head = list(STEP_HEAD)
    emas = [f"{m}_ema" for m in EMA_METRICS]
    rest = [c for c in steps.columns if c not in head and c not in emas]
    return steps.select(head + rest + emas)
