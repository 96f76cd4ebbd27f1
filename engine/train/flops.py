"""FLOPs per token, the peak-throughput table of real devices, and MFU.

MFU is only as true as the peak it divides by, so a device missing from the table gets
MFU None ("unknown"), never a guess. Peaks are dense (no sparsity) datasheet figures in
TFLOP/s for each precision mode we train in.
"""

from __future__ import annotations

import re

from engine.config import ModelConfig, Precision

# Dense datasheet peaks in TFLOP/s ("-": no such mode); the first name pattern (a regex on
# torch.cuda.get_device_name()) that matches wins. bf16/fp16: tensor cores, fp32 accumulation;
# tf32: tensor-core tf32; fp32: the plain CUDA-core rate (fp32 with TF32 disabled).
# H800 (the export H100, NVLink cut, same SMs and clocks): NVIDIA's H800 datasheet, the H100's
# figures. A10: NVIDIA A10 datasheet (bf16/fp16 125, tf32 62.5, fp32 31.2; halves of its sparse
# 250/125). A10G (AWS G5; no NVIDIA datasheet): the figures AWS and NVIDIA's A10G spec give,
# bf16/fp16 70, tf32 35 dense (140/70 sparse), fp32 31.2.
# pattern            bf16    fp16    tf32    fp32
_PEAK_TABLE = r"""
H[18]00.*PCIe        756     756     378     51.2
H100 NVL|H200 NVL    835     835     418     60
H100|H200|GH200|H800 989     989     494     67
A100                 312     312     156     19.5
A800                 312     312     156     19.5
A10G                 70      70      35      31.2
A10\b                125     125     62.5    31.2
L40S                 362     362     183     91.6
L40\b                181     181     90.5    90.5
\bL4\b               121     121     60      30.3
RTX A6000            154.8   154.8   77.4    38.7
RTX 6000 Ada         364.2   364.2   182.1   91.1
RTX 4090             165.2   165.2   82.6    82.6
RTX 3090             71      71      35.6    35.6
V100                 -       125     -       15.7
\bT4\b               -       65      -       8.1
"""


_PEAKS: list[tuple[str, dict[str, float]]] = [
    (name, {k: float(v) for k, v in zip(("bf16", "fp16", "tf32", "fp32"), vals) if v != "-"})
    for name, *vals in (line.rsplit(None, 4) for line in _PEAK_TABLE.strip().splitlines())
]


def flops_per_token(cfg: ModelConfig, n_params: int, seq_len: int) -> int:
    """Training FLOPs per token: 6N for the weights plus 12*L*H*Q*T for attention scores.

    N counts what a token is multiplied by. A lookup table costs no FLOPs, so the tables beyond
    the one the tied lm_head stands for are left out: wte when the head is untied (the head's own
    matrix is in), and the value-embed table; wpe stays in, as in GPT-2's published 6N. With a
    sliding window a query scores at most window + 1 keys (the model's FLOPs: a masked dense
    kernel still computes all T, which shows as a lower MFU)."""
    head_dim = cfg.n_embd // cfg.n_head
    tables = cfg.vocab_tables - 1  # the tied one is the head's matmul
    lookups = tables * cfg.padded_vocab_size * cfg.n_embd if tables else 0
    keys = seq_len if cfg.attn_window is None else min(seq_len, cfg.attn_window + 1)
    return 6 * (n_params - lookups) + 12 * cfg.n_layer * cfg.n_head * head_dim * keys


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
