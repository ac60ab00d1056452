"""Where the MFU went: from the peak (1.0) down to the job's achieved MFU, in shares of the wall clock.

``achieved`` = the FLOPs done over (the whole wall clock x peak FLOP/s x GPUs): the sum over kept
steps of ``mfu x step_time_s`` (each step's FLOPs over its launch's peak and world size), over
goodput's ``total_s``. Each goodput badput bucket is its share of the wall clock (no FLOPs counted
there), and ``below_peak`` = productive share x (1 - MFU while productive), where MFU while
productive = FLOPs done over (productive time x peak x GPUs). So ``sum(buckets) + below_peak +
achieved`` = ``productive + buckets`` = 1 (to float rounding; ``below_peak`` is computed as what
is left). Null when no step has an MFU (FLOPs per token or the peak unknown) or no goodput; also
null, with a warning, when the FLOPs done exceed the peak over the productive time (a wrong peak).
"""

from __future__ import annotations

import polars as pl

from kforge_dash.findings.finding import RunFacts


def mfu_waterfall(facts: RunFacts, good: dict | None, warnings: list[str]) -> dict | None:
    if not isinstance(good, dict) or not good.get("total_s") or "mfu" not in facts.steps.columns:
        return None
    ok = facts.steps.filter(pl.col("mfu").is_finite() & pl.col("step_time_s").is_finite())
    if ok.height == 0:
        return None
    total = float(good["total_s"])
    achieved = float(ok.select((pl.col("mfu") * pl.col("step_time_s")).sum()).item()) / total
    shares = {k: float(v) / total for k, v in (good.get("buckets") or {}).items()}
    productive = float(good.get("productive_s") or 0.0) / total
    if achieved > productive + 1e-9:
        warnings.append(f"mfu_waterfall: the FLOPs done exceed the peak over the productive time (MFU while productive "
                        f"{achieved / productive if productive else float('inf'):.2f} > 1): is peak_tflops too low? "
                        "No MFU waterfall")
        return None
    below = 1.0 - sum(shares.values()) - achieved
    return {"peak": 1.0, "parts": {**shares, "below_peak": below, "achieved": achieved},
            "productive_mfu": achieved / productive if productive else None}
