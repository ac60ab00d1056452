"""summary.json of one ingested run (keys in docs/CONTRACT.md)."""

from __future__ import annotations

import datetime as _dt
import os

import polars as pl

from kforge_dash.contract import EMA_METRICS, OUTPUT_SCHEMA_VERSION
from kforge_dash.ingest.launches import lead_meta, start_of, world_size_of


def build_summary(run_dir, steps: pl.DataFrame, launches, first, last, ranks, attempts, opts, warnings, fp) -> dict:
    live = [L for L in launches if L.parts()]
    cur = live[-1]
    info = cur.flops
    meta = lead_meta(cur)
    for key in ("flops_per_token", "peak_tflops"):
        vals = {L.flops[key] for L in live}
        if len(vals) > 1:
            warnings.append(f"{key} differs between attempts ({sorted(vals, key=str)}); MFU uses each attempt's own")
    sizes = [world_size_of(L) for L in live]
    if len(set(sizes)) > 1:
        warnings.append(f"world size changed across attempts ({' -> '.join(map(str, sizes))}); MFU uses each attempt's own")

    both = steps.filter(pl.col("tokens").is_not_null() & pl.col("step_time_s").is_not_null())
    t_both = both["step_time_s"].sum() if both.height else None
    mfu_ok = steps.filter(pl.col("mfu").is_finite() & pl.col("step_time_s").is_not_null())
    loss = steps["loss"].drop_nulls()
    finite_loss = loss.filter(loss.is_finite())
    nonfinite = {}
    for c, dt in steps.schema.items():
        if dt == pl.Float64 and not c.endswith("_ema"):
            n = int(steps[c].drop_nulls().is_finite().not_().sum())
            if n or c in EMA_METRICS:
                nonfinite[c] = n
    dropped = []
    for a in attempts:
        if a.end is not None and a.end.get("dropped_rows_total") is not None:
            dropped.append(int(a.end["dropped_rows_total"]))
        else:
            known = [p.dropped_rows_total for p in a.parts if p.dropped_rows_total is not None]
            if known:
                dropped.append(max(known))
    dropped_rows = sum(dropped) if dropped else None
    if dropped_rows:
        warnings.append(f"the recorder dropped {dropped_rows} row(s) on disk errors (see end.json / part metadata)")
    peak_mem = steps["mem_peak_bytes"].max()

    restarts = []
    prev_last = None
    for L in launches:
        if L.index and first[L.index] is not None and prev_last is not None:
            restarts.append({
                "attempt": L.index,
                "resumed_at_step": first[L.index],
                "previous_last_step": prev_last,
                # step numbers the earlier attempt(s) had reached and this one redid
                "superseded_steps": max(0, prev_last - first[L.index] + 1),
                "time": start_of(L),
            })
        if last[L.index] is not None:
            prev_last = last[L.index] if prev_last is None else max(prev_last, last[L.index])
    return {
        "schema_version": OUTPUT_SCHEMA_VERSION,
        "run_name": meta.get("run_name") or os.path.basename(run_dir),
        "ingested_at": _dt.datetime.now(_dt.timezone.utc).isoformat(),
        "steps": steps.height,
        "first_step": steps["step"].min(),
        "last_step": steps["step"].max(),
        "world_size": world_size_of(cur),
        "ranks": ranks,
        "attempts": [{
            "attempt": L.index,
            "attempt_ids": sorted({a.attempt_id for a in L.attempts}),
            "start_time": start_of(L),
            "first_step": first[L.index],
            "last_step": last[L.index],
            "world_size": world_size_of(L),
        } for L in launches],
        "restarts": restarts,
        "tokens": steps["tokens"].sum() if steps["tokens"].null_count() < steps.height else None,
        # Training wall time: the sum of per-step times of the kept steps (restart downtime excluded).
        "wall_time_s": steps["step_time_s"].sum() if steps["step_time_s"].null_count() < steps.height else None,
        "mean_tokens_per_sec": both["tokens"].sum() / t_both if t_both else None,
        # Time-weighted, so a long slow step counts for its duration.
        "mean_mfu": ((mfu_ok["mfu"] * mfu_ok["step_time_s"]).sum() / mfu_ok["step_time_s"].sum()
                     if mfu_ok.height and mfu_ok["step_time_s"].sum() else None),
        "final_loss": loss[-1] if loss.len() else None,  # NaN stays NaN: a diverged run must show it
        "best_loss": finite_loss.min() if finite_loss.len() else None,
        "peak_mem_bytes": peak_mem,
        "device": info["device"],
        "model": info["model"],
        "flops_per_token": info["flops_per_token"],
        "flops_source": info["flops_source"],
        "peak_tflops": info["peak_tflops"],
        "peak_source": info["peak_source"],
        "alpha": opts.alpha,
        "hparams": meta.get("hparams"),
        "tags": meta.get("tags"),
        "nonfinite": nonfinite,
        "dropped_rows": dropped_rows,
        "warnings": warnings,
        "exports": None,
        "fingerprint": fp,
    }


# -- many runs, and the exports that follow an ingest ----------------------------------------
