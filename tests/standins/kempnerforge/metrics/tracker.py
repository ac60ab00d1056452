"""KempnerForge's StepMetrics as documented (its fields and their 0.0 defaults)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StepMetrics:
    loss: float = 0.0
    grad_norm: float = 0.0
    lr: float = 0.0
    tokens_per_sec: float = 0.0
    mfu: float = 0.0
    step_time_sec: float = 0.0
    allocated_gb: float = 0.0
    peak_gb: float = 0.0
    reserved_gb: float = 0.0
    total_gb: float = 0.0
    mem_utilization: float = 0.0
