"""One registry of what kforge shows: every column of the ingested outputs (steps.parquet, ranks.parquet)
and every summary.json field a page shows, by name -> label, unit, format and help.

The runs table (dashboard and kforge-report), the run header (CLI screen, run page, report), the per-rank
views and the TensorBoard/W&B labels and tooltips read their words here; text.py says how each format
reads. A summary field is named by its path in summary.json (``goodput.fraction``); a list field
(``restarts``, ``findings``, ``warnings``) shows as its count. Families cover the columns whose names a
run chooses: phase timers ``time/NAME_s``, the smoothed ``NAME_ema`` and user scalars (any other name:
``lookup`` gives them USER_SCALAR's words, ``known`` says they are not kforge's own).
No heavy imports: ingest, export, browse and the CLIs may all import it.
"""

from __future__ import annotations

from dataclasses import dataclass

from kforge_dash import text
from kforge_record.schema import PHASE_PREFIX, PHASE_SUFFIX


def _rate(v) -> str:
    return text.number(v, "{:,.0f}")


def _list(v) -> str:
    """A list as "a, b" (tags); "—" for none."""
    if isinstance(v, (list, tuple)):
        return ", ".join(map(str, v)) or text.MISSING
    return text.MISSING if v in (None, "") else str(v)


# How each format reads (kforge_dash/text.py): value -> text, "—" where missing.
FORMATS = {
    "count": text.count, "percent": text.percent, "duration": text.duration, "loss": text.loss,
    "bytes": text.gib, "rate": _rate, "number": text.number, "sig3": lambda v: text.number(v, "{:.3g}"),
    "sig4": lambda v: text.number(v, "{:.4g}"), "text": lambda v: text.MISSING if v in (None, "") else str(v),
    "list": _list,
}


@dataclass(frozen=True)
class Column:
    """What a column or summary field is: its label, unit (None: a count or a name), FORMATS key and help."""
    name: str
    label: str
    unit: str | None
    format: str
    help: str

    def __post_init__(self):
        if self.format not in FORMATS:
            raise ValueError(f"{self.name}: format {self.format!r} is not one of {', '.join(FORMATS)}")

    def text(self, value) -> str:
        """``value`` as every front end shows it (its format; "—" where missing)."""
        return FORMATS[self.format](value)

    @property
    def titled(self) -> str:
        """The label with its unit, for an axis ("step time (s)", "GPU power (W)"; "tokens/s" as it is)."""
        return self.label if not self.unit or self.unit in self.label.split() else f"{self.label} ({self.unit})"


TRAINING_TIME = "training time"
JOB_WALL_CLOCK = "job wall clock"
MEAN_MFU = "mean MFU"
ACHIEVED_MFU = "achieved MFU"
FINAL_LOSS = "final loss"
BEST_LOSS = "best loss"
MFU_HELP = ("mean MFU: time-weighted, the kept steps' FLOPs over their step times added up (training time); "
            "achieved MFU (the MFU waterfall): the same FLOPs over the whole job wall clock, incl. startup, "
            "downtime and stalls, so it is the lower of the two")
ACHIEVED_HELP = ("achieved MFU: the kept steps' FLOPs over the whole job wall clock (startup, downtime, "
                 "recomputed steps and stalls included); mean MFU divides the same FLOPs by the training time only")
LOSS_HELP = ("final loss: the last kept step's loss, the mean over the ranks that recorded it (NaN shown as nan); "
             "best loss: the lowest finite one of those per-step means")
WALL_TIMES_HELP = ("training time: the kept steps' periods added up, from each launch's first step's start to its last "
                   "step's end (time between steps included; no startup, no downtime between launches); job wall clock: "
                   "from the first launch's start to the last record, incl. startup, downtime between launches and "
                   "recomputed steps")

_C = Column
_ENTRIES = (
    # steps.parquet and ranks.parquet (docs/CONTRACT.md, "Ingested outputs")
    _C("step", "step", None, "count", "the training step, as the job numbered it"),
    _C("time", "end time", "s", "number", "when the step ended: max over ranks (Unix seconds)"),
    _C("rank", "rank", None, "count", "the rank (ranks.parquet: one row per step and rank)"),
    _C("step_time_s", "step time", "s", "duration", "steps.parquet: the job's step time, the period since the "
       "previous step end, mean over ranks (what tokens/s, MFU and the training time use); ranks.parquet: "
       "the rank's own start_step -> end_step time"),
    _C("step_work_s", "slowest rank's work", "s", "duration", "max over ranks of each rank's own step time"),
    _C("step_work_min_s", "fastest rank's work", "s", "duration", "min over ranks of each rank's own step time"),
    _C("step_work_median_s", "median rank's work", "s", "duration", "median over ranks of each rank's own step time"),
    _C("slowest_rank", "slowest rank", None, "count", "the rank with the longest own step time (lowest on ties)"),
    _C("n_ranks", "ranks reporting", None, "count", "ranks that reported the step"),
    _C("attempt", "attempt", None, "count", "0-based index of the launch the step's rows came from"),
    _C("tokens", "tokens", None, "count", "global tokens: of the step (steps.parquet; a rank's in "
       "ranks.parquet), of the whole run (summary.json)"),
    _C("tokens_per_sec", "tokens/s", "tokens/s", "rate", "global tokens over the step time"),
    _C("mfu", "MFU", "%", "percent", "model FLOPs utilisation: FLOPs/token x tokens/s over ranks x peak FLOPS"),
    _C("loss", "loss", None, "loss", "mean over the ranks that reported it (NaN/inf kept)"),
    _C("grad_norm", "grad norm", None, "sig4", "gradient norm, from the lowest reporting rank"),
    _C("lr", "learning rate", None, "sig3", "learning rate, from the lowest reporting rank"),
    _C("mem_allocated_bytes", "allocated mem", "GiB", "bytes", "GPU memory allocated: max over ranks"),
    _C("mem_peak_bytes", "peak mem", "GiB", "bytes", "peak GPU memory allocated: max over ranks"),
    _C("mem_reserved_bytes", "reserved mem", "GiB", "bytes", "GPU memory the caching allocator reserved: max over ranks"),
    _C("hw/gpu_util_pct", "GPU utilisation", "%", "sig3", "NVML GPU utilisation, mean over ranks"),
    _C("hw/gpu_temp_c", "GPU temperature", "°C", "sig3", "NVML GPU temperature, mean over ranks"),
    _C("hw/gpu_power_w", "GPU power", "W", "sig3", "NVML GPU power draw, mean over ranks"),
    _C("hw/sm_clock_mhz", "SM clock", "MHz", "sig4", "NVML SM clock, mean over ranks"),
    _C("hw/throttle_reasons", "throttle reasons", None, "count", "NVML throttle-reason bitmask, OR over ranks"),
    _C("loss_ema", "loss (EMA)", None, "loss", "exponential moving average of loss (alpha: kforge-ingest --alpha)"),
    _C("tokens_per_sec_ema", "tokens/s (EMA)", "tokens/s", "rate", "exponential moving average of tokens/s"),
    _C("mfu_ema", "MFU (EMA)", "%", "percent", "exponential moving average of MFU"),
    _C("step_time_s_ema", "step time (EMA)", "s", "duration", "exponential moving average of the step time"),
    # superseded.parquet: what a rollback, a relaunch or an imported log's purge replaced (docs/restarts.md)
    _C("tag", "metric", None, "text", "superseded.parquet: the metric (a steps.parquet column or a logged tag)"),
    _C("value", "value", None, "number", "superseded.parquet: the superseded value (mean over ranks)"),
    _C("reason", "superseded by", None, "text", "superseded.parquet: rollback or relaunch "
       "(kforge-ingest); purge_step, out_of_order or repeated_step (kforge-import)"),
    _C("superseded_at_step", "resumed at step", None, "count", "superseded.parquet: the step the kept line went "
       "back to"),
    # The run page's restarts table (a row per launch, from summary attempts and restarts), its lineage table
    # (a row per segment: a launch, or what followed a rollback in one) and kforge-report's restarts table
    _C("reached_step", "last step reached", None, "count", "restarts table: the last step the launch's heartbeat "
       "reached (past its last step: steps it trained but never recorded)"),
    _C("start_time", "started", None, "text", "restarts table: when the launch started (UTC)"),
    _C("resumed_at_step", "resumed at step", None, "count", "the first step a relaunch or a rollback ran again"),
    _C("previous_last_step", "previous last step", None, "count", "the last step recorded before the restart"),
    _C("superseded_steps", "steps recomputed", None, "count", "steps recorded before the restart and run again "
       "after it (the earlier rows superseded)"),
    _C("attempt_ids", "attempt ids", None, "text", "the launch's folders (rank-*/ATTEMPT_ID)"),
    _C("segment", "segment", None, "text", "lineage: a launch, or the part of one after a rollback in it"),
    _C("resumed_from", "resumed from step", None, "count", "lineage: the last step kept before the segment "
       "(the checkpoint it resumed from)"),
    _C("wall_lost_s", "wall time lost", "s", "duration", "lineage: a rollback's wasted progress; a relaunch's "
       "downtime before it and the earlier launch's wasted progress"),
    _C("why", "why", None, "text", "what began it: relaunch, kill, rollback or overlap (docs/restarts.md)"),
    # The run page's phase breakdown table (browse/ranks.py phase_totals)
    _C("phase", "phase", None, "text", "phase breakdown: a phase timer, or other (the step time no timer covered)"),
    _C("total_s", "total", "s", "duration", "phase breakdown: the phase's seconds over every ended step (of every rank)"),
    _C("mean_s", "per step", "s", "duration", "phase breakdown: the total over every step, a step it did not run "
       "counting 0 s"),
    _C("share", "share", None, "percent", "phase breakdown: of the step time, or of the phases' sum where they overlap"),
    _C("steps_ran", "steps it ran", None, "count", "phase breakdown: steps in which the phase ran"),
    # summary.json fields the pages, the report and the CLI screen show (a list: its count)
    _C("run", "run", None, "text", "the run folder's name"),
    _C("status", "status", None, "text", "ingested; stale (shards newer than the last ingest); not ingested; unreadable"),
    _C("steps", "steps", None, "count", "kept steps (after restart de-duplication)"),
    _C("first_step", "first step", None, "count", "the first kept step (restarts and lineage tables: the first "
       "step the launch or segment recorded)"),
    _C("last_step", "last step", None, "count", "the last kept step (restarts and lineage tables: the last step "
       "the launch or segment recorded)"),
    _C("world_size", "ranks", None, "count", "the job's world size: how many ranks it ran (restarts table: the "
       "launch's)"),
    _C("ranks", "ranks recorded", None, "count", "ranks that wrote shards"),
    _C("attempts", "launches", None, "count", "launches (attempts) of the run"),
    _C("restarts", "restarts", None, "count", "launches that resumed the run"),
    _C("wall_time_s", TRAINING_TIME, "s", "duration", WALL_TIMES_HELP),
    _C("goodput.total_s", JOB_WALL_CLOCK, "s", "duration", WALL_TIMES_HELP),
    _C("goodput.fraction", "goodput", "%", "percent", f"productive share of the {JOB_WALL_CLOCK}"),
    _C("mean_tokens_per_sec", "tokens/s", "tokens/s", "rate", "global tokens over the training time"),
    _C("mean_mfu", MEAN_MFU, "%", "percent", MFU_HELP),
    _C("mfu_waterfall.parts.achieved", ACHIEVED_MFU, "%", "percent", ACHIEVED_HELP),
    _C("final_loss", FINAL_LOSS, None, "loss", LOSS_HELP),
    _C("best_loss", BEST_LOSS, None, "loss", LOSS_HELP),
    _C("peak_mem_bytes", "peak mem", "GiB", "bytes", "peak GPU memory allocated, max over ranks and steps"),
    _C("device", "device", None, "text", "the GPU's name (CPU for a CPU run)"),
    _C("flops_per_token", "FLOPs/token", None, "sig4", "model FLOPs per token (and where it came from)"),
    _C("peak_tflops", "peak TFLOPS/GPU", None, "number", "the GPU's peak TFLOPS that MFU divides by"),
    _C("findings", "findings", None, "count", "spikes, NaNs, stragglers, slow episodes ... (the run page lists them)"),
    _C("warnings", "warnings", None, "count", "ingest's warnings about the run's input"),
    _C("tags", "tags", None, "list", "the run's tags (Recorder(tags=...))"),
)
REGISTRY: dict[str, Column] = {c.name: c for c in _ENTRIES}
assert len(REGISTRY) == len(_ENTRIES), "one entry per name"

# The runs table of the dashboard and of kforge-report: these columns, in this order (what a run found and
# warned about first, so they are on screen whatever the width). The job wall clock and the achieved MFU are
# in the run header (page, report, CLI screen), not here: with them the table overflowed 1280 px
# (tests/test_browser_text_cut.py).
RUNS_TABLE = ("run", "status", "findings", "warnings", "goodput.fraction", "restarts", "steps", "tokens", "wall_time_s",
              "final_loss", "best_loss", "mean_mfu", "peak_mem_bytes", "world_size", "device", "tags")
USER_SCALAR = "user scalar"


def _family(name: str) -> Column | None:
    if name.startswith(PHASE_PREFIX) and name.endswith(PHASE_SUFFIX) and len(name) > len(PHASE_PREFIX + PHASE_SUFFIX):
        phase = name[len(PHASE_PREFIX):-len(PHASE_SUFFIX)]
        return Column(name, f"{phase} phase", "s", "duration", f"the {phase} phase timer: mean over ranks "
                      "(ranks.parquet: the rank's), 0 s in a step it did not run")
    if name.endswith("_ema") and name[:-4] in REGISTRY:
        base = REGISTRY[name[:-4]]
        return Column(name, f"{base.label} (EMA)", base.unit, base.format, f"exponential moving average of {base.label}")
    return None


def known(name: str) -> bool:
    """Whether ``name`` is one of kforge's own columns or fields (an entry or a family), not a user scalar."""
    return name in REGISTRY or _family(name) is not None


def lookup(name: str) -> Column:
    """The entry of a column or summary field; a name kforge does not define is a user scalar, shown by its name."""
    return REGISTRY.get(name) or _family(name) or Column(name, name, None, "number", f"{USER_SCALAR}: logged by the job")


def label(name: str) -> str:
    return lookup(name).label


def help_of(name: str) -> str:
    return lookup(name).help


def markdown_table() -> str:
    """The registry as the Markdown table of docs/reference/columns.md (tests/test_column_registry.py keeps
    the page in step with it)."""
    rows = ["| name | label | unit | format | help |", "| --- | --- | --- | --- | --- |"]
    rows += [f"| `{c.name}` | {c.label} | {c.unit or ''} | {c.format} | {c.help} |" for c in _ENTRIES]
    rows += ["| `time/NAME_s` | NAME phase | s | duration | a phase timer (Recorder.phase) |",
             "| `NAME_ema` | LABEL (EMA) | as NAME | as NAME | exponential moving average of NAME |",
             f"| any other | its name | | number | a {USER_SCALAR} the job logged |"]
    return "\n".join(rows) + "\n"
