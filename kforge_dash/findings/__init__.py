"""Findings and goodput of one ingested run: what went wrong, where, and what it cost.

    spikes.py      loss and grad-norm spikes (robust rule against a trailing baseline)
    nonfinite.py   the first NaN/inf per metric, and the ranks where it began
    stragglers.py  ranks whose own work is slower than the median rank's (not their step time)
    timeline.py    memory growth, data stalls, restarts
    episodes.py    slow episodes: the whole job's step time shifting up (and back), by change points
    kills.py       steps trained but not recorded (a kill), launches writing at the same time
    hang.py        a hung launch: the ranks the others wait for, their step, phase, line, collective
    missing.py     steps that some ranks of their launch did not record (a skipped part, a kill)
    goodput.py     the wall clock cut into productive time and badput buckets
    perstep.py     per-step facts over ranks, one lazy pass over ranks.parquet
    hardware.py    GPU throttling from the hw/ telemetry columns, and the cause of a straggler
    whatif.py      the run replayed without its stragglers, and what each rank cost
    mfu.py         where the MFU went: peak -> goodput buckets -> below peak -> achieved
    replicas.py    replicas that disagree: ranks whose replica-identical value differs from the majority's
    thresholds.py  FindingsOptions: the thresholds of the findings (IngestOptions.findings)
    finding.py     a Finding, and the run facts (RunFacts, Phases) detectors share
    matrix.py      one window of ranks.parquet as numpy matrices (steps x ranks), for perstep.py
    grid_units.py  perstep's matrices from ranks.parquet read row group by row group
    hang_evidence.py  what a stalled rank left (kforge_record/hang.py), read back
    host_table.py  across runs: the hosts that keep straggling, throttling, costing time (summary.json alone)

``analyse_run`` is ingest's one call; everything is computed from the ingested outputs
(steps.parquet, ranks.parquet), the launches and their meta.json, so it is recomputable. Findings
sit above the row pass (kforge_dash/ingest/) and below ingest/run.py in the import graph
(tests/test_layout.py); their thresholds, FindingsOptions, are an ingest option, so thresholds.py
sits in the row pass's layer.
"""

from __future__ import annotations

import os

from kforge_dash.contract import RANKS_FILE
from kforge_dash.findings.thresholds import FindingsOptions

__all__ = ["analyse_run", "FindingsOptions"]


def analyse_run(out_dir: str, steps, launches, summary: dict, opts: FindingsOptions, warnings: list[str]) -> dict:
    """``{"findings", "goodput", "host_ranks", "what_if", "mfu_waterfall", "findings_options", "phases"}`` for
    summary.json (the last two: the thresholds and the phase classes used, which the pages read). A detector that
    fails on odd input costs its own findings and one warning, never the ingest."""
    from kforge_dash.findings import episodes, goodput, kills, missing, nonfinite, perstep, spikes, stragglers, timeline
    from kforge_dash.findings.finding import RunFacts, classify_phases, sort_key
    from kforge_dash.findings.hang import hang_findings

    steps = _unknown_non_positive(steps, out_dir, warnings)
    facts = RunFacts(steps=steps, ranks_path=os.path.join(out_dir, RANKS_FILE), launches=launches, summary=summary,
                     opts=opts, phases=classify_phases(steps.columns, opts),
                     hosts={(L.index, a.rank): a.meta.get("host") for L in launches for a in L.attempts})
    found, good = [], None

    def attempt(name, fn, *args):
        try:
            return fn(*args)
        except Exception as e:  # noqa: BLE001 - reported, the rest of the summary stands
            warnings.append(f"findings: {name} could not be computed from {out_dir} ({type(e).__name__}: {e}); "
                            "the rest of the summary stands")
            return None

    med, blocks = attempt("per-step rank facts", perstep.per_step, facts) or (None, None)
    if med is None:
        import polars as pl

        med, blocks = pl.DataFrame({"step": []}, schema={"step": pl.Int64}), pl.DataFrame()
    good = attempt("goodput", goodput.goodput, facts, med)
    for name, fn, args in (("spikes", spikes.spike_findings, ()), ("nonfinite", nonfinite.nonfinite_findings, ()),
                           ("stragglers", stragglers.straggler_findings, (blocks, med)),
                           ("memory", timeline.memory_findings, ()),
                           ("data stalls", timeline.data_stall_findings, (med,)),
                           ("restarts", timeline.restart_findings, (good,)),
                           ("unrecorded steps", kills.unrecorded_findings, ()),
                           ("overlapping launches", kills.overlap_findings, ()),
                           ("missing ranks", missing.missing_rank_findings, ()),
                           ("hang", hang_findings, (warnings,))):
        found += attempt(name, fn, facts, *args) or []
    from kforge_dash.findings.replicas import replica_divergence_findings  # replicas.py: issue 31 §3

    found += attempt("replica divergence", replica_divergence_findings, facts, warnings) or []
    found += attempt("slow episodes", episodes.slow_episode_findings, facts,
                     [f for f in found if f.kind in ("straggler", "data_stall")]) or []  # their stretch is theirs
    from kforge_dash.findings import hardware, mfu, whatif

    throttled = attempt("hardware", hardware.episodes, facts) or []
    found = hardware.with_causes(found + (attempt("hardware", hardware.throttle_findings, facts, throttled) or []),
                                 throttled)
    found = immaterial_as_info(found, good, summary)
    return {"findings_options": opts.to_dict(), "phases": facts.phases.to_dict(),
            "findings": [f.to_dict() for f in sorted(found, key=sort_key)], "goodput": good,
            "host_ranks": host_ranks(facts.hosts),
            "what_if": attempt("what-if", whatif.what_if, facts, med, blocks, good, found),
            "mfu_waterfall": attempt("MFU waterfall", mfu.mfu_waterfall, facts, good, warnings)}


def host_ranks(hosts: dict) -> list[dict]:
    """summary.json ``host_ranks``: ``[{host, ranks}]`` by host, from (attempt, rank) -> host (known hosts only)."""
    by: dict[str, set[int]] = {}
    for (_, rank), h in hosts.items():
        if isinstance(h, str) and h:
            by.setdefault(h, set()).add(rank)
    return [{"host": h, "ranks": sorted(r)} for h, r in sorted(by.items())]


_COSTED = ("straggler", "data_stall", "slow_episode")


def immaterial_as_info(found: list, good: dict | None, summary: dict) -> list:
    """A straggler, data stall or slow episode whose cost is not material (straggler_costs.material: under
    1 % of the run's time or under 1 s) is severity info: timer noise of a clean run is no warning."""
    from dataclasses import replace

    from kforge_dash.ingest.straggler_costs import material

    total = good.get("total_s") if isinstance(good, dict) else None
    total = summary.get("wall_time_s") if total is None else total
    return [replace(f, severity="info") if f.kind in _COSTED and f.severity == "warning"
            and not material(f.cost_s, total) else f for f in found]


def _unknown_non_positive(steps, out_dir: str, warnings: list[str]):
    """Step times of zero or below (a clock stepped back, a bad import) are unknown to findings: null,
    with one warning naming how many and the first, so no share, straggler or saving is made of them."""
    import polars as pl

    cols = [c for c in ("step_time_s", "step_work_s", "step_work_median_s") if c in steps.columns]
    bad = steps.filter(pl.any_horizontal([pl.col(c) <= 0 for c in cols])) if cols else steps.clear()
    if bad.height == 0:
        return steps
    warnings.append(f"findings: {bad.height} step(s) of {out_dir} have a step time of zero or below (first: step "
                    f"{bad['step'].min()}); counted as unknown (no share, straggler or what-if saving from them)")
    return steps.with_columns([pl.when(pl.col(c) > 0).then(pl.col(c)).alias(c) for c in cols])
