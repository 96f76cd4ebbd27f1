"""The names `gpt2-tui --help` lists (ladder rungs, GPU-report parts), kept free of torch so
building the parser stays instant; bench.gpu_report checks its parts match."""

from __future__ import annotations

from bench.rungs import LOSS_RUNGS, RECIPE, RUNGS

RUNG_NAMES: list[str] = ["baseline", *(r.name for r in RUNGS)]  # the rungs' table: bench/rungs.py
LOSS_RUNG_NAMES: list[str] = [r.name for r in LOSS_RUNGS]  # bench --to-loss's rungs after the speed ladder's
RECIPE_NAMES: list[str] = [r.name for r in RECIPE]  # bench --recipe-ladder's tricks, in its order
PARTS: tuple[str, ...] = ("tests", "ladder", "best", "memory", "overhead")
