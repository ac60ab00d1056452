"""perstep's matrices from ranks.parquet read row group by row group, each decoded once.

ranks.parquet is written row-pass window by row-pass window, each window in row groups of a batch
of ranks x all of the window's steps. A step window of findings that cuts across those row groups
decodes every one of them: at 1,024 ranks in 10k-step parts, a 1,000-step findings window decoded
ten times the rows it kept (the read was ~14 of per_step's ~20 CPU-s). Here a *unit* is a run of
row groups sharing one step range (a row-pass window). Each row group is read alone (a row slice:
no other row group is decoded); the columns the matrices need are kept as numpy arrays for the
unit, cut into windows of whole straggler blocks; the steps of a unit's last, partial block wait
for the next unit (a carry of under one block).

Taken when the whole run is one full grid, which is when every step window takes the matrix path
in perstep, so the windows chosen here give the same bits as perstep's (a step's facts are its
own; a block's median and sum are over the same (steps x ranks) slice): every row group its ranks
ascending, each with the same consecutive steps; a unit's row groups disjoint ascending ranks, the
same ranks in every unit, the steps consecutive from unit to unit; one attempt (from the footer's
statistics); no null where a median is taken. Anything else returns None, before any window's
result is used, and perstep reads step windows as before.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import polars as pl

from kforge_dash.findings.matrix import Window
from kforge_dash.ingest.inputs.parquet_io import read_metadata
from kforge_dash.ingest.rowpass.buffers import Buffers

# The most the kept columns of a unit may hold (8 B a value); a bigger unit is read in pieces of
# steps, each decoding its row groups again, up to MAX_PIECES; beyond: perstep's step windows.
UNIT_BYTES = 128 << 20
MAX_PIECES = 8


@dataclass(frozen=True)
class Group:
    offset: int  # first row in the file
    rows: int


class NotAGrid(Exception):
    """The run is not one full grid: perstep takes its step windows."""


def plan(path: str) -> tuple[list[tuple[list[Group], int, int]], int] | None:
    """([(row groups, first step, last step)] of the units in file order, the run's one attempt)
    from the footer, or None."""
    md = read_metadata(path)
    names = md.schema.names
    if md.num_row_groups == 0 or "step" not in names or "attempt" not in names:
        return None
    js, ja = names.index("step"), names.index("attempt")
    units: list[tuple[list[Group], int, int]] = []
    attempts, hi_u, prev_hi, off = set(), None, None, 0
    for i in range(md.num_row_groups):
        rg = md.row_group(i)
        s, a = rg.column(js).statistics, rg.column(ja).statistics
        if s is None or a is None or not (s.has_min_max and a.has_min_max) or a.null_count:
            return None
        attempts |= {int(a.min), int(a.max)}
        lo, hi = int(s.min), int(s.max)
        if hi_u is not None and lo <= hi_u:  # overlaps the unit: one of its row groups
            if prev_hi is not None and lo <= prev_hi:
                return None  # reaches back into an earlier unit
            hi_u = max(hi_u, hi)
            units[-1][0].append(Group(off, rg.num_rows))
            units[-1] = (units[-1][0], min(units[-1][1], lo), hi_u)
        else:
            prev_hi, hi_u = hi_u, hi
            units.append(([Group(off, rg.num_rows)], lo, hi))
        off += rg.num_rows
    return (units, attempts.pop()) if len(attempts) == 1 else None


@dataclass
class Unit:
    """A unit's rows: per kept column, one (ranks x steps) array per row group (its ranks cols)."""

    lo: int
    k: int  # steps lo .. lo + k - 1
    parts: list[tuple[int, int, dict[str, np.ndarray]]]  # (first rank column, ranks, name -> flat)


class Reader:
    """Reads units and hands out (steps x ranks) matrices of any step range of the pending rows."""

    def __init__(self, path: str, select: list[pl.Expr], need: list[str], side: list[str], buf: Buffers):
        self.path, self.select, self.need, self.side, self.buf = path, select, need, side, buf
        self.names = [*need, *side]
        self.ranks: np.ndarray | None = None
        self.carry: dict[str, np.ndarray] = {}  # steps carry_lo .. unit.lo - 1, (steps x ranks)
        self.carry_lo: int | None = None
        self.unit: Unit | None = None

    def read(self, groups: list[Group], steps: tuple[int, int], pool: ThreadPoolExecutor, bufs) -> Unit:
        """The steps [a, b] of a unit's row groups, read ``pool``'s threads at a time (polars
        releases the GIL), into fresh arrays (the carry keeps the last unit's)."""
        self.buf = Buffers()

        def one(ig):
            i, g = ig
            lf = pl.scan_parquet(self.path, glob=False).slice(g.offset, g.rows)
            return self.group(i, lf.filter(pl.col("step").is_between(*steps)), bufs())

        return self.assemble(list(pool.map(one, enumerate(groups))))

    def assemble(self, gots: list) -> Unit:
        """A unit from its row groups' ``group`` results, in file order; NotAGrid unless they are
        disjoint ascending ranks over the same steps, the same ranks as the units before."""
        parts, lo, k, col, last_rank = [], None, None, 0, None
        for got in gots:
            if got is None:
                continue  # log rows only
            ranks, g_lo, g_k, flat = got
            if (lo is not None and (g_lo, g_k) != (lo, k)) or (parts and ranks[0] <= last_rank):
                raise NotAGrid
            lo, k, last_rank = g_lo, g_k, ranks[-1]
            parts.append((col, len(ranks), flat, ranks))
            col += len(ranks)
        if not parts:
            raise NotAGrid
        ranks = np.concatenate([r for *_, r in parts])
        if self.ranks is None:
            self.ranks = ranks
        elif not np.array_equal(ranks, self.ranks):
            raise NotAGrid
        return Unit(lo, k, [(c0, R, f) for c0, R, f, _ in parts])

    def group(self, i: int, lf: pl.LazyFrame, buf: Buffers):
        """(ranks, first step, steps, name -> (ranks x steps) flat array) of the i-th row group of
        a unit (``lf``: its rows in the file), None when it holds log
        rows only; NotAGrid when it is not a grid or a needed value is null."""
        df = lf.filter(pl.col("step_time_s").is_not_null()).select(self.select).collect()
        if df.height == 0:
            return None
        if any(df[c].null_count() for c in ("step", "rank", *self.need)):
            raise NotAGrid
        if any(df[c].dtype != pl.Float64 for c in self.names):
            raise NotAGrid  # the step windows keep another float type as it is; here all is float64
        ranks, lo, k = _grid(buf.flat("step", df["step"]), buf.flat("rank", df["rank"]), buf)
        # kept for the unit, in the reader's arrays for the i-th row group of the unit
        flat = {c: self.buf.flat(f"g{i}/{c}", df[c]) for c in self.need}
        flat |= {c: self.buf.flat(f"g{i}/{c}", df[c].fill_null(np.nan)) for c in self.side}
        return ranks, lo, k, flat

    def push(self, unit: Unit) -> None:
        """The next unit: its steps must follow the pending ones."""
        end = self.unit.lo + self.unit.k if self.unit is not None else None
        if end is not None and unit.lo != end:
            raise NotAGrid
        self.unit = unit

    def keep_from(self, a: int) -> None:
        """Steps from a on wait for the next unit (copied out of the unit's arrays)."""
        u = self.unit
        b = u.lo + u.k
        self.carry = {c: self.matrix(c, a, b, role="carry") for c in self.names} if a < b else {}
        self.carry_lo = a if a < b else None

    def matrix(self, name: str, a: int, b: int, role: str = "win", buf: Buffers | None = None) -> np.ndarray:
        """Steps [a, b) of the pending rows (carry, then unit) as a (steps x ranks) matrix, in
        ``buf`` (a thread's own; default the reader's)."""
        m = (buf or self.buf).get(f"{role}/{name}", np.float64, (b - a, len(self.ranks)))
        u, t = self.unit, 0
        if a < u.lo:  # from the carry
            t = u.lo - a
            m[:t] = self.carry[name][a - self.carry_lo:a - self.carry_lo + t]
        lo, hi = max(a, u.lo) - u.lo, b - u.lo
        for c0, R, flat in u.parts:
            m[t:, c0:c0 + R] = flat[name].reshape(R, u.k)[:, lo:hi].T
        return m

    def by_rank(self, name: str, a: int, b: int, buf: Buffers) -> np.ndarray:
        """Steps [a, b) of the pending rows as a (ranks x steps) matrix."""
        m = buf.get(f"by_rank/{name}", np.float64, (len(self.ranks), b - a))
        u, t = self.unit, 0
        if a < u.lo:
            t = u.lo - a
            m[:, :t] = self.carry[name][a - self.carry_lo:a - self.carry_lo + t].T
        lo, hi = max(a, u.lo) - u.lo, b - u.lo
        for c0, R, flat in u.parts:
            m[c0:c0 + R, t:] = flat[name].reshape(R, u.k)[:, lo:hi]
        return m


def _grid(steps: np.ndarray, ranks: np.ndarray, buf: Buffers) -> tuple[np.ndarray, int, int]:
    """(ranks, first step, steps) of a row group that is rank by rank, ranks ascending, each with
    the same consecutive steps; else NotAGrid. Two passes (matrix._segments takes five: it
    finds segments, here there must be one)."""
    lo, n = int(steps[0]), len(steps)
    k = int(steps[-1]) - lo + 1
    if k < 1 or n % k:
        raise NotAGrid
    R = n // k
    s, r = steps.reshape(R, k), ranks.reshape(R, k)
    same = buf.get("same", np.bool_, (R, k))
    if not (np.equal(s, np.arange(lo, lo + k, dtype=np.int64), out=same).all() and np.equal(r, r[:, :1], out=same).all()):
        raise NotAGrid
    if R > 1 and not (np.diff(r[:, 0]) > 0).all():
        raise NotAGrid
    return r[:, 0].copy(), lo, k


def per_step_units(path: str, ph, select: list[pl.Expr], st: pl.DataFrame, W: int, span_rows: int,
                   alias: dict[str, str], need: list[str], side: list[str], threads: int):
    """perstep.per_step's (per-step frames, block frames) by units, or None (not one grid).

    A unit is read with polars' threads; its windows then run ``threads`` at a time (numpy
    releases the GIL), each with fresh arrays. One thread took 1.0-1.38x the wall time at 64
    ranks x 100k steps but 0.78-0.93x at 1,024 x 10k on a loaded 2-core machine
    (`bench_perstep.py --ways units units-1t`): measure on idle cores before keeping or cutting."""
    got = plan(path)
    if got is None:
        return None
    units, attempt = got
    rd = Reader(path, select, need, side, Buffers())
    pieces = _pieces(units, len(rd.names), W)
    if pieces is None:
        return None
    got = []
    with ThreadPoolExecutor(threads, thread_name_prefix="kforge-perstep") as pool:
        try:
            for i, (groups, steps) in enumerate(pieces):
                rd.push(rd.read(groups, steps, pool, Buffers))
                spans, keep = unit_spans(rd, W, span_rows, threads, last=i == len(pieces) - 1)
                got += list(pool.map(lambda span: window_facts(rd, span, ph, st, W, alias, attempt, Buffers()), spans))
                rd.keep_from(keep)
        except NotAGrid:
            return None
    return [m for m, _ in got], [b for _, b in got if b is not None]


def unit_spans(rd: Reader, W: int, span_rows: int, threads: int, *, last: bool) -> tuple[list[tuple[int, int]], int]:
    """(the windows of the pending rows to compute now, the first step to carry to the next
    unit): whole blocks only, but for the run's last unit."""
    u = rd.unit
    start = rd.carry_lo if rd.carry_lo is not None else u.lo
    end = u.lo + u.k if last else (u.lo + u.k) // W * W  # whole blocks; the rest waits
    return _spans(start, end, W, len(rd.ranks), span_rows, threads), max(start, end)


def window_facts(rd: Reader, span: tuple[int, int], ph, st: pl.DataFrame, W: int, alias: dict[str, str],
                 attempt: int, buf: Buffers):
    """(per-step frame, block frame or None) of the steps [a, b) of the pending rows."""
    a, b = span
    mats = {(c, c in rd.side): rd.matrix(c, a, b, buf=buf) for c in rd.names}
    by_rank = {c: rd.by_rank(c, a, b, buf) for c in ph.own}
    win = Window.of_matrices(mats, a, b - a, rd.ranks, buf, attempt=attempt, alias=alias, by_rank=by_rank)
    med = win.per_step(ph.own, ph.data)
    sts = med.select("step").join(st, on="step", how="left")["_st"].to_numpy()
    return med, (win.blocks(med, sts, ph.own, W) if ph.own else None)


def _pieces(units, n_names: int, W: int) -> list[tuple[list[Group], tuple[int, int]]] | None:
    """Each unit as (its row groups, a step range [a, b]), cut in pieces of whole blocks when its
    columns would hold more than UNIT_BYTES: each piece decodes the unit's row groups again (a
    row group cannot be decoded in part), so memory is bounded for a second or third read."""
    out = []
    for groups, lo, hi in units:
        m = -(-sum(g.rows for g in groups) * n_names * 8 // UNIT_BYTES)
        if m > MAX_PIECES:
            return None
        inner = sorted({(lo + (hi + 1 - lo) * j // m) // W * W for j in range(1, m)})
        cuts = [lo] + [c for c in inner if lo < c <= hi]
        out += [(groups, (a, b - 1)) for a, b in zip(cuts, cuts[1:] + [hi + 1])]
    return out


def _spans(start: int, end: int, W: int, n_ranks: int, span_rows: int, threads: int) -> list[tuple[int, int]]:
    """[start, end) in windows of whole blocks (block-aligned ends), at least ``threads`` of them
    when there are enough blocks, none over ``span_rows`` rows unless one block is."""
    if start >= end:
        return []
    first, n_blocks = start // W, -(-end // W) - start // W
    per = max(1, min(-(-n_blocks // threads), span_rows // n_ranks // W))
    cuts = [max(start, (first + j) * W) for j in range(0, n_blocks, per)]
    return list(zip(cuts, cuts[1:] + [end]))
