"""A live toggle is judged against one budget, the same in the engine and on the Switches
screen: the device memory free now plus what the running segment holds (it goes to the new
segment). Judged against free memory alone, a run using more than half the GPU had every
memory-growing toggle refused after the screen said it fits."""

from __future__ import annotations

import pytest

from engine import device

from engine.train import memory
from engine.config import resolve
from engine.errors import UserError
from engine.run import toggle

GiB = 2**30


def _gpu(monkeypatch, free: int, reserved: int) -> None:
    """A CUDA device as `budget` and `held_bytes` read it, on a CPU-only machine."""
    monkeypatch.setattr(device, "free_cuda_bytes", lambda index=None: free)
    monkeypatch.setattr(device.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(device.torch.cuda, "memory_reserved", lambda *a, **k: reserved)
    monkeypatch.setattr(device.torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)


def test_a_toggle_budget_counts_what_the_running_segment_holds(monkeypatch):
    _gpu(monkeypatch, free=10 * GiB, reserved=60 * GiB)
    assert device.budget("cuda") == (10 * GiB, "GPU memory free now")
    total, label = device.budget("cuda", held=device.held_bytes())
    assert total == 70 * GiB and "holds" in label


def test_the_engine_accepts_a_toggle_that_fits_in_free_plus_held(monkeypatch):
    """A run holding 60 GiB with 4 GiB free: a toggle whose new set needs more than 4 GiB
    but well under 64 is accepted by the engine's own check (the one the run makes)."""
    config = resolve("gpt2", None, {"speed.device": "cuda", "speed.precision": "fp16", "train.batch_size": 8,
                                    "model.vocab_size": 50257})  # fmt: skip
    need = memory.estimate(config.model_copy(update={"speed": config.speed.model_copy(update={"precision": "fp32"})})).peak_bytes
    assert 4 * GiB < need < 60 * GiB
    _gpu(monkeypatch, free=4 * GiB, reserved=60 * GiB)
    monkeypatch.setattr(device, "check", lambda *a, **k: None)  # no CUDA here to check the device against
    checked = toggle.check(config, {"speed.precision": "fp32"})
    assert checked.speed.precision == "fp32"
    with pytest.raises(UserError, match="exceeds"):
        toggle.check(config, {"speed.precision": "fp32"}, held=0)  # free memory alone: refused
