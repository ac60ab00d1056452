"""KempnerForge's peak-TFLOPS detection as documented: 1.0 (a dummy) without CUDA."""

from __future__ import annotations


def get_gpu_peak_tflops(device: int = 0) -> float:
    return 1.0
