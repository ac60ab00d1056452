"""summary.json of one ingested run (keys in docs/CONTRACT.md)."""

from __future__ import annotations

import datetime as _dt
import json
import os
from dataclasses import dataclass

import polars as pl

from kforge_dash.contract import EMA_METRICS, OUTPUT_SCHEMA_VERSION
from kforge_dash.ingest.inputs.launches import lead_meta, start_of, world_size_of
from kforge_dash.ingest.lineage.restarts import launch_timeline, with_rollbacks


@dataclass(frozen=True)
class SummaryInput:
    """What summary.json is made from."""

    run_dir: str
    steps: pl.DataFrame  # steps.parquet as written
    launches: list  # launches.Launch
    flops: dict  # launch index -> launches.launch_flops() of each launch with parts
    first_ended: dict  # launch -> lowest ended step (None: none)
    last_ended: dict  # launch -> highest ended step
    ranks: list[int]
    attempts: list  # shards.Attempt
    alpha: float
    warnings: list[str]  # the run's warnings so far; build_summary adds its own and keeps the list
    input_digest: str  # written as "fingerprint" (docs/CONTRACT.md)
    rollbacks: tuple = ()  # "restarts" entries of in-process rollbacks (rollbacks.py)


def build_summary(inp: SummaryInput) -> dict:
    """summary.json's content (docs/CONTRACT.md, "Ingested outputs")."""
    live = [launch for launch in inp.launches if launch.parts()]
    cur = live[-1]
    _warn_mixed_launches(live, inp.flops, inp.warnings)
    dropped_rows = _dropped_rows(inp.attempts)
    if dropped_rows:
        inp.warnings.append(f"the recorder dropped {dropped_rows} row(s): disk errors, a stuck writer, values it could not "
                            "convert or refused steps (end.json's dropped_rows_by_reason says which)")
    meta = lead_meta(cur)
    timeline = launch_timeline(inp.launches, inp.first_ended, inp.last_ended, inp.warnings)
    return {
        "schema_version": OUTPUT_SCHEMA_VERSION,
        # The folder's name, not meta.json's: a run folder renamed after recording is its new name.
        "run_name": os.path.basename(os.path.abspath(inp.run_dir)),
        "ingested_at": _dt.datetime.now(_dt.timezone.utc).isoformat(),
        "world_size": world_size_of(cur),
        "ranks": inp.ranks,
        "attempts": _attempt_entries(inp, timeline.reach),
        "restarts": with_rollbacks(timeline.restarts, list(inp.rollbacks)),
        "unrecorded": timeline.unrecorded,
        "overlaps": timeline.overlaps,
        **_step_figures(inp.steps),
        **_flops_entries(inp.flops[cur.index]),
        "alpha": inp.alpha,
        "hparams": meta.get("hparams"),
        "hparams_changed": _hparams_changed(live),
        "tags": meta.get("tags"),
        "nonfinite": _nonfinite_counts(inp.steps),
        "dropped_rows": dropped_rows,
        "warnings": inp.warnings,
        "exports": None,
        "fingerprint": inp.input_digest,
    }


def _hparams_changed(live: list) -> dict[str, list]:
    """{hparam: its value in each launch, in launch order} for the hparams a resume changed (absent: null);
    {} when every launch had the same. summary.json's `hparams` is the last launch's."""
    hps = [lead_meta(launch).get("hparams") or {} for launch in live]
    hps = [h if isinstance(h, dict) else {} for h in hps]
    out = {}
    for k in sorted({k for h in hps for k in h}):
        vals = [h.get(k) for h in hps]
        if len({json.dumps(v, sort_keys=True, default=str) for v in vals}) > 1:
            out[k] = vals
    return out


def _warn_mixed_launches(live: list, flops: dict, warnings: list[str]) -> None:
    for key, what in (("flops_per_token", "FLOPs per token"), ("peak_tflops", "peak TFLOPS per GPU")):
        vals = [flops[launch.index][key] for launch in live]
        if len(set(vals)) > 1:
            # Read by a person (dashboard, report): each launch's value to 4 significant digits, in launch order.
            shown = " -> ".join("none" if v is None else f"{v:.4g}" for v in vals)
            warnings.append(f"{what} ({key}) differs between attempts ({shown}); MFU uses each attempt's own")
    sizes = [world_size_of(launch) for launch in live]
    if len(set(sizes)) > 1:
        warnings.append(f"world size changed across attempts ({' -> '.join(map(str, sizes))}); MFU uses each attempt's own")


def _dropped_rows(attempts: list) -> int | None:
    """Rows the recorder dropped, over every attempt: end.json's total, else the last part's."""
    dropped = []
    for a in attempts:
        if a.end is not None and a.end.get("dropped_rows_total") is not None:
            dropped.append(int(a.end["dropped_rows_total"]))
        else:
            known = [p.dropped_rows_total for p in a.parts if p.dropped_rows_total is not None]
            if known:
                dropped.append(max(known))
    return sum(dropped) if dropped else None


def _nonfinite_counts(steps: pl.DataFrame) -> dict[str, int]:
    nonfinite = {}
    for c, dt in steps.schema.items():
        if dt == pl.Float64 and not c.endswith("_ema"):
            n = int(steps[c].drop_nulls().is_finite().not_().sum())
            if n or c in EMA_METRICS:
                nonfinite[c] = n
    return nonfinite


def _attempt_entries(inp: SummaryInput, reach: dict) -> list[dict]:
    return [{
        "attempt": launch.index,
        "attempt_ids": sorted({a.attempt_id for a in launch.attempts}),
        "start_time": start_of(launch),
        "first_step": inp.first_ended[launch.index],
        "last_step": inp.last_ended[launch.index],
        "reached_step": reach[launch.index].reached,
        "world_size": world_size_of(launch),
    } for launch in inp.launches]


def _step_figures(steps: pl.DataFrame) -> dict:
    """The run's figures from its steps: counts, totals, means, losses, peak memory."""
    both = steps.filter(pl.col("tokens").is_not_null() & pl.col("step_time_s").is_not_null())
    t_both = both["step_time_s"].sum() if both.height else None
    mfu_ok = steps.filter(pl.col("mfu").is_finite() & pl.col("step_time_s").is_not_null())
    loss = steps["loss"].drop_nulls()
    finite_loss = loss.filter(loss.is_finite())
    return {
        "steps": steps.height,
        "first_step": steps["step"].min(),
        "last_step": steps["step"].max(),
        "tokens": steps["tokens"].sum() if steps["tokens"].null_count() < steps.height else None,
        # Training wall time: the sum of per-step times of the kept steps (restart downtime excluded).
        "wall_time_s": steps["step_time_s"].sum() if steps["step_time_s"].null_count() < steps.height else None,
        "mean_tokens_per_sec": both["tokens"].sum() / t_both if t_both else None,
        # Time-weighted, so a long slow step counts for its duration.
        "mean_mfu": ((mfu_ok["mfu"] * mfu_ok["step_time_s"]).sum() / mfu_ok["step_time_s"].sum()
                     if mfu_ok.height and mfu_ok["step_time_s"].sum() else None),
        "final_loss": loss[-1] if loss.len() else None,  # NaN stays NaN: a diverged run must show it
        "best_loss": finite_loss.min() if finite_loss.len() else None,
        "peak_mem_bytes": steps["mem_peak_bytes"].max(),
    }


def _flops_entries(info: dict) -> dict:
    return {k: info[k] for k in ("device", "model", "flops_per_token", "flops_source", "peak_tflops", "peak_source")}
