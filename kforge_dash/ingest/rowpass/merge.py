"""Merging the rows kept by the last ingest with a new part file's rows (an append, docs/CONTRACT.md)."""

from __future__ import annotations

import polars as pl


class AppendConflict(Exception):
    """The new rows cannot be merged into the old outputs exactly; ingest the run from scratch."""


def merge_old(old: pl.DataFrame, new: pl.DataFrame, scalars: list[str]) -> pl.DataFrame:
    """Old kept rows and new raw rows of one window, in the order a full ingest reads them:
    attempt by attempt, rank by rank, each rank's old rows before its new ones."""
    ended = pl.col("step_time_s").is_not_null()
    old_end = old.filter(ended)
    if new.filter(ended).select("rank", "step").join(old_end.select("rank", "step"), on=["rank", "step"],
                                                       how="semi").height:
        raise AppendConflict("a step ended again in a new part file")
    logs = new.filter(~ended)
    if logs.height and scalars:
        both = logs.select("rank", "step", *scalars).join(
            old_end.select("rank", "step", *scalars), on=["rank", "step"], how="inner", suffix="__old")
        if both.height and both.select(pl.any_horizontal(
                [pl.col(c).is_not_null() & pl.col(f"{c}__old").is_not_null() for c in scalars]).any()).item():
            raise AppendConflict("a scalar logged again for a step whose row already holds one")
    return pl.concat([old, new], how="vertical").sort(["attempt", "rank"], maintain_order=True)
