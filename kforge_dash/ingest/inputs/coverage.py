"""Which rows of a merged part file the last ingest already read.

The recorder merges a rank's part files as the run goes (kforge_record/compact.py): flushes
A..B, once part-A ... part-B, become part-A-B (docs/CONTRACT.md, "Shards"). For an append that
is no change to the run: a part the last ingest read and that is gone now is fine when a listed
part holds its flushes, and a merged part the last ingest did not see holds, first, the rows of
the flushes it did read (a prefix: parts are written in flush order), then new rows. Its
key-value metadata (``flush_rows``) says how many rows each flush has, so the append reads only
the rows after that prefix (``PartToRead.skip_rows``). Anything else (the last ingest read flushes
that are not a prefix, or a part it could not decode) gives None: a full ingest.
"""

from __future__ import annotations

import bisect
import json
import os
from dataclasses import dataclass, replace

import pyarrow.compute as pc
import pyarrow.parquet as pq

from kforge_dash.ingest.inputs.parquet_io import read_columns
from kforge_dash.ingest.inputs.read import PartToRead
from kforge_record.regular_file import check_regular_file
from kforge_record.schema import PARQUET_META_KEY, PartSpan, part_span


@dataclass(frozen=True)
class _Spans:
    """The part spans of one attempt folder, sorted by first flush."""

    firsts: list[int]
    spans: list[PartSpan]
    bad: list[bool]


def _by_folder(items) -> dict[str, _Spans]:
    """(rel path, bad) pairs -> the spans of each attempt folder; names without a span are left out."""
    grouped: dict[str, list] = {}
    for rel, bad in items:
        folder, name = os.path.split(rel)
        span = part_span(name)
        if span is not None:
            grouped.setdefault(folder, []).append((span.first, span.last, bad))
    out = {}
    for folder, rows in grouped.items():
        rows.sort()
        out[folder] = _Spans([r[0] for r in rows], [PartSpan(r[0], r[1]) for r in rows], [r[2] for r in rows])
    return out


class Coverage:
    """The flushes the last ingest read (its manifest) against the part files listed now."""

    def __init__(self, prior_parts: dict, listed_rels):
        self.prior = _by_folder((rel, e.bad is not None) for rel, e in prior_parts.items())
        self.listed = _by_folder((rel, False) for rel in listed_rels)

    def replaced(self, rel: str) -> bool:
        """True when ``rel`` (read by the last ingest, gone now) is held by a listed merged part."""
        folder, name = os.path.split(rel)
        span, spans = part_span(name), self.listed.get(folder)
        if span is None or spans is None:
            return False
        i = bisect.bisect_right(spans.firsts, span.first) - 1
        return i >= 0 and spans.spans[i].last >= span.last

    def flushes_read(self, rel: str) -> int | None:
        """How many leading flushes of the listed part ``rel`` (not in the manifest) the last
        ingest read: 0 for a new part; None when what it read of them is not a clean prefix."""
        folder, name = os.path.split(rel)
        span, spans = part_span(name), self.prior.get(folder)
        if span is None or spans is None:
            return 0
        i = bisect.bisect_left(spans.firsts, span.first)
        if i > 0 and spans.spans[i - 1].last >= span.first:
            return None  # a part read last time straddles this one's start
        expect = span.first
        while i < len(spans.spans) and spans.firsts[i] <= span.last:
            if spans.firsts[i] != expect or spans.spans[i].last > span.last or spans.bad[i]:
                return None
            expect = spans.spans[i].last + 1
            i += 1
        return expect - span.first


def unread_tail(f: PartToRead, flushes: int) -> PartToRead | None:
    """``f`` less the rows of its part's first ``flushes`` flushes (``flush_rows`` in its metadata):
    ``skip_rows`` set, the part's step range and row kinds those of the rest; None when no row is
    left. Raises (OSError, ValueError, KeyError) when the part cannot tell: the caller then
    ingests in full."""
    info = f.part
    check_regular_file(info.path)  # a FIFO since its footer was read: refused (an OSError)
    md = pq.read_metadata(info.path)
    rows = [int(n) for n in json.loads(md.metadata[PARQUET_META_KEY])["flush_rows"]]
    span = part_span(os.path.basename(info.path))
    if span is None or len(rows) != span.last - span.first + 1 or sum(rows) != md.num_rows:
        raise ValueError(f"{info.path}: flush_rows does not match the part")
    skip = sum(rows[:flushes])
    if skip >= md.num_rows:
        return None
    tbl = read_columns(info.path, ["step", "step_time_s"]).slice(skip)
    mm = pc.min_max(tbl.column("step"))
    nulls = tbl.column("step_time_s").null_count
    part = replace(info, min_step=mm["min"].as_py(), max_step=mm["max"].as_py(), has_log_rows=nulls > 0,
                   has_end_rows=nulls < tbl.num_rows)
    return f._replace(part=part, skip_rows=skip)
