"""summary.json findings as TensorBoard text summaries (docs/CONTRACT.md, "Exports").

``findings/<kind>``: a text summary (TensorBoard's text plugin: its TEXT tab, not a scalar card) in
the Event of each finding's first step, one line per finding of that kind starting there. Text,
not scalars, so they stay off TensorBoard's first screen: scalar cards ``findings/*`` would sort
before ``1_train/``.

What a line says is stable while the finding stands: severity, kind, first step, ranks, hosts,
phase, metric. Not its message, last step or score: those grow with each ingest of a running job,
and an earlier event that changed would turn tensorboard.py's append of new steps into a rewrite
of the whole file. The full finding is in summary.json and the dashboard's run detail page.

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


def findings_by_step(summary: dict | None) -> dict[int, list[tuple[str, str]]]:
    """{step: [(tag, Markdown text)]}: per first step and kind, the lines of its findings."""
    lines: dict[tuple[int, str], list[str]] = {}
    for f in (summary or {}).get("findings") or []:
        if isinstance(f, dict) and isinstance(f.get("first_step"), int) and isinstance(f.get("kind"), str):
            lines.setdefault((f["first_step"], f"findings/{f['kind']}"), []).append(finding_line(f))
    out: dict[int, list[tuple[str, str]]] = {}
    for (step, tag), texts in sorted(lines.items()):
        out.setdefault(step, []).append((tag, "\n\n".join(texts)))
    return out
