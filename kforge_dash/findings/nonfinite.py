"""NaN/inf: per metric, the first step and the ranks where it first went non-finite.

Read from ranks.parquet, not steps.parquet: one rank's NaN loss poisons the gradient all-reduce, so
a step later every rank is NaN, and the rank that went first is the one to look at. One lazy
aggregation over the file (first step and count per metric), then the rows of those first steps.
Only the columns ranks.parquet's writer could not vouch for are read (contract.RANKS_NONFINITE_KEY):
in a healthy run, none, and the file is not read again.
"""

from __future__ import annotations

import json

import polars as pl

from kforge_dash import column_registry as reg
from kforge_dash import text
from kforge_dash.contract import RANKS_NONFINITE_KEY
from kforge_dash.findings.finding import Finding, RunFacts, steps_range

_SKIP = {"time"}  # a wall-clock time is never NaN in a file the recorder wrote


def nonfinite_findings(facts: RunFacts) -> list[Finding]:
    lf = pl.scan_parquet(facts.ranks_path, glob=False)
    schema = lf.collect_schema()
    maybe = _maybe_nonfinite(facts.ranks_path)
    metrics = [c for c, dt in schema.items() if dt == pl.Float64 and c not in _SKIP and (maybe is None or c in maybe)]
    if not metrics:
        return []
    bad = {m: pl.col(m).is_not_null() & ~pl.col(m).is_finite() for m in metrics}
    agg = lf.select(
        *[pl.col("step").filter(bad[m]).min().alias(f"{m}\0first") for m in metrics],
        *[pl.col("step").filter(bad[m]).max().alias(f"{m}\0last") for m in metrics],
        *[bad[m].sum().alias(f"{m}\0n") for m in metrics],
    ).collect(engine="streaming").row(0, named=True)  # streaming: the file's columns are never all in memory
    firsts = {m: agg[f"{m}\0first"] for m in metrics if agg[f"{m}\0first"] is not None}
    if not firsts:
        return []
    at = (lf.filter(pl.col("step").is_in(sorted(set(firsts.values()))))
          .select("step", "rank", "attempt", *[bad[m].alias(m) for m in firsts]).collect())
    out = []
    for m, first in firsts.items():
        rows = at.filter((pl.col("step") == first) & pl.col(m))
        ranks = tuple(sorted(rows["rank"].unique().to_list()))
        kinds = _kinds(lf, m, first, ranks)
        n, last = int(agg[f"{m}\0n"]), agg[f"{m}\0last"]
        whose = "that rank's" if len(ranks) == 1 else "those ranks'"
        who = text.rank_list(ranks)
        out.append(Finding(
            kind="nonfinite", metric=m, severity="error" if m in ("loss", "grad_norm") else "warning",
            first_step=first, last_step=last, ranks=ranks,
            hosts=facts.hosts_of(ranks, set(rows["attempt"].to_list())), score=float(n),
            message=(f"{reg.label(m)} first went {kinds} at step {first} on {who} ({text.counted(n, 'non-finite value')} "
                     f"over {steps_range(first, last)}): look at {whose} batch and the update before it."),
        ))
    return out


def _maybe_nonfinite(path: str) -> set[str] | None:
    """The float columns ranks.parquet's writer found may hold NaN/inf; None: it did not say."""
    raw = (pl.read_parquet_metadata(path) or {}).get(RANKS_NONFINITE_KEY)
    if raw is None:
        return None
    try:
        names = json.loads(raw)
    except ValueError:
        return None
    return set(names) if isinstance(names, list) else None


def _kinds(lf: pl.LazyFrame, metric: str, step: int, ranks) -> str:
    vals = (lf.filter((pl.col("step") == step) & pl.col("rank").is_in(list(ranks))).select(metric).collect()[metric])
    names = sorted({"NaN" if v != v else ("+inf" if v > 0 else "-inf") for v in vals.to_list() if v is not None})
    return "/".join(names) or "non-finite"
