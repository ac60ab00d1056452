"""What both exporters read: RUN/ingested/{steps,ranks}.parquet and summary.json, as tags.

One table, one tag per column, shared by TensorBoard and W&B so a metric has the same name in
both UIs (and in the dashboard). The mapping from steps.parquet columns (docs/CONTRACT.md) to tags:

    loss, grad_norm, lr, tokens, tokens_per_sec, mfu,
    step_time_s, step_work_s, step_work_min_s,
    step_work_median_s                                 ->  1_train/<column> (TRAIN_GROUP)
    <metric>_ema                                       ->  smoothed/<metric>_ema
    mem_allocated_bytes / mem_peak_bytes / mem_reserved_bytes
                                                       ->  gpu/mem_allocated_gib ... (GiB, 2**30 bytes:
                                                           the unit torch.cuda.memory_summary uses, and
                                                           TensorBoard stores float32, which would round
                                                           80e9 bytes to 4 KiB steps anyway)
    slowest_rank, n_ranks                              ->  ranks/slowest_rank, ranks/n_ranks
    attempt                                            ->  run/attempt (a step in the plot marks a restart)
    time/<phase>_s, user scalars (eval/loss ...)       ->  their own names
    ranks.parquet step_time_s of rank r                ->  ranks/step_time_s/<r:05d> (only when the run
                                                           has at most `max_rank_tags` ranks, 64 by default)

Null is "no point": the value is simply absent. NaN and inf are kept as they are.
polars stays lazy: one scan per file, expressions, one collect.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import polars as pl

from kforge_dash.contract import EMA_COLUMNS, RANKS_FILE, STEPS_FILE, SUMMARY_FILE, ingested_dir, read_summary_file

GIB = float(2**30)
# The training metrics' group. TensorBoard sorts its groups by name, digits before letters, and opens the
# first two: "1_train" comes first, before "eval", "gpu", "hw", "ranks", "run", "smoothed", "time" and a
# user's own groups (docs/exports.md: the first screen is the training metrics). W&B shows the same names.
TRAIN_GROUP = "1_train"

_TRAIN = ("loss", "grad_norm", "lr", "tokens", "tokens_per_sec", "mfu",
          "step_time_s", "step_work_s", "step_work_min_s", "step_work_median_s")
_EMA = EMA_COLUMNS
_MEM = {"mem_allocated_bytes": "gpu/mem_allocated_gib", "mem_peak_bytes": "gpu/mem_peak_gib",
        "mem_reserved_bytes": "gpu/mem_reserved_gib"}
_OTHER = {"slowest_rank": "ranks/slowest_rank", "n_ranks": "ranks/n_ranks", "attempt": "run/attempt"}
_KEYS = ("step", "time")


class ExportInputError(ValueError):
    """An ingested output that export cannot use; the message names the file and the problem."""


def tag_for_column(name: str) -> str:
    """The TensorBoard/W&B tag of a steps.parquet column (see the module doc)."""
    if name in _TRAIN:
        return f"{TRAIN_GROUP}/{name}"
    if name in _EMA:
        return f"smoothed/{name}"
    if name in _MEM:
        return _MEM[name]
    if name in _OTHER:
        return _OTHER[name]
    return name  # phases (time/<phase>_s) and user scalars keep their own names


def rank_tag(rank: int) -> str:
    return f"ranks/step_time_s/{rank:05d}"


@dataclass(frozen=True)
class History:
    """The run's exported history: one row per step; values None where null."""

    run_dir: str
    summary: dict
    frame: pl.DataFrame  # columns: step, time, then one Float64 column per tag, named by the tag
    tags: tuple[str, ...]  # per-step metrics, in column order
    rank_tags: tuple[str, ...]  # per-rank step times (empty when the run has too many ranks)
    columns: tuple[str, ...] = ()  # the steps.parquet column of each of `tags` (its column_registry words)

    @property
    def n_steps(self) -> int:
        return self.frame.height

    def rows(self, *, with_ranks: bool = True, chunk_rows: int = 8192) -> Iterator[tuple]:
        """(step, time, value...) tuples, converted a chunk at a time to bound memory on long runs."""
        frame = self.frame if with_ranks else self.frame.select(*_KEYS, *self.tags)
        for chunk in frame.iter_slices(n_rows=chunk_rows):
            yield from chunk.iter_rows()

    def nonfinite_counts(self) -> dict[str, int]:
        """{tag: number of NaN/inf values} for the per-step tags that have any (nulls do not count)."""
        if not self.tags:
            return {}
        counts = self.frame.select(
            [(pl.col(t).is_not_null() & ~pl.col(t).is_finite()).sum().alias(t) for t in self.tags]
        ).row(0, named=True)
        return {t: int(n) for t, n in counts.items() if n}


def read_summary(run_dir: str | os.PathLike) -> dict:
    try:
        return read_summary_file(os.path.join(ingested_dir(run_dir), SUMMARY_FILE))
    except ValueError as e:
        raise ExportInputError(str(e)) from None


def load_history(run_dir: str | os.PathLike, *, max_rank_tags: int = 64) -> History:
    """Read the ingested outputs of one run into a History. Raises ExportInputError on bad input."""
    run_dir = os.fspath(run_dir)
    summary = read_summary(run_dir)
    steps_path = os.path.join(ingested_dir(run_dir), STEPS_FILE)
    ranks_path = os.path.join(ingested_dir(run_dir), RANKS_FILE)
    steps = _scan(steps_path)
    schema = _schema(steps, steps_path)
    for key in _KEYS:
        if key not in schema:
            raise ExportInputError(f"{steps_path}: missing column {key!r} (see docs/CONTRACT.md)")
    exprs, tags, columns = [pl.col("step").cast(pl.Int64), pl.col("time").cast(pl.Float64)], [], []
    # kforge's own tags come first; a user scalar already named like one of them ("1_train/loss",
    # a common W&B-style name) is exported as user/<name> instead of failing the whole export.
    ours = {tag_for_column(n) for n in schema if tag_for_column(n) != n}
    for name, dtype in schema.items():
        if name in _KEYS:
            continue
        if not (dtype.is_numeric() or dtype == pl.Boolean):
            continue  # a text column is not a scalar: nothing to plot
        tag = tag_for_column(name)
        if tag == name and name in ours:
            tag = f"user/{name}"
            warnings.warn(f"{steps_path}: user scalar {name!r} is named like a kforge tag; exported as {tag!r}",
                          RuntimeWarning, stacklevel=2)
        if tag in tags or tag in _KEYS:
            raise ExportInputError(f"{steps_path}: column {name!r} maps to tag {tag!r}, which another column already uses")
        x = pl.col(name).cast(pl.Float64)
        exprs.append((x / GIB if name in _MEM else x).alias(tag))
        tags.append(tag)
        columns.append(name)
    lf = steps.select(exprs)

    ranks = summary.get("ranks") or []
    rank_tags: list[str] = []
    if ranks and len(ranks) <= max_rank_tags:
        rk = _scan(ranks_path)
        rschema = _schema(rk, ranks_path)
        missing = [c for c in ("step", "rank", "step_time_s") if c not in rschema]
        if missing:
            raise ExportInputError(f"{ranks_path}: missing column(s) {', '.join(missing)} (see docs/CONTRACT.md)")
        ranks = sorted(int(r) for r in ranks)
        wide = (
            rk.select(pl.col("step").cast(pl.Int64), pl.col("rank").cast(pl.Int64), pl.col("step_time_s").cast(pl.Float64))
            .filter(pl.col("rank").is_in(ranks))
            .pivot(on="rank", on_columns=ranks, index="step", values="step_time_s", aggregate_function="first")
        )
        rank_tags = [rank_tag(r) for r in ranks]
        wide = wide.rename({str(r): t for r, t in zip(ranks, rank_tags)})
        lf = lf.join(wide, on="step", how="left", maintain_order="left")
    try:
        frame = lf.collect()
    except Exception as e:  # a corrupt or truncated file: name it, do not crash the whole ingest
        raise ExportInputError(f"{steps_path} / {ranks_path}: cannot read: {e}") from None

    _check_steps(frame, steps_path)
    return History(run_dir=run_dir, summary=summary, frame=frame, tags=tuple(tags), rank_tags=tuple(rank_tags),
                   columns=tuple(columns))


def _scan(path: str) -> pl.LazyFrame:
    if not os.path.isfile(path):
        raise ExportInputError(f"{path}: not found; run kforge-ingest on the run first")
    return pl.scan_parquet(path, glob=False)  # a run directory may be named like a pattern (sweep[lr=3e-4])


def _schema(lf: pl.LazyFrame, path: str) -> pl.Schema:
    try:
        return lf.collect_schema()
    except Exception as e:
        raise ExportInputError(f"{path}: not a readable Parquet file: {e}") from None


def _check_steps(frame: pl.DataFrame, path: str) -> None:
    """Both UIs need one point per step, in order, at a real time: refuse anything else, loudly."""
    if frame.height == 0:
        return
    bad = frame.select(
        null_step=pl.col("step").is_null().any(),
        null_time=pl.col("time").is_null().any() | (~pl.col("time").is_finite()).any(),
        unordered=(pl.col("step").diff() <= 0).any(),
    ).row(0, named=True)
    if bad["null_step"]:
        raise ExportInputError(f"{path}: column 'step' has nulls")
    if bad["null_time"]:
        raise ExportInputError(f"{path}: column 'time' has null or non-finite values")
    if bad["unordered"]:
        at = frame.filter(pl.col("step").diff() <= 0)["step"][0]
        raise ExportInputError(f"{path}: steps are not strictly increasing (at step {at}); re-run kforge-ingest")


