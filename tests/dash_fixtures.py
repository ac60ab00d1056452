"""Synthetic ingested runs written per docs/CONTRACT.md, for unit tests of the dashboard's prep.

The app and browser tests use the real sample_runs/ ingested by kforge_dash.ingest.run; these
fixtures exist so prep functions can be tested on exactly known values (spikes, NaN, restarts).
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import numpy as np
import polars as pl

PHASES = ("data", "fwd_bwd", "optimizer")


def synthetic_steps(n: int, *, seed: int = 0, world_size: int = 4, t0: float = 1.7e9,
                    tokens_per_rank: int = 4096, restart_at: int | None = None,
                    nan_steps=(), slow_rank: int | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(steps, ranks) frames with the contract's columns. Loss decays with noise; `nan_steps`
    get NaN loss; `slow_rank` is 1.5x slower on every step."""
    rng = np.random.default_rng(seed)
    step = np.arange(1, n + 1, dtype=np.int64)
    rank_times = 0.1 + 0.01 * rng.random((n, world_size))
    if slow_rank is not None:
        rank_times[:, slow_rank] *= 1.5
    step_time = rank_times.max(axis=1)
    time = t0 + np.cumsum(step_time)
    attempt = np.zeros(n, dtype=np.int64)
    if restart_at is not None:
        attempt[step >= restart_at] = 1
        time[step >= restart_at] += 60.0  # a minute of downtime
    tokens = np.full(n, tokens_per_rank * world_size, dtype=np.int64)
    loss = 3.0 * np.exp(-step / max(n / 3, 1)) + 1.0 + 0.01 * rng.standard_normal(n)
    for s in nan_steps:
        loss[s - 1] = np.nan
    phases = {p: rank_times[:, 0] * f for p, f in zip(PHASES, (0.1, 0.8, 0.1))}
    steps = pl.DataFrame({
        "step": step, "time": time, "step_time_s": step_time,
        "step_work_s": rank_times.max(axis=1),
        "step_work_min_s": rank_times.min(axis=1), "step_work_median_s": np.median(rank_times, axis=1),
        "slowest_rank": rank_times.argmax(axis=1).astype(np.int64),
        "n_ranks": np.full(n, world_size, dtype=np.int64), "attempt": attempt,
        "tokens": tokens, "tokens_per_sec": tokens / step_time, "mfu": 0.4 * 0.1 / step_time,
        "loss": loss, "grad_norm": 1.0 + 0.1 * rng.random(n), "lr": np.full(n, 3e-4),
        "mem_allocated_bytes": np.full(n, 2**30, dtype=np.int64),
        "mem_peak_bytes": np.full(n, 2**31, dtype=np.int64),
        "mem_reserved_bytes": np.full(n, 3 * 2**30, dtype=np.int64),
        **{f"time/{p}_s": v for p, v in phases.items()},
    })
    steps = steps.with_columns(
        pl.when(pl.col("step") % 10 == 0).then(pl.col("loss") + 0.1).alias("eval/loss"),
        *[pl.col(m).alias(f"{m}_ema") for m in ("loss", "tokens_per_sec", "mfu", "step_time_s")],
    )
    ranks = pl.DataFrame({
        "step": np.repeat(step, world_size), "rank": np.tile(np.arange(world_size, dtype=np.int64), n),
        "attempt": np.repeat(attempt, world_size), "time": np.repeat(time, world_size),
        "step_time_s": rank_times.reshape(-1), "loss": np.repeat(loss, world_size),
        "tokens": np.full(n * world_size, tokens_per_rank, dtype=np.int64),
        "mem_peak_bytes": (2**31 + np.tile(np.arange(world_size, dtype=np.int64), n) * 2**20),
        **{f"time/{p}_s": np.repeat(v, world_size) for p, v in phases.items()},
    })
    return steps, ranks


def write_run(root: str | os.PathLike, name: str, *, n: int = 1000, hparams=None, tags=(),
              world_size: int = 4, restart_at: int | None = None, nan_steps=(), slow_rank=None,
              seed: int = 0, with_ranks: bool = True, **summary_extra) -> Path:
    """Write RUN/ingested/{steps,ranks}.parquet + summary.json; returns the run directory."""
    run = Path(root) / name
    out = run / "ingested"
    out.mkdir(parents=True, exist_ok=True)
    steps, ranks = synthetic_steps(n, seed=seed, world_size=world_size, restart_at=restart_at,
                                   nan_steps=nan_steps, slow_rank=slow_rank)
    steps.write_parquet(out / "steps.parquet")
    if with_ranks:
        ranks.write_parquet(out / "ranks.parquet")
    finite = steps.filter(pl.col("loss").is_not_nan())["loss"]
    start = float(steps["time"][0] - steps["step_time_s"][0])
    attempts = [{"attempt": 0, "attempt_ids": ["a0"], "start_time": start, "first_step": 1,
                 "last_step": (restart_at - 1) if restart_at else n, "world_size": world_size}]
    restarts = []
    if restart_at:
        attempts.append({"attempt": 1, "attempt_ids": ["a1"], "start_time": start + 100.0,
                         "first_step": restart_at, "last_step": n, "world_size": world_size})
        restarts.append({"attempt": 1, "resumed_at_step": restart_at, "previous_last_step": restart_at + 5,
                         "superseded_steps": 6, "time": start + 100.0})
    summary = {
        "schema_version": "1.0", "run_name": name, "ingested_at": "2026-01-01T00:00:00Z",
        "steps": n, "first_step": 1, "last_step": n, "world_size": world_size,
        "ranks": list(range(world_size)), "attempts": attempts, "restarts": restarts,
        "tokens": int(steps["tokens"].sum()), "wall_time_s": float(steps["time"][-1] - start),
        "mean_tokens_per_sec": float(steps["tokens_per_sec"].mean()), "mean_mfu": float(steps["mfu"].mean()),
        "final_loss": float(steps["loss"][-1]), "best_loss": float(finite.min()),
        "peak_mem_bytes": 2**31 + (world_size - 1) * 2**20,
        "device": {"name": "NVIDIA H100 80GB HBM3", "type": "cuda", "total_memory_bytes": 80 * 2**30},
        "model": {"n_params": 124_000_000}, "flops_per_token": 6 * 124e6, "flops_source": "n_params",
        "peak_tflops": 989.0, "peak_source": "table", "alpha": 0.1, "hparams": hparams or {},
        "tags": list(tags), "nonfinite": {"loss": len(nan_steps)} if nan_steps else {},
        "dropped_rows": 0, "warnings": [], "exports": {},
    }
    # What ingest decided (summary.json findings_options, phases): the default thresholds, as ingest records them.
    from kforge_dash.findings.finding import classify_phases
    from kforge_dash.findings.thresholds import FindingsOptions

    summary["findings_options"] = FindingsOptions().to_dict()
    summary["phases"] = classify_phases(steps.columns, FindingsOptions()).to_dict()
    summary.update(summary_extra)
    (out / "summary.json").write_text(json.dumps(summary))
    return run


def write_shards_only(root, name: str) -> Path:
    """A run with a shard folder and no ingest yet (only its layout matters to the dashboard)."""
    d = Path(root) / name / "rank-00000" / "20260101T000000Z-0"
    d.mkdir(parents=True)
    (d / "meta.json").write_text(json.dumps({"schema_version": "1.0", "run_name": name}))
    return d.parent.parent


SAMPLE_RUNS = Path(__file__).resolve().parent.parent / "sample_runs"


def sample_run_names() -> list[str]:
    """The recorded runs bundled in sample_runs/ (directories holding rank-NNNNN/ folders).

    Never empty: the tests over them must fail, not skip, when the bundle is missing."""
    names = sorted(p.name for p in SAMPLE_RUNS.iterdir() if p.is_dir() and any(p.glob("rank-*"))) \
        if SAMPLE_RUNS.is_dir() else []
    assert names, f"{SAMPLE_RUNS} holds no recorded runs (python examples/make_sample_runs.py makes them)"
    return names


def ingest_sample_run(run_dir: Path):
    """ingest_run of a copy of a sample run. The preempted run's two launches each measured the machine's
    peak (examples/train_tiny.py) and got two values, which ingest rightly says: a fact of the bundled
    data, not of the code a dashboard test is about, so that one warning is left out here."""
    from kforge_dash.ingest import run as ingest

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*\(peak_tflops\) differs between attempts", category=ingest.IngestWarning)
        return ingest.ingest_run(run_dir)


def copy_and_ingest_sample_runs(dst: Path) -> Path:
    """Copy the repo's sample_runs/ to `dst` and ingest every run there (no TB/W&B exports)."""
    shutil.copytree(SAMPLE_RUNS, dst, ignore=shutil.ignore_patterns("ingested"))
    for name in sample_run_names():
        ingest_sample_run(dst / name)
    return dst


def shown(markdown: str) -> str:
    """The text a Markdown body shows: the page escapes names from disk with backslashes (text.md_text)."""
    import re

    return re.sub(r"\\(.)", r"\1", markdown)


def lab(colour: str):
    """CIELAB (D65) of a #rrggbb colour: distances there are distances the eye sees."""
    c = [int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    c = [v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4 for v in c]
    xyz = [sum(m * v for m, v in zip(row, c)) / w for row, w in zip(
        ((0.4124, 0.3576, 0.1805), (0.2126, 0.7152, 0.0722), (0.0193, 0.1192, 0.9505)), (0.95047, 1.0, 1.08883))]
    f = [v ** (1 / 3) if v > 0.008856 else 7.787 * v + 16 / 116 for v in xyz]
    return 116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])


def detail_page(root, monkeypatch, run: str):
    """Streamlit's AppTest of the run detail page of ``run`` under ``root`` (as /detail?run=RUN)."""
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("KFORGE_DASH_ROOT", str(root))
    at = AppTest.from_file(str(Path(__file__).resolve().parent.parent / "kforge_dash" / "browse" / "app.py"),
                           default_timeout=300)
    at.query_params["run"] = run
    at.run()
    return at.switch_page("views/run_detail.py").run()
