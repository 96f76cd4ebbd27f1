"""The names `gpt2-tui --help` lists (ladder rungs, GPU-report parts), kept free of torch so
building the parser stays instant; bench.ladder and bench.gpu_report check theirs match."""

from __future__ import annotations

RUNG_NAMES: list[str] = [
    "baseline", "preload", "vectorized", "tf32", "amp", "compile", "flash", "pad_vocab", "fused", "chunked_loss",
]  # fmt: skip
PARTS: tuple[str, ...] = ("tests", "ladder", "best", "memory", "overhead")
