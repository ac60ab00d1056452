"""FLOPs per token from the recorded model, and dense-bf16 peak TFLOPS by exact device name.

Both feed MFU = flops_per_token x tokens/s / (world_size x peak_TFLOPS x 1e12). Anything unknown
is None (and the caller warns): a wrong peak or model would make every MFU number quietly wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

from kforge_record.model import active_params, flops_per_token, n_moe_layers  # noqa: F401  (one formula, in model.py)


@dataclass(frozen=True)
class Peak:
    """One table entry: dense (no 2:4 sparsity) bf16 tensor-core TFLOPS and where it is published."""

    tflops: float
    source: str


# Keyed by the exact name torch.cuda.get_device_name() reports (what the recorder writes to
# meta.json "device.name"). Vendors print the sparse figure in bold; these are half of it (dense).
_H100 = "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"  # H100 datasheet
_H200 = "https://www.nvidia.com/en-us/data-center/h200/"
_A100 = "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
_GH200 = "https://resources.nvidia.com/en-us-grace-cpu/grace-hopper-superchip"  # GH200 datasheet
_B200 = "https://nvdam.widen.net/s/wwnsxrhm2w/blackwell-datasheet-3384703"  # HGX B200, per GPU
_L40S = "https://resources.nvidia.com/en-us-l40s/l40s-datasheet-28413"
_L4 = "https://resources.nvidia.com/en-us-data-center-overview/l4-gpu-datasheet"
_A10 = "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a10/pdf/A10-Product-Brief.pdf"
_MI300X = "https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html"
_MI325X = "https://www.amd.com/en/products/accelerators/instinct/mi300/mi325x.html"
_MI250X = "https://www.amd.com/en/products/accelerators/instinct/mi200/mi250x.html"

PEAK_TFLOPS: dict[str, Peak] = {
    # Hopper: H100 SXM5 1979 sparse -> 989; PCIe 1513 -> 756; NVL 1671 -> 835.
    "NVIDIA H100 80GB HBM3": Peak(989.0, _H100),
    "NVIDIA H100 SXM5 80GB": Peak(989.0, _H100),
    "NVIDIA H100 PCIe": Peak(756.0, _H100),
    "NVIDIA H100 NVL": Peak(835.0, _H100),
    "NVIDIA H200": Peak(989.0, _H200),  # H200 SXM: 1979 sparse
    "NVIDIA H200 NVL": Peak(835.0, _H200),  # H200 NVL: 1671 sparse
    "NVIDIA GH200 480GB": Peak(989.0, _GH200),  # same Hopper GPU as H100 SXM
    "NVIDIA GH200 144G HBM3e": Peak(989.0, _GH200),
    # Ampere A100: 312 dense bf16 for every form factor and memory size (624 sparse).
    "NVIDIA A100-SXM4-80GB": Peak(312.0, _A100),
    "NVIDIA A100-SXM4-40GB": Peak(312.0, _A100),
    "NVIDIA A100-PCIE-40GB": Peak(312.0, _A100),
    "NVIDIA A100 80GB PCIe": Peak(312.0, _A100),
    # Blackwell B200: 4.5 PFLOPS sparse bf16 per GPU -> 2250 dense.
    "NVIDIA B200": Peak(2250.0, _B200),
    # Ada / Ampere inference parts.
    "NVIDIA L40S": Peak(362.05, _L40S),  # 733 sparse
    "NVIDIA L4": Peak(121.0, _L4),  # 242 sparse
    "NVIDIA A10": Peak(125.0, _A10),  # 250 sparse
    # NVIDIA A10G (AWS G5) is deliberately absent: NVIDIA publishes no datasheet for it and the
    # figures quoted online disagree; pass --peak-tflops (or Recorder(peak_tflops=...)) for it.
    # AMD Instinct (ROCm torch reports these names): dense bf16 matrix peak.
    "AMD Instinct MI300X": Peak(1307.4, _MI300X),
    "AMD Instinct MI325X": Peak(1307.4, _MI325X),
    "AMD Instinct MI250X": Peak(191.5, _MI250X),  # per GCD (torch sees each GCD as one device)
}


def peak_for_device(name: str | None) -> Peak | None:
    """The table entry for an exact device name, or None (unknown device, CPU, no name)."""
    if not name:
        return None
    return PEAK_TFLOPS.get(name.strip())
