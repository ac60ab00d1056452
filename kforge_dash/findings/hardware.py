"""Hardware findings from the recorder's GPU telemetry (``hw/*`` columns of ranks.parquet): why a rank is slow.

A telemetry sample is *throttled* when NVML's clock-throttle reasons name a slowdown (hardware
slowdown, software or hardware thermal slowdown, hardware power brake: ``SLOWDOWN_BITS``) or its
SM clock is more than ``CLOCK_FALL`` below the run's typical clock (the median of every sample
that names no slowdown) while the GPU is not idle. A software power cap alone is the normal state
of a busy GPU and counts only through the clock. Per rank and launch, runs of at least
``MIN_SAMPLES`` consecutive throttled samples are episodes; episodes of several ranks that overlap
in steps are one ``hw_throttle`` finding. A straggler finding whose steps overlap an episode of
one of its ranks gains a ``cause`` naming it. The columns may come from the recorder's sampler or
from a job's own ``end_step`` values: the same rules apply.
"""

from __future__ import annotations

import dataclasses

import polars as pl

from kforge_dash import text
from kforge_dash.findings.finding import Finding, RunFacts, steps_range
from kforge_record.schema import HW_COLUMNS

CLOCK, REASONS = "hw/sm_clock_mhz", "hw/throttle_reasons"
CLOCK_FALL = 0.10  # a clock this far below the run's typical one is throttled
MIN_SAMPLES = 2  # consecutive throttled samples of a rank: one sample may be a glitch

# NVML's clocks event (throttle) reasons, nvmlClocksEventReason*: bit -> (name, words)
REASON_NAMES = {
    0x1: ("gpu_idle", "idle"),
    0x2: ("applications_clocks_setting", "application clocks setting"),
    0x4: ("sw_power_cap", "power cap"),
    0x8: ("hw_slowdown", "hardware slowdown"),
    0x10: ("sync_boost", "sync boost"),
    0x20: ("sw_thermal_slowdown", "thermal slowdown (software)"),
    0x40: ("hw_thermal_slowdown", "thermal slowdown (hardware)"),
    0x80: ("hw_power_brake_slowdown", "power brake slowdown (hardware)"),
    0x100: ("display_clock_setting", "display clock setting"),
}
SLOWDOWN_BITS = 0x8 | 0x20 | 0x40 | 0x80
IDLE_BIT = 0x1


def reason_names(mask: int) -> list[str]:
    """The names of the bits set in an NVML throttle-reasons bitmask (unknown bits as ``bit_0x...``)."""
    out = [name for bit, (name, _) in REASON_NAMES.items() if mask & bit]
    rest = mask & ~sum(REASON_NAMES)
    out += [f"bit_{1 << i:#x}" for i in range(64) if rest >> i & 1]
    return out


def _words(mask: int) -> str:
    words = [w for bit, (_, w) in REASON_NAMES.items() if mask & bit and bit != IDLE_BIT]
    return ", ".join(words) if words else "no throttle reason given"


@dataclasses.dataclass(frozen=True)
class Episode:
    """One rank's throttled stretch of samples."""

    rank: int
    attempt: int
    first: int
    last: int
    reasons: int  # the bits seen while throttled (idle left out)
    clock_from: float | None  # the rank's typical SM clock (MHz), outside its episodes
    clock_to: float | None  # the median SM clock while throttled

    def fell(self) -> str:
        if self.clock_from is None or self.clock_to is None:
            return "clocks were throttled"
        return f"SM clock fell from {self.clock_from:,.0f} to {self.clock_to:,.0f} MHz"


def _samples(facts: RunFacts) -> pl.DataFrame | None:
    have = [c for c in (CLOCK, REASONS) if c in facts.steps.columns]
    if not have:
        return None
    lf = pl.scan_parquet(facts.ranks_path, glob=False)
    cols = [c for c in (CLOCK, REASONS) if c in lf.collect_schema()]
    if not cols:
        return None
    df = (lf.filter(pl.any_horizontal([pl.col(c).is_not_null() for c in cols]))
          .select("step", "rank", "attempt", *cols).sort("attempt", "rank", "step").collect())
    for c in (CLOCK, REASONS):
        if c not in df.columns:
            df = df.with_columns(pl.lit(None, pl.Float64).alias(c))
    bad = ~pl.col(REASONS).is_finite() | (pl.col(REASONS) < 0) | (pl.col(REASONS) >= 2.0**63)
    return df.with_columns(pl.when(bad).then(None).otherwise(pl.col(REASONS)).cast(pl.Int64).alias("_bits"),
                           pl.when(pl.col(CLOCK).is_finite() & (pl.col(CLOCK) > 0)).then(pl.col(CLOCK)).alias("_clk"))


def episodes(facts: RunFacts) -> list[Episode]:
    """Every rank's throttled episodes, by launch, rank and step."""
    df = _samples(facts)
    if df is None or df.height == 0:
        return []
    slow_bits = (pl.col("_bits").fill_null(0) & SLOWDOWN_BITS) != 0
    idle = (pl.col("_bits").fill_null(0) & IDLE_BIT) != 0
    typical = df.filter(~slow_bits)["_clk"].median()
    low = (pl.col("_clk") < (1 - CLOCK_FALL) * typical) if typical is not None else pl.lit(False)
    df = df.with_columns(_thr=slow_bits | (low.fill_null(False) & ~idle))
    out = []
    for (attempt, rank), g in df.group_by("attempt", "rank", maintain_order=True):
        calm = g.filter(~pl.col("_thr"))["_clk"].median()
        base = calm if calm is not None else typical
        runs = g.with_columns(_run=(pl.col("_thr") != pl.col("_thr").shift(1)).fill_null(True).cum_sum()).filter("_thr")
        for _, e in runs.group_by("_run", maintain_order=True):
            if e.height < MIN_SAMPLES:
                continue
            bits = 0
            for b in e["_bits"].drop_nulls().to_list():
                bits |= b
            out.append(Episode(rank=rank, attempt=attempt, first=int(e["step"].min()), last=int(e["step"].max()),
                               reasons=bits & ~IDLE_BIT, clock_from=base, clock_to=e["_clk"].median()))
    return out


def throttle_findings(facts: RunFacts, eps: list[Episode]) -> list[Finding]:
    """One ``hw_throttle`` finding per group of episodes (one launch) that overlap in steps."""
    groups: list[list[Episode]] = []
    for e in sorted(eps, key=lambda e: (e.attempt, e.first, e.rank)):
        g = groups[-1] if groups else None
        if g and g[0].attempt == e.attempt and e.first <= max(x.last for x in g):
            g.append(e)
        else:
            groups.append([e])
    out = []
    for g in groups:
        ranks = tuple(sorted({e.rank for e in g}))
        first, last = min(e.first for e in g), max(e.last for e in g)
        bits = 0
        for e in g:
            bits |= e.reasons
        hosts = facts.hosts_of(ranks, {g[0].attempt})
        worst = min(g, key=lambda e: (e.clock_to / e.clock_from) if e.clock_to and e.clock_from else 1.0)
        score = 1 - worst.clock_to / worst.clock_from if worst.clock_to and worst.clock_from else None
        who = text.rank_list(ranks).capitalize() + (f" on {', '.join(hosts)}" if hosts else "")
        out.append(Finding(
            kind="hw_throttle", metric=CLOCK if worst.clock_to is not None else REASONS, severity="warning",
            first_step=first, last_step=last, ranks=ranks, hosts=hosts, score=score, reasons=tuple(reason_names(bits)),
            message=(f"{who}: the GPU was throttled at {steps_range(first, last)} ({_words(bits)}); "
                     f"{'rank ' + str(worst.rank) + chr(39) + 's ' if len(ranks) > 1 else ''}{worst.fell()}: "
                     "look at that machine's cooling and power."),
        ))
    return out


def with_causes(found: list[Finding], eps: list[Episode]) -> list[Finding]:
    """Straggler findings, each with ``cause`` naming the throttled episodes of its ranks during its steps."""
    out = []
    for f in found:
        if f.kind != "straggler":
            out.append(f)
            continue
        hits = [e for e in eps if e.rank in f.ranks and f.first_step is not None and f.last_step is not None
                and e.first <= f.last_step and e.last >= f.first_step]
        if hits:
            why = "; ".join(f"rank {e.rank}'s {e.fell()}, {_words(e.reasons)}" for e in hits[:5])
            out.append(dataclasses.replace(f, cause=f"{why}, during the same steps"))
        else:
            out.append(f)
    return out


__all__ = ["HW_COLUMNS", "episodes", "throttle_findings", "with_causes", "reason_names"]
