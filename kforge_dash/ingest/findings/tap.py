"""perstep's units computed during the row pass, from the rows as they are written.

Every table the row pass hands to the ranks writer becomes row groups of ranks.parquet (of
ranks_writer.ROW_GROUP_ROWS rows at most, in order), the very rows units.py later decodes. A ``PerStepTap``
is fed each table (``feed``, on the row pass's thread: a zero-copy select of the columns it
needs) and, on a thread of its own, cuts it into those row groups, forms units as units.plan does
from the footer, and computes each unit's per-step and block facts while the row pass reads the
next window: the core the row pass leaves idle does the findings' heaviest work. The run's last
unit is done once the pass ends (``end``), while steps.parquet and the summary are made.

What is not known before the row pass is guessed and checked afterwards (``result``): the
straggler block size (from the plan's ended steps), the phases (from the planned columns), and
that the finished file's footer gives the same units (the same row groups, steps and attempt).
Anything else, or any error, and ``result`` is None: perstep does what it did without the tap,
so the findings are the same bits either way; the blocks' median step time, which needs the
steps frame, is filled in at the end (units.fill_block_st).

Memory: one unit's kept columns (units.py holds the same after the pass) and at most
QUEUE_TABLES tables' kept columns waiting; a unit over UNIT_BYTES and the tap steps aside.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from kforge_dash.ingest import ranks_writer
from kforge_dash.ingest.findings import units
from kforge_dash.ingest.findings.matrix import Buffers
from kforge_dash.ingest.findings.model import Phases
from kforge_dash.ingest.findings.units import Group, NotAGrid, Reader

QUEUE_TABLES = 3  # tables fed and not yet taken apart; feed waits beyond (memory stays bounded)
UNIT_BYTES = 512 << 20  # the most a unit's kept columns may hold here (the row pass's memory besides)


class _Stopped(Exception):
    pass


def _plain(ph: Phases, cols) -> dict[str, tuple[str | None, float | None]] | None:
    """Each kept column as (the phase it is, the value of a null; None: no null allowed), when
    every derived one is one phase or none (perstep.own_work of one column is that column); else None."""
    if len(ph.own) != 1 or len(ph.data) > 1 or any(len(p) > 1 for p in (ph.wait, ph.checkpoint, ph.eval)):
        return None
    src = {"step_time_s": ("step_time_s", None), ph.own[0]: (ph.own[0], None),
           "_wait": (ph.wait[0] if ph.wait else None, 0.0), "_ckpt": (ph.checkpoint[0] if ph.checkpoint else None, np.nan),
           "_eval": (ph.eval[0] if ph.eval else None, np.nan)}
    names = [*cols.need, *cols.side]
    return {c: src[c] for c in names} if all(c in src for c in names) else None


def _copy(col: pa.ChunkedArray, out: np.ndarray, fill: float | None = None) -> np.ndarray:
    """``col`` into ``out``, ``fill`` where null (the values' bits as they are: -0.0, NaN)."""
    pos = 0
    for ch in col.chunks:
        m = len(ch)
        dst = out[pos:pos + m]
        if ch.null_count:
            dst[:] = fill
            np.copyto(dst, ch.to_numpy(zero_copy_only=False), where=ch.is_valid().to_numpy(zero_copy_only=False))
        else:
            dst[:] = ch.to_numpy()
        pos += m
    return out


def for_plan(plan, opts) -> PerStepTap | None:
    """A tap for the row pass of ``plan`` (ingest's), or None where units.py's way cannot be
    taken (more than one launch: more than one attempt) or the block size cannot be guessed."""
    from kforge_dash.ingest.findings.model import classify_phases
    from kforge_dash.ingest.findings.perstep import WINDOW_ROWS, block_size
    from kforge_dash.ingest.footers import usable_cpus
    from kforge_dash.ingest.reduce import step_columns

    if len(plan.launches) != 1:
        return None
    lo, hi = plan.first_ended.get(plan.launches[0].index), plan.last_ended.get(plan.launches[0].index)
    if lo is None or hi is None:
        return None
    try:  # the steps frame's steps, when every step in between ended (checked at the end)
        phases = classify_phases(step_columns(plan.spec.cols), opts)
        return PerStepTap(phases, block_size(hi - lo + 1), threads=min(2, usable_cpus()), span_rows=WINDOW_ROWS // 2)
    except Exception:  # noqa: BLE001 - no tap: the findings come after the row pass, as without one
        return None


class PerStepTap:
    """See the module docstring. ``begin`` before the rows, ``feed`` each table written, ``end``
    after the last; ``result`` once; ``close`` always (stops and joins the thread)."""

    def __init__(self, phases: Phases, W: int, *, threads: int, span_rows: int):
        from kforge_dash.ingest.findings.perstep import units_columns

        self.phases, self.W, self.threads, self.span_rows = phases, W, threads, span_rows
        self.cols = units_columns(phases)
        self.raw = list(dict.fromkeys(["step", "rank", "attempt", "step_time_s", *phases.own, *phases.wait,
                                       *phases.data, *phases.checkpoint, *phases.eval]))
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._ended = False
        self._plain = _plain(phases, self.cols)

    # --- the row pass's side -------------------------------------------------------------------

    def begin(self) -> None:
        """A fresh start (the row pass may start again from scratch: rows.read_rows)."""
        self.close()
        self._queue: deque = deque()
        self._ended = self._stop = self._finished = False
        self.failed: str | None = None
        thread = threading.Thread(target=self._run, name="kforge-perstep-tap", daemon=True)
        try:
            thread.start()
        except RuntimeError:  # (no thread to be had: no tap, the findings come after the pass)
            self._finished = True
            return
        self._thread = thread

    def feed(self, table: pa.Table) -> None:
        """One table as the ranks writer writes it. Never raises: a problem makes ``result`` None."""
        if self._thread is None:
            return
        try:
            table = table.select(self.raw)
        except Exception as e:  # noqa: BLE001 - the tap steps aside, the ingest goes on
            self._fail(f"{type(e).__name__}: {e}")
            return
        with self._cond:
            while len(self._queue) >= QUEUE_TABLES and not (self._finished or self._stop):
                self._cond.wait()
            if self._finished or self._stop or self._ended:
                return
            self._queue.append(table)
            self._cond.notify_all()

    def end(self) -> None:
        """No more tables: the last unit is computed (on the tap's thread)."""
        with self._cond:
            self._ended = True
            self._cond.notify_all()

    def close(self) -> None:
        """Stop (what is left undone is dropped) and join the thread. Idempotent."""
        if self._thread is None:
            return
        with self._cond:
            self._stop = True
            self._queue.clear()
            self._cond.notify_all()
        self._thread.join()
        self._thread = None

    def _fail(self, why: str) -> None:
        with self._cond:
            if self.failed is None:
                self.failed = why
            self._finished = True
            self._queue.clear()
            self._cond.notify_all()

    # --- the findings' side ----------------------------------------------------------------------

    def result(self, facts, st: pl.DataFrame, W: int):
        """(per-step frames, block frames) as units.per_step_units gives them from the finished
        ranks.parquet, or None (not the same run facts, not one grid, or a failure). Never raises;
        the tap's memory is let go."""
        if self._thread is None or not self._ended:  # (never begun, or the pass did not end)
            self.close()
            return None
        with self._cond:
            while not self._finished and self._thread.is_alive():
                self._cond.wait(0.1)
        self.close()
        try:
            if self.failed is not None or W != self.W or facts.phases != self.phases:
                return None
            if not self._same_units(facts.ranks_path):
                return None
            R = len(self._rd.ranks)
            return [m for m, _ in self._got], [units.fill_block_st(b, st, R) for _, b in self._got if b is not None]
        except Exception:  # noqa: BLE001 - perstep computes them from the file instead
            return None
        finally:
            self._rd = self._gots = self._got = None

    def _same_units(self, path: str) -> bool:
        """The footer gives the units seen here, and units.py would read them all (no piece of
        steps without rows, not too many pieces)."""
        plan = units.plan(path)
        if plan is None or plan != (self._units, self._attempts[0]):
            return False
        for unit, (g_lo, g_hi) in zip(plan[0], self._spans):
            pieces = units._pieces([unit], len(self._rd.names), self.W)
            # a piece of steps holding log rows only is not a grid there: units.py steps aside
            if pieces is None or any(b < g_lo or a > g_hi for _, (a, b) in pieces):
                return False
        return True

    # --- the tap's thread ------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._rd = Reader("", self.cols.select, self.cols.need, self.cols.side, Buffers())
            self._units: list[tuple[list[Group], int, int]] = []
            self._spans: list[tuple[int, int]] = []  # each unit's ended steps [first, last]
            self._attempts: list[int] = []
            self._gots: list = []  # the current unit's row groups, units.Reader.group's results
            self._got: list = []  # (per-step frame, block frame) of every window computed
            self._buf, self._offset, self._prev_hi = Buffers(), 0, None
            while (table := self._next()) is not None:
                self._table(table)
            if self._units:
                self._unit(last=True)
            with self._cond:
                self._finished = True
                self._cond.notify_all()
        except _Stopped:
            self._fail("stopped")
        except NotAGrid:
            self._fail("not one grid")
        except Exception as e:  # noqa: BLE001 - the tap steps aside, perstep reads the file
            self._fail(f"{type(e).__name__}: {e}")
        finally:
            if self.failed is not None:
                self._rd = self._gots = self._got = None  # (memory back at once)

    def _next(self) -> pa.Table | None:
        with self._cond:
            while not self._queue and not (self._ended or self._stop or self.failed):
                self._cond.wait()
            if self._stop or self.failed:
                raise _Stopped
            if not self._queue:
                return None
            table = self._queue.popleft()
            self._cond.notify_all()
            return table

    def _table(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            raise NotAGrid  # an empty row group: no statistics, units.plan steps aside
        n = ranks_writer.ROW_GROUP_ROWS  # as the writer cuts it (the footer is checked at the end)
        for off in range(0, table.num_rows, n):
            self._group(table.slice(off, n))

    def _group(self, t: pa.Table) -> None:
        """One row group, as units.plan sees it in the footer, then as units.Reader reads it."""
        s, a = pc.min_max(t["step"]), t["attempt"]
        if not s["min"].is_valid or a.null_count:
            raise NotAGrid
        am = pc.min_max(a)
        for v in {am["min"].as_py(), am["max"].as_py()}:
            if v not in self._attempts:
                self._attempts.append(v)
        if len(self._attempts) > 1:
            raise NotAGrid
        lo, hi, g = s["min"].as_py(), s["max"].as_py(), Group(self._offset, t.num_rows)
        self._offset += t.num_rows
        if self._units and lo <= self._units[-1][2]:  # overlaps the unit: one of its row groups
            if self._prev_hi is not None and lo <= self._prev_hi:
                raise NotAGrid  # reaches back into an earlier unit
            groups, u_lo, u_hi = self._units[-1]
            self._units[-1] = (groups + [g], min(u_lo, lo), max(u_hi, hi))
        else:
            if self._units:
                self._unit(last=False)
                self._prev_hi = self._units[-1][2]
            self._units.append(([g], lo, hi))
        held = sum(x.rows for x in self._units[-1][0]) * len(self._rd.names) * 8
        if held > UNIT_BYTES:
            raise NotAGrid  # too big to hold beside the row pass: after it, units.py in pieces
        self._gots.append(self._rows(len(self._gots), t))

    def _rows(self, i: int, t: pa.Table):
        """units.Reader.group's result for the i-th row group of the unit, straight from the Arrow
        buffers where that is plain copying (every row ended, int64 keys, float64 phases, each
        derived column one phase or none: then that phase, perstep.own_work); else by polars."""
        st = t["step_time_s"]
        if st.null_count == t.num_rows:
            return None  # log rows only
        plain = self._plain
        if plain is None or st.null_count or not all(pa.types.is_int64(t[c].type) for c in ("step", "rank")) or not all(
                pa.types.is_float64(t[src].type) for src, _ in plain.values() if src is not None):
            return self._rd.group(i, pl.from_arrow(t, rechunk=False).lazy(), self._buf)
        if t["step"].null_count or t["rank"].null_count:
            raise NotAGrid
        n, buf = t.num_rows, self._buf
        ranks, lo, k = units._grid(_copy(t["step"], buf.get("step", np.int64, n)),
                                   _copy(t["rank"], buf.get("rank", np.int64, n)), buf)
        flat = {}
        for c, (src, fill) in plain.items():
            out = flat[c] = self._rd.buf.get(f"g{i}/{c}", np.float64, n)
            if src is None:
                out[:] = fill
            elif fill is None and t[src].null_count:
                raise NotAGrid  # a null where a median is taken
            else:
                _copy(t[src], out, fill)
        return ranks, lo, k, flat

    def _unit(self, *, last: bool) -> None:
        """The complete unit's windows (whole blocks; the rest carried), as per_step_units does."""
        rd = self._rd
        rd.push(rd.assemble(self._gots))
        self._gots = []
        self._spans.append((rd.unit.lo, rd.unit.lo + rd.unit.k - 1))
        threads = self.threads if last else 1  # in the pass: beside it, on this one thread
        spans, keep = units.unit_spans(rd, self.W, self.span_rows, threads, last=last)
        args = (self.phases, None, self.W, self.cols.alias, self._attempts[0])
        if threads > 1 and len(spans) > 1:
            local = threading.local()

            def one(span):
                if not hasattr(local, "buf"):
                    local.buf = Buffers()
                return units.window_facts(rd, span, *args, local.buf)

            with ThreadPoolExecutor(threads, thread_name_prefix="kforge-perstep") as pool:
                self._got += list(pool.map(one, spans))
        else:
            for span in spans:
                if self._stop:
                    raise _Stopped
                self._got.append(units.window_facts(rd, span, *args, self._buf))
        rd.keep_from(keep)
        self.on_unit(rd.unit.lo)

    def on_unit(self, first_step: int) -> None:
        """Called on the tap's thread once a unit's facts are computed (a hook for tests)."""
