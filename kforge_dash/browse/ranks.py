"""One run in detail: per-rank step-time heatmap, slowest-rank counts, memory per rank, phase
breakdown, restart timeline and non-finite steps. Each function is one lazy polars query."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from kforge_dash.browse.rank_metrics import median_rank, metric_label, phase_columns, phase_label, phase_name, view_metrics
from kforge_dash.contract import EMA_COLUMNS
from kforge_dash.findings.finding import Phases
from kforge_record.schema import MEM_COLUMNS, PHASE_PREFIX, PHASE_SUFFIX


@dataclass
class Heatmap:
    ranks: list[int]              # rows
    window_start: list[int]       # first step of each column's window
    window_end: list[int]         # last step of each column's window
    z: list[list[float | None]]   # ranks × windows; None where a rank reported no step there
    value: str                    # what z holds, for the colour-bar title
    relative: bool = False        # z is a ratio to the window's median rank (else seconds)
    seconds: list[list[float | None]] | None = None  # the mean values behind z (for the hover)
    unit: str = "s"  # of those values: s, or a GPU telemetry column's MHz, °C, W, %


# A phase's ratio to the median rank is taken of (seconds + floor), floor = this share of the window's
# median step time: a phase that is sub-millisecond on most ranks (four-ranks-stall's data phase before
# step 100: 0.35 ms) would otherwise make any rank's few ms read as 100-250x, and the colour scale
# sized for that hides a 1.4x straggler later in the same run. Differences well under 1 % of a step
# barely colour; the median rank still reads exactly 1x.
PHASE_FLOOR_SHARE = 0.01


def _window_width(first: int, last: int, windows: int) -> int:
    return max(1, math.ceil((last - first + 1) / max(windows, 1)))


def _step_span(lf: pl.LazyFrame) -> tuple[int, int] | None:
    span = lf.select(pl.col("step").min().alias("a"), pl.col("step").max().alias("b")).collect()
    if span["a"][0] is None:
        return None
    return int(span["a"][0]), int(span["b"][0])


def _grid(cell: pl.DataFrame, col: str, ranks: list[int], n_w: int) -> list[list[float | None]]:
    z = np.full((len(ranks), n_w), np.nan)
    row = {r: i for i, r in enumerate(ranks)}
    z[[row[r] for r in cell["rank"].to_list()], cell["w"].to_numpy()] = cell[col].cast(pl.Float64).fill_null(np.nan).to_numpy()
    # Missing cells become None (plotly leaves a gap), never a made-up number.
    return [[None if math.isnan(v) else float(v) for v in r] for r in z]


def rank_heatmap(ranks_path: str | Path, *, windows: int = 100, relative: bool = False,
                 metric: str = "step_time_s") -> Heatmap:
    """Mean `metric` (step time, or a phase timer) of each rank in each of about `windows` equal step windows.

    relative=True divides by the median rank of the same window (the lower median, as the straggler
    finding: an actual rank's value), so a straggler reads as
    e.g. 1.5 whatever the run's speed; for a phase timer both sides first get PHASE_FLOOR_SHARE of
    the window's median step time added (a sub-millisecond median does not blow up the ratio).
    Under data parallelism every rank's step time is the same (they wait for each other in the
    all-reduce), so the straggler shows in its phase timers: pick metric="time/data_s" or "time/fwd_bwd_s".
    """
    lf = pl.scan_parquet(ranks_path, glob=False)
    span = _step_span(lf)
    label, unit = metric_label(metric)
    if span is None:
        return Heatmap([], [], [], [], f"{label} ({unit})", relative, unit=unit)
    first, last = span
    width = _window_width(first, last, windows)
    cell = (
        lf.select("rank", "step", pl.col(metric).alias("x"), pl.col("step_time_s").alias("t"))
        .with_columns(((pl.col("step") - first) // width).alias("w"))
        .group_by("rank", "w")
        .agg(pl.col("x").mean().alias("s"), pl.col("t").mean())
    )
    if relative:
        phase = metric.startswith(PHASE_PREFIX)  # telemetry (MHz, °C) and step time: no floor
        floor = (PHASE_FLOOR_SHARE * pl.col("t").median().over("w")).fill_null(0.0) if phase else pl.lit(0.0)
        # The median rank as the straggler finding has it (the lower median: an actual rank's value; of two
        # ranks the faster, so the normal rank of two reads 1x, not 0.5x beside a straggler at 2x); for a
        # clock, the upper one (rank_metrics.median_rank).
        median = pl.col("s").quantile(0.5, interpolation=median_rank(metric)).over("w")
        cell = cell.with_columns(((pl.col("s") + floor) / (median + floor)).alias("v"))
    else:
        cell = cell.with_columns(pl.col("s").alias("v"))
    cell = cell.sort("rank", "w").collect()
    ranks = cell["rank"].unique().sort().to_list()
    n_w = (last - first) // width + 1
    starts = [first + i * width for i in range(n_w)]
    return Heatmap(ranks, starts, [min(s + width - 1, last) for s in starts], _grid(cell, "v", ranks, n_w),
                   f"{label} / median rank" if relative else f"mean {label} ({unit})", relative,
                   _grid(cell, "s", ranks, n_w), unit)


def rank_metrics(ranks_path: str | Path) -> list[str]:
    """What the per-rank heatmap can show: step time, every phase timer, the GPU telemetry (rank_metrics.py)."""
    path = Path(ranks_path)
    if not path.is_file():
        return ["step_time_s"]
    return view_metrics(_reading(path, lambda p: pl.scan_parquet(p, glob=False).collect_schema()).names())


def phase_per_rank(ranks_path: str | Path, classes: Phases | None) -> pl.DataFrame:
    """Mean seconds of each phase timer and of the whole step per rank, columns labelled for a
    person ('data phase (s)', 'fwd_bwd phase (s, incl. waiting)', 'step time (s)': rank_metrics.phase_label).

    Over the steps the rank ended, a phase that did not run in one counting 0 s there (the rule of
    the phase shares, _phase_frame): a checkpoint every 50 steps is its total / steps, not the mean of
    the steps it ran, so a rank's phases add up to its step time (less 'other', unless they overlap).

    The straggler is the rank whose own work (data, fwd_bwd) is longest; the others' wait phases
    (fwd_bwd under DDP) include the time they wait for it in the gradient all-reduce. ``classes``: the
    phase classes ingest used (summary.json ``phases``: Phases.from_summary); None (an older summary): no
    phase is marked as waiting.
    """
    lf = pl.scan_parquet(ranks_path, glob=False)
    schema = lf.collect_schema()
    phases = phase_columns(schema)
    if not phases:
        return pl.DataFrame(schema={"rank": pl.Int64})
    wait = set(classes.wait) if classes is not None else set()
    labels = {"step_time_s": phase_label("step_time_s")}  # the column registry's words
    for c in phases:
        label = phase_label(c, waiting=c in wait)
        labels[c] = label if label not in labels.values() else f"{label} [{c}]"  # a phase named 'step time'
    return (
        _phase_frame(lf, phases, keep=("rank",))
        .group_by("rank")
        .agg([pl.col(c).mean().alias(labels[c]) for c in (*phases, "step_time_s")])
        .sort("rank")
        .collect()
    )


@dataclass(frozen=True)
class SlowestOwnWork:
    """How often each rank's own work (its non-wait phases) was the longest of a step."""
    counts: pl.DataFrame          # rank, steps_slowest, share; most often first
    phases: tuple[str, ...]       # the own-work phase columns summed per rank and step


def per_rank_caption(own: tuple[str, ...], columns: list[str]) -> str:
    """The per-rank phase table's caption, naming the run's own-work phases (none: said so)."""
    waits = any("incl. waiting" in c for c in columns)
    text = ("Mean seconds per phase and rank, over the steps each rank ended (a phase that did not run in a step "
            "counts 0 s there, as in the phase shares).")
    if not own:
        return text + " No phase timer of a rank's own work: a straggler cannot be told apart from waiting here."
    names = ", ".join(phase_name(p) for p in own)
    wait = " while the others wait in the collective (the phases marked 'incl. waiting')" if waits else ""
    return (text + " Under data parallelism all ranks share one step time; a straggler shows as the rank "
            f"with the longest own work ({names}){wait}.")


def slowest_own_work(ranks_path: str | Path, phases: Phases | None) -> SlowestOwnWork | None:
    """Per step, the rank whose own work (the sum of its own-work phases) was the longest; how many
    steps each rank was that one. None when the run timed no own-work phase, or ``phases`` is None.

    The own-work phases are those ingest's straggler finding compared (summary.json ``phases``,
    Phases.from_summary): never re-classified here, so the page and the findings agree whatever
    ``--wait-phases`` the run was ingested with.

    Not the step time's argmax: under data parallelism every rank waits for the others in the
    collective, so all ranks' step times are equal up to noise and "the slowest" is a coin toss,
    which would contradict the straggler finding."""
    lf = pl.scan_parquet(ranks_path, glob=False)
    schema = lf.collect_schema()
    own = tuple(c for c in (phases.own if phases is not None else ()) if c in schema)
    if not own:
        return None
    work = pl.when(pl.any_horizontal(pl.col(own).is_not_null())).then(pl.sum_horizontal(pl.col(own)))
    counts = (
        lf.select("step", "rank", work.alias("own"))
        .filter(pl.col("own").is_not_null())
        .group_by("step")
        .agg(pl.col("rank").sort_by("rank").get(pl.col("own").sort_by("rank").arg_max()).alias("rank"))
        .group_by("rank")
        .agg(pl.len().cast(pl.Int64).alias("steps_slowest"))
        .with_columns((pl.col("steps_slowest") / pl.col("steps_slowest").sum()).alias("share"))
        .sort(["steps_slowest", "rank"], descending=[True, False])
        .collect()
    )
    return SlowestOwnWork(counts, own)


_MEM = ("mem_peak_bytes", *(c for c in MEM_COLUMNS if c != "mem_peak_bytes"))  # peak first: the bar drawn


def memory_per_rank(ranks_path: str | Path) -> pl.DataFrame:
    """Max of each memory column per rank (null where the rank never sampled memory, e.g. CPU)."""
    lf = pl.scan_parquet(ranks_path, glob=False)
    have = [c for c in _MEM if c in lf.collect_schema()]
    return (
        lf.group_by("rank")
        .agg([pl.col(c).max().alias(f"max_{c}") for c in have])
        .sort("rank")
        .collect()
    )


def memory_bars(mem: pl.DataFrame) -> tuple[list[int], list[int], str] | None:
    """(ranks, bytes, label) of the first memory column with any sample, or None (e.g. CPU)."""
    for col in ("max_mem_peak_bytes", "max_mem_allocated_bytes", "max_mem_reserved_bytes"):
        if col in mem.columns and mem[col].null_count() < len(mem):
            return mem["rank"].to_list(), mem[col].to_list(), col.removeprefix("max_")
    return None


OTHER = "other"  # the step time no phase timer covered
_OTHER_COL = "time/other_s"
# Phases whose sum exceeds the step time by more than this share of it (timer noise aside) overlap or nest.
_OVERLAP_TOL = 1e-3


def _phase_frame(lf: pl.LazyFrame, phases: list[str], keep: tuple[str, ...] = ()) -> pl.LazyFrame:
    """Ended steps with each phase's seconds (null -> 0: a timer that did not run in a step took
    no time in it) and 'other' = step time minus the phases, clipped at 0, and by how much it was.
    The one rule for a phase's seconds per step: the phase shares and the per-rank table use it."""
    rest = pl.col("step_time_s") - pl.sum_horizontal(pl.col(phases).fill_null(0.0))
    return (
        lf.filter(pl.col("step_time_s").is_not_null())
        .select("step", *keep, "step_time_s", *[pl.col(c).fill_null(0.0) for c in phases],
                *[pl.col(c).is_not_null().alias(f"{c}\0ran") for c in phases])
        .with_columns(rest.clip(lower_bound=0.0).alias(_OTHER_COL), (-rest).clip(lower_bound=0.0).alias("_over"))
    )


def phase_breakdown(path: str | Path, *, windows: int = 200) -> pl.DataFrame:
    """Mean seconds per step of each phase in about `windows` step windows, long format
    (window_start, phase, seconds), plus 'other' = step time minus the timed phases.

    `path`: ranks.parquet (each rank's own step: the mean over ranks and steps, what the average
    rank spent), or steps.parquet where the run has no per-rank file. ranks.parquet is the right
    one: steps.parquet's phase is the mean over the ranks that timed it, so a checkpoint only
    rank 0 writes would count as if every rank wrote it, while step_time_s is the slowest rank's.

    Every step counts in each phase's mean: a phase that did not run in a step (null: not timed
    there, e.g. a checkpoint every 50 steps) took 0 s in it. 'other' is clipped at 0 where the
    phases add up to more than the step time (they overlap or nest; phase_totals says so).
    """
    lf = pl.scan_parquet(path, glob=False)
    phases = phase_columns(lf.collect_schema())
    empty = pl.DataFrame(schema={"window_start": pl.Int64, "phase": pl.String, "seconds": pl.Float64})
    span = _step_span(lf)
    if not phases or span is None:
        return empty
    first, last = span
    width = _window_width(first, last, windows)
    wide = (
        _phase_frame(lf, phases)
        .with_columns((first + (pl.col("step") - first) // width * width).alias("window_start"))
        .group_by("window_start")
        .agg([pl.col(c).mean() for c in (*phases, _OTHER_COL)])
        .sort("window_start")
    )
    return (
        wide.unpivot(index="window_start", variable_name="phase", value_name="seconds")
        .with_columns(pl.col("phase").str.slice(len(PHASE_PREFIX)).str.strip_suffix(PHASE_SUFFIX))
        .collect()
    )


@dataclass(frozen=True)
class PhaseTotals:
    """Each phase's share of the run's step time; `note` says why 'other' was clipped, if it was."""
    table: pl.DataFrame  # phase, total_s, mean_s (per step, over every step), share, steps_ran
    note: str | None


def phase_totals(path: str | Path) -> PhaseTotals:
    """Each phase's seconds summed over every ended step (of every rank with ranks.parquet, as
    phase_breakdown), its mean per step and its share; steps_ran: in how many steps it ran.

    Shares add up to 1: of the step time, or, where phases overlap or nest (their sum exceeds the
    step time), of the phases' sum with 'other' clipped at 0 there (`note` says in how many steps).
    """
    lf = pl.scan_parquet(path, glob=False)
    phases = phase_columns(lf.collect_schema())
    empty = pl.DataFrame(schema={"phase": pl.String, "total_s": pl.Float64, "mean_s": pl.Float64,
                                 "share": pl.Float64, "steps_ran": pl.Int64})
    if not phases:
        return PhaseTotals(empty, None)
    cols = (*phases, _OTHER_COL)
    sums = _phase_frame(lf, phases).select(
        *[pl.col(c).sum() for c in cols],
        *[pl.col("step").filter(pl.col(f"{c}\0ran")).n_unique().alias(f"{c}\0ran") for c in phases],
        pl.len().alias("_n"), pl.col("step").n_unique().alias("_steps"), pl.col("step_time_s").sum().alias("_step"),
        (pl.col("_over") > _OVERLAP_TOL * pl.col("step_time_s")).sum().alias("_n_over"), pl.col("_over").max().alias("_max_over"),
    ).collect().row(0, named=True)
    n, total = sums["_n"], sum(sums[c] for c in cols)  # n: rows (steps, or rank-steps)
    if not n:
        return PhaseTotals(empty, None)
    table = pl.DataFrame({
        "phase": [phase_name(c) if c != _OTHER_COL else OTHER for c in cols],
        "total_s": [float(sums[c]) for c in cols],
        "mean_s": [sums[c] / n for c in cols],
        "share": [sums[c] / total if total else None for c in cols],
        "steps_ran": [int(sums[f"{c}\0ran"]) for c in phases] + [sums["_steps"]],
    }, schema=empty.schema).sort("total_s", descending=True)
    note = None
    if sums["_n_over"]:
        rows = f"{'rank-' if n > sums['_steps'] else ''}steps"
        note = (f"In {sums['_n_over']:,} of {n:,} {rows} the phase timers add up to more than the step time "
                f"(by up to {sums['_max_over']:.3g} s): phases overlap or nest. 'other' is 0 there, and each share "
                f"is of the phases' sum ({total:.4g} s), not of the step time ({sums['_step']:.4g} s).")
    return PhaseTotals(table, note)


_FLOATS = (pl.Float32, pl.Float64)


def nonfinite_steps(steps_path: str | Path) -> pl.DataFrame:
    """Every (step, metric) whose value is NaN or ±inf, with the value as text ('nan', 'inf')."""
    lf = pl.scan_parquet(steps_path, glob=False)
    cols = [c for c, t in lf.collect_schema().items() if t in _FLOATS and c not in EMA_COLUMNS]
    if not cols:
        return pl.DataFrame(schema={"step": pl.Int64, "metric": pl.String, "value": pl.String})
    parts = [
        lf.filter(pl.col(c).is_not_null() & ~pl.col(c).is_finite())
        .select("step", pl.lit(c).alias("metric"), pl.col(c).cast(pl.String).str.to_lowercase().alias("value"))
        for c in cols
    ]
    return pl.concat(parts).sort("step", "metric").collect()


def _ids_text(ids: list[str]) -> str | None:
    """A launch's attempt folders in one cell: the first and how many more (4,096 ranks: one line)."""
    if not ids:
        return None
    return ids[0] if len(ids) == 1 else f"{ids[0]} (+{len(ids) - 1} more)"


def restart_timeline(summary: dict) -> pl.DataFrame:
    """One row per attempt (launch): step range (rows; ``reached_step``: its heartbeat), start time, world size,
    and where it resumed."""
    resumed = {r.get("attempt"): r for r in summary.get("restarts") or [] if not r.get("in_process")}  # (relaunches)
    rows = []
    for a in summary.get("attempts") or []:
        r = resumed.get(a.get("attempt"), {})
        rows.append({
            "attempt": a.get("attempt"), "first_step": a.get("first_step"), "last_step": a.get("last_step"),
            "reached_step": a.get("reached_step"),
            "start_time": a.get("start_time"), "world_size": a.get("world_size"),
            "resumed_at_step": r.get("resumed_at_step"), "previous_last_step": r.get("previous_last_step"),
            "superseded_steps": r.get("superseded_steps"),
            "attempt_ids": _ids_text(a.get("attempt_ids") or []),
        })
    schema = {"attempt": pl.Int64, "first_step": pl.Int64, "last_step": pl.Int64, "reached_step": pl.Int64,
              "start_time": pl.Float64,
              "world_size": pl.Int64, "resumed_at_step": pl.Int64, "previous_last_step": pl.Int64,
              "superseded_steps": pl.Int64, "attempt_ids": pl.String}
    return pl.DataFrame(rows, schema=schema).with_columns(
        (pl.col("start_time") * 1e6).round().cast(pl.Int64).cast(pl.Datetime("us", "UTC")).alias("start_time"))


@dataclass
class RunDetail:
    """Everything the run detail page draws; ranks-based parts are None without ranks.parquet."""
    heatmap: Heatmap | None
    phase_by_rank: pl.DataFrame | None
    slowest: SlowestOwnWork | None  # None without ranks.parquet or own-work phase timers
    memory: tuple[list[int], list[int], str] | None
    phases: pl.DataFrame
    phase_totals: PhaseTotals
    timeline: pl.DataFrame
    nonfinite: pl.DataFrame
    phases_known: bool = True  # summary.json has the phase classes ingest used (older ones do not)


def _reading(path: Path, fn, *args, **kwargs):
    """Run fn(path, ...), turning polars' errors on a damaged file into one naming the file."""
    try:
        return fn(path, *args, **kwargs)
    except (pl.exceptions.PolarsError, OSError) as e:
        raise ValueError(f"{path}: cannot be read ({e}); re-ingest the run") from None


def run_detail(steps_path: str | Path, ranks_path: str | Path, summary: dict, *, relative: bool = True,
               metric: str = "step_time_s") -> RunDetail:
    steps_path, ranks_path = Path(steps_path), Path(ranks_path)
    has_ranks = ranks_path.is_file()
    phase_path = ranks_path if has_ranks else steps_path  # each rank's own phases (phase_breakdown)
    classes = Phases.from_summary(summary)  # as ingest classified them
    return RunDetail(
        heatmap=_reading(ranks_path, rank_heatmap, relative=relative, metric=metric) if has_ranks else None,
        phase_by_rank=_reading(ranks_path, phase_per_rank, classes) if has_ranks else None,
        slowest=_reading(ranks_path, slowest_own_work, classes) if has_ranks else None,
        memory=memory_bars(_reading(ranks_path, memory_per_rank)) if has_ranks else None,
        phases=_reading(phase_path, phase_breakdown),
        phase_totals=_reading(phase_path, phase_totals),
        timeline=restart_timeline(summary),
        nonfinite=_reading(steps_path, nonfinite_steps),
        phases_known=classes is not None,
    )
