"""The names `gpt2-tui --help` lists (ladder rungs, GPU-report parts), kept free of torch so
building the parser stays instant; bench.gpu_report checks its parts match."""

from __future__ import annotations

from engine.settings import ladder

RUNG_NAMES: list[str] = ["baseline", *(r.name for r in ladder()[1])]  # the rungs live with the settings (engine/config.py)
LOSS_RUNG_NAMES: list[str] = [r.name for r in ladder("loss_rungs")[1]]  # bench --to-loss's rungs after the speed ladder's
PARTS: tuple[str, ...] = ("tests", "ladder", "best", "memory", "overhead")
