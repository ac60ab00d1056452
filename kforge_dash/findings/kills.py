"""Findings of killed and overlapping launches: steps trained but not recorded, launches that
wrote one run at the same time (summary.json ``unrecorded`` and ``overlaps``, from restarts.py)."""

from __future__ import annotations

from kforge_dash import text
from kforge_dash.findings.finding import Finding, RunFacts, steps_range


def unrecorded_findings(facts: RunFacts) -> list[Finding]:
    """A launch killed after its last flush: the steps it trained that no row records and no later
    launch redid (a hole in steps.parquet that nothing else explains)."""
    out = []
    for u in facts.summary.get("unrecorded") or []:
        first, last = u["first_step"], u["last_step"]
        n = last - first + 1 if first is not None else None
        what = f"{steps_range(first, last)} {'was' if n == 1 else 'were'}" if first is not None else f"steps up to {last} were"
        rows = "no step" if u["recorded_step"] is None else f"step {u['recorded_step']}"
        ranks = tuple(u["ranks"])
        out.append(Finding(
            kind="unrecorded_steps", severity="warning", first_step=first if first is not None else last, last_step=last,
            ranks=ranks, hosts=facts.hosts_of(ranks, {u["attempt"]}), score=n,
            message=(f"{what[0].upper()}{what[1:]} trained by launch {u['attempt']} but not recorded: its rows "
                     f"stop at {rows}, its heartbeat at step {u['reached_step']} ({_why(u)}) and no later launch redid "
                     f"them; {_advice(u)}."),
        ))
    return out


def _why(u: dict) -> str:
    if u.get("killed", True):
        return "the unflushed rows were lost when it was killed"
    return "it closed cleanly: the recorder dropped those rows (see dropped_rows) or they ended after close()"


def _advice(u: dict) -> str:
    if u.get("killed", True):
        return "flush more often (flush_every_steps) or stop jobs with SIGTERM"
    return "see the recorder's warnings in the job's log"


def overlap_findings(facts: RunFacts) -> list[Finding]:
    """Two launches writing one run at the same time (a killed launcher's orphaned workers and a relaunch)."""
    out = []
    for o in facts.summary.get("overlaps") or []:
        a, b = o["attempts"]
        ids = {x["attempt"]: x.get("attempt_ids") or [] for x in facts.summary.get("attempts") or []}
        ranks = tuple(o["ranks"])
        both = "" if o["first_step"] is None else f"; {steps_range(o['first_step'], o['last_step'])} ran in both"
        out.append(Finding(
            kind="overlapping_launches", severity="warning",
            first_step=o["first_step"] if o["first_step"] is not None else o["reached_step"],
            last_step=o["last_step"] if o["last_step"] is not None else o["reached_step"],
            ranks=ranks, hosts=facts.hosts_of(ranks, {a, b}), score=o["seconds"],
            message=(f"Launches {a} ({_first(ids.get(a))}) and {b} ({_first(ids.get(b))}) wrote this run at the same "
                     f"time: launch {a} still wrote {text.duration(o['seconds'])} after launch {b} started{both}; kill the "
                     "workers of a launch (its process group or job step), not only its launcher, before relaunching."),
        ))
    return out


def _first(ids) -> str:
    return "?" if not ids else ids[0] if len(ids) == 1 else f"{ids[0]} and {len(ids) - 1} more"
