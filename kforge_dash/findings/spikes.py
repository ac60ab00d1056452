"""Loss and grad-norm spikes: a robust rule on the residual against a trailing baseline.

A step spikes when its value is above the trailing median of the last ``spike_window`` finite
values by more than max(k * sigma, rel * |median|), sigma being the window's interquartile range
/ 1.349 (the standard deviation a normal distribution with that IQR has, but blind to the outliers
themselves, like median + k * MAD). Spiking steps closer than a few steps form one episode, so a
spike and its slow decay are one finding with a first and a last step. A grad-norm spike that
starts at most ``_LEAD`` steps before a loss spike (or at its step) is named in that loss spike's
message: the update that caused the jump, and is not a finding of its own (one fault, one finding).
The grad-norm spikes the loss did not follow are one ``grad_norm_spike`` finding of the run, severity
info, from the first to the last (a count and the largest in its message): gradient norms are
heavy-tailed, clipping absorbs a single large one, and the loss, the thing trained, did not move.
"""

from __future__ import annotations

import polars as pl

from kforge_dash import column_registry as reg
from kforge_dash.findings.finding import Finding, RunFacts, steps_range

_MERGE_GAP = 3  # spiking steps this close are one episode
_LEAD = 5  # a grad-norm spike this many steps before a loss spike (or fewer) preceded it


def spike_episodes(steps: pl.DataFrame, metric: str, opts, *, min_rel: float) -> list[dict]:
    """[{first, last, peak, baseline, z}] of ``metric`` (finite values only; NaN is nonfinite's)."""
    if metric not in steps.columns:
        return []
    s = steps.select("step", pl.col(metric).cast(pl.Float64).alias("x")).filter(pl.col("x").is_finite())
    w = opts.spike_window
    min_n = max(5, w // 5)  # too little history: no baseline yet
    roll = dict(window_size=w, min_samples=min_n)
    s = s.with_columns(
        pl.col("x").rolling_median(**roll).shift(1).alias("med"),
        (pl.col("x").rolling_quantile(0.75, **roll) - pl.col("x").rolling_quantile(0.25, **roll)).shift(1).alias("iqr"),
    ).with_columns((pl.col("iqr") / 1.349).alias("sigma"))
    s = s.with_columns(pl.max_horizontal(opts.spike_k * pl.col("sigma"), min_rel * pl.col("med").abs()).alias("tol"))
    hits = s.filter(pl.col("med").is_not_null() & (pl.col("x") - pl.col("med") > pl.col("tol")))
    out: list[dict] = []
    for step, x, med, sigma, tol in hits.select("step", "x", "med", "sigma", "tol").iter_rows():
        # A robust z; sigma floored so a flat baseline (sigma 0) still gives a finite score.
        z = (x - med) / max(sigma, tol / opts.spike_k, 1e-300)
        if out and step - out[-1]["last"] <= _MERGE_GAP:
            e = out[-1]
            e["last"] = step
            if z > e["z"]:
                e.update(peak=x, peak_step=step, z=z)
        else:
            out.append({"first": step, "last": step, "peak": x, "peak_step": step, "baseline": med, "z": z})
    return out


def spike_findings(facts: RunFacts) -> list[Finding]:
    steps, opts = facts.steps, facts.opts
    loss = spike_episodes(steps, "loss", opts, min_rel=opts.spike_min_rel)
    grad = spike_episodes(steps, "grad_norm", opts, min_rel=opts.grad_spike_min_rel)
    ranks = facts.ranks_of()
    hosts = facts.hosts_of(ranks)
    out = []
    for e in loss:
        lead = next((g for g in grad if e["first"] - _LEAD <= g["first"] <= e["first"]), None)
        why = ""
        if lead is not None:
            when = "at the same step" if lead["first"] == e["first"] else f"from step {lead['first']}"
            why = f", with a grad-norm spike {when} (the update that caused it: check lr and gradient clipping)"
        out.append(Finding(
            kind="loss_spike", metric="loss", severity="warning", first_step=e["first"], last_step=e["last"],
            ranks=ranks, hosts=hosts, score=e["z"],
            message=(f"Loss spiked at {steps_range(e['first'], e['last'])}: {_value('loss', e['peak'])} at step {e['peak_step']} "
                     f"against a trailing median of {_value('loss', e['baseline'])}{why}."),
        ))
    alone = [g for g in grad if not any(g["first"] <= e["first"] <= g["first"] + _LEAD for e in loss)]
    if alone:  # the others are named in their loss spike's message: one fault, one finding
        out.append(_grad_alone(alone, ranks, hosts))
    return out


def _value(metric: str, v: float) -> str:
    """A spike's value as every front end writes the metric (the column registry's format: a loss to 5
    significant digits, a grad norm to 4)."""
    return reg.lookup(metric).text(v)


def _grad_alone(spikes: list[dict], ranks, hosts) -> Finding:
    """The run's grad-norm spikes the loss did not follow, as one info finding (a clean run has a few)."""
    top = max(spikes, key=lambda g: g["z"])
    first, last = spikes[0]["first"], spikes[-1]["last"]
    if len(spikes) == 1:
        where = f"at {steps_range(first, last)}"
    else:
        shown = ", ".join(str(g["first"]) for g in spikes[:8]) + (", ..." if len(spikes) > 8 else "")
        where = f"{len(spikes)} times (from steps {shown}); the largest"
    return Finding(
        kind="grad_norm_spike", metric="grad_norm", severity="info", first_step=first, last_step=last,
        ranks=ranks, hosts=hosts, score=top["z"],
        message=(f"Gradient norm spiked {where}: {_value('grad_norm', top['peak'])} at step {top['peak_step']} against a "
                 f"trailing median of {_value('grad_norm', top['baseline'])}; the loss did not follow (gradient clipping "
                 "and the optimizer absorbed it): worth a look only if it recurs more often or grows."),
    )
