"""The plan of one ingest, made from metadata only (meta.json, end.json, Parquet footers): the
launches, the part files to read and with what, the restart cut-offs, and whether the last
ingest's outputs can be appended to (docs/CONTRACT.md, "Ingest's rules" and "Re-ingest")."""

from __future__ import annotations

from dataclasses import dataclass

from kforge_dash.ingest.inputs import shards as _shards
from kforge_dash.ingest.inputs.launches import Launch, group_launches
from kforge_dash.ingest.inputs.manifest import FooterCache, load_prior
from kforge_dash.ingest.inputs.read import PartToRead, ReadSpec, output_columns
from kforge_dash.ingest.options import IngestError, IngestNotReady
from kforge_dash.ingest.rowpass.append import AppendPlan, plan_append


@dataclass(frozen=True)
class IngestInputs:
    """What the run directory holds, listed and stat'ed (no file opened yet)."""

    run_dir: str
    out_dir: str
    listing: list  # shards.AttemptFiles
    stats: dict  # path -> (size, mtime_ns) | None, shards.stat_inputs
    option_key: dict  # the ingest options that change the outputs (in the digest and the manifest)
    digest: str  # shards.input_digest: equal to the last summary's "fingerprint" means nothing to redo


@dataclass(frozen=True)
class IngestPlan:
    """Everything the row pass, the derivations and the summary need, decided before any row is read."""

    run_dir: str
    out_dir: str
    inputs: IngestInputs
    cache: FooterCache  # footers read or reused; written back as the next manifest
    attempts: list  # shards.Attempt, the readable ones
    launches: list[Launch]
    first_ended: dict[int, int | None]  # launch -> its lowest ended step (None: it ended none)
    last_ended: dict[int, int | None]  # launch -> its highest ended step
    files: list[PartToRead]  # the parts with rows not superseded, launch by launch, rank by rank
    spec: ReadSpec
    chunk_rows: int
    append: AppendPlan | None  # the last ingest's outputs can be extended with new part files


def make_plan(inputs: IngestInputs, warnings: list[str], *, force: bool, chunk_rows: int) -> IngestPlan:
    """``force``: read every footer and part again (no append); ``chunk_rows``: rows a window."""
    # Footers come from the last ingest's manifest where the part is unchanged (--force: none).
    prior = None if force else load_prior(inputs.out_dir, inputs.run_dir)
    cache = FooterCache(inputs.run_dir, inputs.stats, prior)
    cache.prefetch(inputs.listing)
    attempts = [a for a in (_shards.read_attempt(af, warnings, cache) for af in inputs.listing) if a is not None]
    launches = group_launches(attempts, warnings)
    files = _files_with_rows(launches)
    if not files:
        _no_rows(inputs, attempts, warnings)
    first = {launch.index: ended_bound(launch.parts(), lowest=True) for launch in launches}
    last = {launch.index: ended_bound(launch.parts(), lowest=False) for launch in launches}
    cutoff = _restart_cutoffs(launches, first)
    files = [f for f in files if cutoff[f.launch] is None or f.part.min_step < cutoff[f.launch]]
    cols, rename = output_columns([f.part for f in files])
    for old, new in rename.items():
        warnings.append(f"user scalar {old!r} clashes with a column ingest derives; written as {new!r}")
    counts_tokens = {(a.rank, launch.index): bool(a.meta.get("counts_tokens", True))
                     for launch in launches for a in launch.attempts}
    spec = ReadSpec(cols, rename, cutoff, counts_tokens if not all(counts_tokens.values()) else None)
    append = None
    if prior is not None:
        append = plan_append(prior, run_dir=inputs.run_dir, out_dir=inputs.out_dir, listing=inputs.listing,
                             stats=inputs.stats, options=inputs.option_key, files=files, cutoff=cutoff, cols=cols,
                             rename=rename)
    return IngestPlan(inputs.run_dir, inputs.out_dir, inputs, cache, attempts, launches, first, last, files, spec,
                      chunk_rows, append)


def _no_rows(inputs: IngestInputs, attempts: list, warnings: list[str]):
    """Raise why there is nothing to read: not yet (no part file, a job still running) or never."""
    if not any(af.parts for af in inputs.listing) and any(a.end is None for a in attempts):
        raise IngestNotReady(f"{inputs.run_dir}: no readable rows yet (no part file: the job has not flushed; waiting)")
    problems = "; ".join(warnings[:5]) or "every part file is empty"
    raise IngestError(f"{inputs.run_dir}: no readable rows ({problems})")


def _files_with_rows(launches: list[Launch]) -> list[PartToRead]:
    files = []
    for launch in launches:
        # Rank by rank within a launch (not in start-time order): the reductions take "the lowest
        # reporting rank" as the first row of a step, and the matrix path needs ascending ranks.
        for a in sorted(launch.attempts, key=lambda a: a.rank):  # a rank is in a launch once
            files += [PartToRead(p, a.rank, launch.index) for p in a.parts if p.num_rows and p.min_step is not None]
    return files


def _restart_cutoffs(launches: list[Launch], first_ended: dict) -> dict[int, int | None]:
    """Restarts: rows of a launch at or past a later launch's first ended step are superseded.

    Ended steps only: a Recorder.log row (an eval of the resumed checkpoint, a startup scalar at
    step 0) is not where a launch resumed training, and must not supersede earlier rows."""
    cutoff = {}
    for launch in launches:
        later = [first_ended[b.index] for b in launches[launch.index + 1:] if first_ended[b.index] is not None]
        cutoff[launch.index] = min(later) if later else None
    return cutoff


def ended_bound(parts, *, lowest: bool) -> int | None:
    """The smallest (lowest) or largest ended step over ``parts``, None when none ended a step.

    A part's ended range lies within its footer's [min_step, max_step], so parts are visited from
    the most promising footer bound and the walk stops once no later part can beat the best:
    only a few parts that mix end_step and log rows are read, however many there are.
    """
    cand = sorted((p for p in parts if p.has_end_rows and p.min_step is not None),
                  key=lambda p: p.min_step if lowest else -p.max_step)
    best = None
    for p in cand:
        if best is not None and (p.min_step >= best if lowest else p.max_step <= best):
            break
        lo, hi = _shards.ended_steps(p)
        v = lo if lowest else hi
        if v is not None and (best is None or (v < best if lowest else v > best)):
            best = v
    return best
