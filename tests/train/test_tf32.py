"""TF32 on and off through torch itself, no stand-ins: whatever reads the flags afterwards
(Inductor's GEMM autotuner reads torch.get_float32_matmul_precision(), its conv templates
cudnn.allow_tf32) gets an answer, not torch's "mix of the legacy and new APIs" error, which
killed every max-autotune compile at its first step (issue 37, pytorch#196728). torch keeps
these flags on a CPU build too, so the CUDA branch's effect on them is checked here."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from engine.train import build


@pytest.fixture(autouse=True)
def _restore_flags() -> Iterator[None]:
    """Leave torch's process-wide flags as a fresh process has them, through the same calls."""
    yield
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = True


def _readings() -> dict[str, object]:
    return {"matmul": torch.get_float32_matmul_precision(), "cudnn": torch.backends.cudnn.allow_tf32,
            "matmul new": torch.backends.cuda.matmul.fp32_precision,
            "conv new": torch.backends.cudnn.conv.fp32_precision}  # fmt: skip


@pytest.mark.parametrize("on, matmul, new", [(True, "high", "tf32"), (False, "highest", "ieee")])
def test_after_set_tf32_both_apis_answer_and_agree(on: bool, matmul: str, new: str) -> None:
    build.set_tf32(on)
    got = _readings()  # raised "mix of the legacy and new APIs" before the fix
    assert got["matmul"] == matmul and got["matmul new"] == new
    assert got["cudnn"] is on and (got["conv new"] == "tf32") is on


def test_the_autotuners_reading_survives_each_precision_in_turn() -> None:
    """A toggle or a later segment flips it: every order stays readable."""
    for on in (True, False, True):
        build.set_tf32(on)
        assert torch.get_float32_matmul_precision() == ("high" if on else "highest")
        assert torch.backends.cudnn.allow_tf32 is on
