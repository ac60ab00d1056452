"""Launches of a job (per-rank attempts that started together), and each one's FLOPs and peak."""

from __future__ import annotations

from dataclasses import dataclass, field

from kforge_dash.ingest.inputs import flops as _flops


@dataclass
class Launch:
    """One process launch of the job (all ranks' attempts that started together)."""

    index: int
    attempts: list = field(default_factory=list)

    @property
    def ranks(self):
        return {a.rank for a in self.attempts}

    def parts(self):
        return [p for a in self.attempts for p in a.parts]


def group_launches(attempts: list, warnings: list[str]) -> list[Launch]:
    """Cluster per-rank attempts into launches, in start-time order.

    Attempt ids differ per rank (they carry the pid), so a launch is recognised by time: walking
    attempts by start time (unknown starts last, by attempt id), a new launch begins when a rank already seen in the current one
    appears again, or when world size or the Slurm/torchelastic launch counters change.
    """
    launches: list[Launch] = []
    ranks: set[int] = set()  # the current launch's (Launch.ranks builds a set: 4,096 ranks would take seconds)
    # An unknown start (None) sorts after every known one, those by attempt id.
    for a in sorted(attempts, key=lambda a: (a.start_time is None, a.start_time or 0.0, a.attempt_id)):
        cur = launches[-1] if launches else None
        new = cur is None or a.rank in ranks
        if not new and a.meta_ok:
            ref = next((b for b in cur.attempts if b.meta_ok), None)
            if ref is not None:
                # An unknown world size (a meta.json field ignored for its type) differs from none.
                sizes_differ = None not in (ref.world_size, a.world_size) and ref.world_size != a.world_size
                new = sizes_differ or (ref.meta.get("launch") or {}) != (a.meta.get("launch") or {})
        if new:
            launches.append(Launch(len(launches)))
            ranks = set()
        launches[-1].attempts.append(a)
        ranks.add(a.rank)
    for launch in launches:
        sizes = sorted({a.world_size for a in launch.attempts if a.world_size is not None})
        if len(sizes) > 1:
            warnings.append(f"attempt {launch.index}: ranks disagree on world size {sizes}; using {sizes[-1]}")
    return launches


def start_of(launch: Launch) -> float | None:
    """The launch's start: its earliest known attempt start, None when no start is known."""
    return min((a.start_time for a in launch.attempts if a.start_time is not None), default=None)


def world_size_of(launch: Launch) -> int:
    sizes = [a.world_size for a in launch.attempts if a.world_size is not None]
    return max(sizes) if sizes else len(launch.ranks)


def lead_meta(launch: Launch) -> dict:
    """The lowest rank's meta.json that was readable (rank 0 normally)."""
    ok = sorted((a for a in launch.attempts if a.meta_ok), key=lambda a: a.rank)
    return ok[0].meta if ok else {}


def launch_flops(launch: Launch, warnings: list[str], *, flops_per_token: float | None, peak_tflops: float | None) -> dict:
    """FLOPs per token, peak TFLOPS and their sources for one launch (None where unknown);
    ``flops_per_token``, ``peak_tflops``: the user's overrides, or None."""
    meta = lead_meta(launch)
    out = {"flops_per_token": None, "flops_source": None, "peak_tflops": None, "peak_source": None,
           "device": meta.get("device"), "model": meta.get("model")}
    if flops_per_token is not None:
        out["flops_per_token"], out["flops_source"] = float(flops_per_token), "override"
    else:
        try:
            out["flops_per_token"], out["flops_source"] = _flops.flops_per_token(meta.get("model"))
        except (ValueError, TypeError) as e:
            warnings.append(f"attempt {launch.index}: model description unusable for FLOPs ({e}); MFU is null")
        if out["flops_per_token"] is None and meta.get("model") is None:
            warnings.append(f"attempt {launch.index}: no model description in meta.json; MFU is null (pass --flops-per-token)")
    recorded = next((a.meta.get("peak_tflops") for a in launch.attempts if a.meta.get("peak_tflops")), None)
    dev = meta.get("device") or {}
    if peak_tflops is not None:
        out["peak_tflops"], out["peak_source"] = float(peak_tflops), "override"
    elif recorded is not None:
        out["peak_tflops"], out["peak_source"] = float(recorded), "meta.json peak_tflops"
    else:
        entry = _flops.peak_for_device(dev.get("name")) if dev.get("type") != "cpu" else None
        if entry is not None:
            out["peak_tflops"], out["peak_source"] = entry.tflops, f"table: {dev.get('name')} ({entry.source})"
        elif dev.get("type") == "cpu":
            warnings.append(f"attempt {launch.index}: ran on CPU; no peak TFLOPS, MFU is null (pass --peak-tflops)")
        else:
            warnings.append(
                f"attempt {launch.index}: device {dev.get('name')!r} is not in the peak-TFLOPS table; "
                "MFU is null (pass --peak-tflops)"
            )
    return out
