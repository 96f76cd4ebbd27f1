"""The independent reference loop: it runs, it really trains, and it shares no code with us."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import torch

from bench import reference
from bench.reference import ReferenceShape, reference_step_times

TINY = ReferenceShape(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64, batch_size=4)


def test_three_steps_give_three_positive_times():
    tokens = np.random.default_rng(0).integers(0, 60, size=2000).astype(np.uint16)
    times = reference_step_times(tokens, TINY, 3)
    assert len(times) == 3 and all(isinstance(t, float) and t > 0 for t in times)


def test_loss_falls_on_a_repetitive_stream():
    """A period-8 stream is learnable in a few steps: the loss must fall well below ln(64)."""
    tokens = np.tile(np.arange(8, dtype=np.uint16), 500)
    losses: list[float] = []
    shape = ReferenceShape(**{**TINY.__dict__, "grad_accum": 2})
    reference_step_times(tokens, shape, 20, lr=3e-3, losses=losses)
    assert len(losses) == 20
    assert losses[0] > 3.5  # ~ln(64) = 4.16 at init
    assert losses[-1] < 0.5 * losses[0]


def test_bf16_runs_and_restores_matmul_precision():
    before = torch.get_float32_matmul_precision()
    tokens = np.random.default_rng(1).integers(0, 60, size=2000).astype(np.uint16)
    losses: list[float] = []
    reference_step_times(tokens, TINY, 2, precision="tf32")
    reference_step_times(tokens, TINY, 2, precision="bf16", losses=losses)
    assert all(np.isfinite(losses)) and torch.get_float32_matmul_precision() == before


def test_imports_nothing_from_engine():
    """Independence is the point: only the standard library, numpy and torch."""
    tree = ast.parse(Path(reference.__file__).read_text())
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative import"
            names.append(node.module or "")
    assert names and not [n for n in names if n == "engine" or n.startswith(("engine.", "tui"))]
    assert {n.split(".")[0] for n in names} <= {"__future__", "time", "dataclasses", "numpy", "torch"}
