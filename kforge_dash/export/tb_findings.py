"""summary.json findings as TensorBoard text summaries (docs/CONTRACT.md, "Exports").

``findings/<kind>``: a text summary (TensorBoard's text plugin: its TEXT tab, not a scalar card) in
the Event of each finding's first step, one line per finding of that kind starting there. Text,
not scalars, so they stay off TensorBoard's first screen: scalar cards ``findings/*`` would sort
before ``1_train/``.

What a line says is stable while the finding stands: severity, kind, first step, ranks, hosts,
phase, metric. Not its message, last step or score: those grow with each ingest of a running job,
and an earlier event that changed would turn tensorboard.py's append of new steps into a rewrite
of the whole file. The full finding is in summary.json and the dashboard's run detail page.

``lineage``: each restart of summary.json ``restarts`` (a relaunch, or a rollback in one process) as a
line in the Event of the step it resumed at; the kept line is the scalars, as ever.

The text plugin renders Markdown: names from disk (hosts, phases, metrics) are backslash-escaped,
so they show as typed.
"""

from __future__ import annotations

from kforge_dash import text
from kforge_dash.run_view import finding_kind, finding_where
from kforge_dash.text import md_text as _md

TEXT_PLUGIN = "text"  # the plugin_name of the summaries' metadata (tensorboard.plugins.text.metadata)


def finding_line(f: dict) -> str:
    """One finding as one Markdown line of stable facts (module doc): the run page's card (run_view.py)
    less what grows with each ingest (last step, message)."""
    parts = [f"**{_md(f.get('severity') or 'info')}**", _md(finding_kind(f)),
             f"from {text.step_range(f['first_step'])}", *map(_md, finding_where(f))]
    if f.get("phase") is None and f.get("metric") is not None:
        parts.append(f"metric {_md(f['metric'])}")
    if f.get("kind") == "hang":  # the lines the ranks stalled at, written once by each rank: stable
        for g in f.get("stacks") or []:
            if isinstance(g, dict):
                parts.append(f"{len(g.get('ranks') or [])} at {_md(g.get('frame'))}")
    return " · ".join(parts)


def lineage_line(r: dict) -> str:
    """One restart of summary.json ``restarts`` as one line of stable facts: how the segment began, the step
    it resumed at, the step reached before, the steps run again (the kept line is the scalars')."""
    how = (f"rollback in launch {r.get('attempt')}" if r.get("in_process")
           else f"launch {r.get('attempt')} ({_md(str(r.get('why') or 'relaunch'))})")
    n = r.get("superseded_steps")
    return (f"**{how}**: resumed at step {r.get('resumed_at_step')} after step {r.get('previous_last_step')}"
            + (f" · {n} steps run again" if isinstance(n, int) else ""))


def lineage_text(summary: dict | None) -> str | None:
    """The run's lineage as Markdown, one line per restart (None: no restart): W&B's ``kforge/lineage``."""
    rs = [r for r in (summary or {}).get("restarts") or [] if isinstance(r, dict)]
    return "\n\n".join(lineage_line(r) for r in rs) if rs else None


def findings_by_step(summary: dict | None) -> dict[int, list[tuple[str, str]]]:
    """{step: [(tag, Markdown text)]}: per first step and kind, the lines of its findings; ``lineage`` at
    the step each restart resumed at (lineage_line)."""
    lines: dict[tuple[int, str], list[str]] = {}
    for f in (summary or {}).get("findings") or []:
        if isinstance(f, dict) and isinstance(f.get("first_step"), int) and isinstance(f.get("kind"), str):
            lines.setdefault((f["first_step"], f"findings/{f['kind']}"), []).append(finding_line(f))
    for r in (summary or {}).get("restarts") or []:
        if isinstance(r, dict) and isinstance(r.get("resumed_at_step"), int):
            lines.setdefault((r["resumed_at_step"], "lineage"), []).append(lineage_line(r))
    out: dict[int, list[tuple[str, str]]] = {}
    for (step, tag), texts in sorted(lines.items()):
        out.setdefault(step, []).append((tag, "\n\n".join(texts)))
    return out
