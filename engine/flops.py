"""FLOPs per token, the peak-throughput table of real devices, and MFU.

MFU is only as true as the peak it divides by, so a device missing from the table gets
MFU None ("unknown"), never a guess. Peaks are dense (no sparsity) datasheet figures in
TFLOP/s for each precision mode we train in.
"""

from __future__ import annotations

import re

from engine.config import ModelConfig, Precision

# (name pattern matched against torch.cuda.get_device_name(), peaks by precision)
# bf16/fp16 are tensor-core peaks with fp32 accumulation; tf32 is the tensor-core tf32
# peak; fp32 is the plain CUDA-core rate (what "fp32" with TF32 disabled runs at).
_PEAKS: list[tuple[str, dict[str, float]]] = [
    (r"H100.*PCIe", {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.2}),
    (r"H100 NVL|H200 NVL", {"bf16": 835.0, "fp16": 835.0, "tf32": 418.0, "fp32": 60.0}),
    (r"H100|H200|GH200", {"bf16": 989.0, "fp16": 989.0, "tf32": 494.0, "fp32": 67.0}),
    (r"A100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    (r"A800", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    (r"L40S", {"bf16": 362.0, "fp16": 362.0, "tf32": 183.0, "fp32": 91.6}),
    (r"L40\b", {"bf16": 181.0, "fp16": 181.0, "tf32": 90.5, "fp32": 90.5}),
    (r"\bL4\b", {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    (r"RTX A6000", {"bf16": 154.8, "fp16": 154.8, "tf32": 77.4, "fp32": 38.7}),
    (r"RTX 6000 Ada", {"bf16": 364.2, "fp16": 364.2, "tf32": 182.1, "fp32": 91.1}),
    (r"RTX 4090", {"bf16": 165.2, "fp16": 165.2, "tf32": 82.6, "fp32": 82.6}),
    (r"RTX 3090", {"bf16": 71.0, "fp16": 71.0, "tf32": 35.6, "fp32": 35.6}),
    (r"V100", {"fp16": 125.0, "fp32": 15.7}),
    (r"\bT4\b", {"fp16": 65.0, "fp32": 8.1}),
]


def flops_per_token(cfg: ModelConfig, n_params: int, seq_len: int) -> int:
    """Training FLOPs per token: 6N for the weights plus 12*L*H*Q*T for attention scores."""
    head_dim = cfg.n_embd // cfg.n_head
    return 6 * n_params + 12 * cfg.n_layer * cfg.n_head * head_dim * seq_len


def peak_flops(device_name: str, precision: Precision) -> float | None:
    """Dense peak FLOP/s for this device and precision, or None when we don't know it."""
    for pattern, peaks in _PEAKS:
        if re.search(pattern, device_name):
            tflops = peaks.get(precision)
            return tflops * 1e12 if tflops is not None else None
    return None


def mfu(tokens_per_s: float, flops_token: int, peak: float | None, world_size: int = 1) -> float | None:
    """Model FLOPs utilization in [0, 1], or None when the device's peak is unknown."""
    if peak is None:
        return None
    return tokens_per_s * flops_token / (peak * world_size)
