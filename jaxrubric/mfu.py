"""MFU (model FLOPs utilisation): model FLOPs done per second against the chips' peak.

Kept apart from the FLOP counts (`jaxrubric.flops`) so that the generic host loop can log MFU
without knowing what a round computes.
"""

from __future__ import annotations

import re


# Dense (not sparse) bf16 peak FLOP/s of one JAX device. TPU: Google Cloud TPU system
# architecture pages, per chip (cloud.google.com/tpu/docs/v4, v5e, v5p, v6e); a v4 / v5p chip is
# one JAX device (megacore), v5e / v6e chips have one TensorCore. NVIDIA: the product datasheets
# (NVIDIA A100 Tensor Core GPU datasheet, H100 Tensor Core GPU datasheet, H200 Tensor Core GPU
# datasheet, on nvidia.com/en-us/data-center/): the H100 and H200 sheets list bf16 Tensor Core
# FLOPS "with sparsity" (1,979 TFLOPS SXM), dense is half of that; the A100 sheet lists 312
# TFLOPS dense beside 624 with sparsity.
PEAK_FLOPS: dict[str, float] = {
    "TPU v4": 275e12,
    "TPU v5e": 197e12,
    "TPU v5p": 459e12,
    "TPU v6e": 918e12,  # Trillium
    "NVIDIA A100": 312e12,  # SXM4 and PCIe, 40 and 80 GB (624 with sparsity)
    "NVIDIA H100 SXM": 989e12,  # 1,979 with sparsity
    "NVIDIA H100 PCIe": 756e12,  # 1,513 with sparsity
    "NVIDIA H100 NVL": 835e12,  # 1,671 with sparsity
    "NVIDIA H200": 989e12,  # SXM, 1,979 with sparsity
    "NVIDIA H200 NVL": 835e12,  # 1,671 with sparsity
}

# HBM bandwidth of one JAX device, bytes/s: the roofline's memory bound (`jaxrubric plan
# --topology`). TPU: the same Cloud TPU architecture pages ("HBM bandwidth" per chip: v4 1,200
# GB/s, v5e 819, v5p 2,765, v6e 1,640). NVIDIA: the same datasheets (H100 SXM 3.35 TB/s, PCIe
# 2 TB/s, NVL 3.9 TB/s; H200 SXM and NVL 4.8 TB/s; A100: the 80 GB SXM's 2,039 GB/s, the fastest
# variant, so that a time bound from it holds for every A100).
HBM_BANDWIDTH: dict[str, float] = {
    "TPU v4": 1200e9,
    "TPU v5e": 819e9,
    "TPU v5p": 2765e9,
    "TPU v6e": 1640e9,
    "NVIDIA A100": 2039e9,
    "NVIDIA H100 SXM": 3.35e12,
    "NVIDIA H100 PCIe": 2.0e12,
    "NVIDIA H100 NVL": 3.9e12,
    "NVIDIA H200": 4.8e12,
    "NVIDIA H200 NVL": 4.8e12,
}

# `jax.devices()[0].device_kind` (lowercased) -> PEAK_FLOPS key; first match wins. JAX names a
# v5p "TPU v5" (or "TPU v5p"), a v5e "TPU v5 lite", a v6e "TPU v6 lite"; CUDA names an H100 SXM
# "NVIDIA H100 80GB HBM3", an H200 SXM "NVIDIA H200", an A100 "NVIDIA A100-SXM4-80GB" (the kinds
# `jaxrubric plan --topology 8xH100` gives its GPUs, `plan/gpu_targets`). Unknown kinds (CPU,
# GH200, H800, ...) get no peak rather than a guess.
_DEVICE_KINDS = (
    (r"tpu v4", "TPU v4"),
    (r"tpu v5 ?(lite|e)", "TPU v5e"),
    (r"tpu v5p?", "TPU v5p"),
    (r"tpu v6 ?(lite|e)", "TPU v6e"),
    (r".*\ba100\b.*", "NVIDIA A100"),
    (r".*\bh100\b.*\bpcie\b.*", "NVIDIA H100 PCIe"),
    (r".*\bh100\b.*\bnvl\b.*", "NVIDIA H100 NVL"),
    (r".*\bh100\b.*", "NVIDIA H100 SXM"),
    (r".*\bh200\b.*\bnvl\b.*", "NVIDIA H200 NVL"),
    (r".*\bh200\b.*", "NVIDIA H200"),
)


def _chip(device_kind: str) -> str | None:
    """The tables' key for a `device_kind`, None when unknown."""
    kind = device_kind.strip().lower()
    return next((key for pattern, key in _DEVICE_KINDS if re.fullmatch(pattern, kind)), None)


def peak_flops(device_kind: str) -> float | None:
    """Dense bf16 peak FLOP/s of one device of this `device_kind`, None when unknown."""
    key = _chip(device_kind)
    return None if key is None else PEAK_FLOPS[key]


def hbm_bandwidth(device_kind: str) -> float | None:
    """HBM bytes/s of one device of this `device_kind`, None when unknown."""
    key = _chip(device_kind)
    return None if key is None else HBM_BANDWIDTH[key]


def mfu(model_flops: float, seconds: float, num_devices: int, device_kind: str
        ) -> float | None:
    """Model FLOPs utilisation: `model_flops` done in `seconds` on `num_devices` devices, as a
    fraction of their bf16 peak (whatever the compute dtype, as is the convention); None when
    the device's peak is unknown (e.g. CPU)."""
    if seconds <= 0 or num_devices < 1:
        raise ValueError(f"need seconds > 0 and num_devices >= 1, got {seconds}, {num_devices}")
    peak = peak_flops(device_kind)
    return None if peak is None else model_flops / (seconds * num_devices * peak)
