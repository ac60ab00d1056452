"""`kforge-hang DIR [--json]`: which ranks a hung job waits for, from a folder of flight-recorder dumps.

A thin click wrapper over kforge_dash.ingest.flight_recorder (docs/hangs.md). The dumps are the
folder's regular files whose names end with a rank number (``_dump_12``, ``rank_3``, ``fr_7.json``):
PyTorch's pickles or JSON, format 2.x, NCCL or gloo. Nothing else is read; a file that cannot be
read is skipped with a warning naming it.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from kforge_dash.optional import MissingDependency, require

try:
    click = require("click", extra="ingest", purpose="kforge-hang")
except MissingDependency as e:  # at the edge: a message, not a traceback
    raise SystemExit(str(e)) from e


_WAIT_LINES = 8  # who waits for whom: the largest groups first, the rest in --json


def _merged(wait_groups: list[dict]) -> list[dict]:
    """Sends and recvs of one kind in groups of one description (each pipeline stage pair its own group) on one line."""
    out: dict[tuple, dict] = {}
    for g in wait_groups:
        key = (g["desc"], g["op"], g["seq"], "p2p") if g["p2p"] and g["desc"] and not g["completed_by"] else (id(g),)
        if key not in out:
            out[key] = {**g, "ranks": list(g["ranks"]), "waits_for": list(g["waits_for"]), "groups": {g["group"]}}
        else:
            out[key]["ranks"] += g["ranks"]
            out[key]["waits_for"] += g["waits_for"]
            out[key]["groups"].add(g["group"])
    for g in out.values():
        if len(g["groups"]) > 1:
            g["group"] = f"({len(g['groups'])} groups)"
        g["ranks"], g["waits_for"] = sorted(g["ranks"]), sorted(set(g["waits_for"]))
    return sorted(out.values(), key=lambda g: (g["p2p"], -len(g["ranks"]), g["ranks"]))


def _human(v, n_dumps: int, versions: str) -> list[str]:
    from kforge_dash.ingest.flight_recorder import collective_text
    from kforge_dash.text import counted, rank_list, rank_runs

    def named(rs) -> str:
        return rank_runs(rs) if rs else "none"

    lines = [f"{counted(n_dumps, 'dump')} (format {versions}), world size {v.world_size}"]
    cause = rank_list(v.ranks) or "not found in the dumps"
    lines.append(f"Cause: {cause}")
    lines.append(f"  {v.reason}")
    if v.collective is not None:
        c = v.collective
        lines.append(f"The others wait in: {collective_text(c)}, sizes {c.sizes} {' '.join(map(str, c.dtypes))}".rstrip())
    lines.append(f"Waiting (the majority): {counted(len(v.waiting), 'rank')}: {named(v.waiting)}")
    shown = _merged(v.wait_groups)
    if shown:
        lines.append("Who waits for whom (each rank's oldest collective not seen complete):")
    for g in shown[:_WAIT_LINES]:
        whom = (f"completed by {rank_runs(g['completed_by'])}" if g["completed_by"] else
                f"for {rank_runs(g['waits_for'])}" if g["waits_for"] else "for no rank the dumps tell")
        lines.append(f"  {counted(len(g['ranks']), 'rank')} ({rank_runs(g['ranks'])}) in {g['op']} #{g['seq']} of "
                     f"{g['desc'] or 'group'} {g['group']}, {whom}")
    if len(shown) > _WAIT_LINES:
        lines.append(f"  (+{len(shown) - _WAIT_LINES} more in --json)")
    if v.idle:
        lines.append(f"Nothing pending (stuck outside communication): {named(v.idle)}")
    if v.stuck:
        lines.append(f"Stuck in a collective their peers completed: {named(v.stuck)}")
    if v.undecided:
        lines.append(f"Stalled together, not told apart: {named(v.undecided)}")
    lines.append(f"Ranks without a dump: {named(v.ranks_without_dump)}")
    if not v.desync:
        lines.append("Desync: none (every rank issued the same collective at each sequence number)")
    for d in v.desync:
        variants = "; ".join(f"ranks {rank_runs(x['ranks'])}: {x['op']} {x['sizes']} {' '.join(map(str, x['dtypes']))}"
                             for x in d["variants"])
        lines.append(f"Desync in {d['desc'] or 'group'} {d['group']} #{d['seq']}: {variants}")
    return lines


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("folder", metavar="DIR", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout; `ranks` holds the ranks named.")
@click.option("--world-size", type=click.IntRange(min=1), default=None,
              help="Ranks in the job (default: the largest process group in the dumps).")
def main(folder: Path, as_json: bool, world_size: int | None) -> None:
    """Which ranks a hung job waits for, from its PyTorch flight-recorder dumps in DIR.

    Exit status: 0 analysed, 1 nothing readable in DIR, 2 usage error.
    """
    from kforge_dash.ingest.flight_recorder import analyze_fr, fr_dump_files, read_fr_dumps

    try:
        files = fr_dump_files(folder)
    except OSError as e:
        click.echo(f"kforge-hang: error: {folder}: cannot list it: {e.strerror or e}", err=True)
        sys.exit(1)
    dumps, warnings = read_fr_dumps(files)
    for w in warnings:
        click.echo(f"kforge-hang: warning: {w}", err=True)
    if not dumps:
        click.echo(f"kforge-hang: error: {folder}: no readable flight-recorder dump (files named for their rank, "
                   "e.g. _dump_3 or rank_3.json)", err=True)
        sys.exit(1)
    verdict = analyze_fr(dumps, world_size=world_size)
    for w in verdict.warnings:
        click.echo(f"kforge-hang: warning: {w}", err=True)
    versions = ", ".join(sorted({str(d.get("version")) for d in dumps.values()}))
    if as_json:
        out = dataclasses.asdict(verdict)
        out.update(dumps=len(dumps), versions=versions, warnings=[*warnings, *verdict.warnings])
        click.echo(json.dumps(out, indent=1, default=list))
        return
    for line in _human(verdict, len(dumps), versions):
        click.echo(line)


if __name__ == "__main__":
    main()
