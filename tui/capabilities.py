"""What this machine can do, so the form disables (with the reason) what it cannot.

bf16 needs a GPU that has it (any CPU autocasts to it); fused AdamW and pinned memory are
CUDA-only; torch.compile needs dynamo support and a backend compiler (Triton on CUDA, a
C++ compiler on CPU).
"""

from __future__ import annotations

import functools
import shutil
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Capabilities:
    cuda: bool
    mps: bool
    bf16: bool  # on the auto-picked device
    device: str  # what "auto" picks
    device_name: str
    compile_reason: str | None  # None: torch.compile can run here
    gpus: int = 0  # CUDA devices visible: > 1 offers a multi-GPU (torchrun) launch


@functools.cache
def detect() -> Capabilities:
    import torch

    cuda = torch.cuda.is_available()
    mps = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
    device = "cuda" if cuda else "mps" if mps else "cpu"
    name = torch.cuda.get_device_name(0) if cuda else device.upper()
    bf16 = torch.cuda.is_bf16_supported() if cuda else True
    gpus = torch.cuda.device_count() if cuda else 0
    return Capabilities(cuda, mps, bf16, device, name, _compile_reason(cuda), gpus)


def _compile_reason(cuda: bool) -> str | None:
    try:
        from torch._dynamo.eval_frame import is_dynamo_supported

        if not is_dynamo_supported():
            return "torch.compile is not supported on this Python"
    except ImportError:
        return "this torch has no torch.compile"
    if cuda:
        try:
            import triton  # noqa: F401
        except ImportError:
            return "torch.compile on CUDA needs Triton, which is not installed"
        return None
    if not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
        return "torch.compile on CPU needs a C++ compiler (g++), none found"
    return None


def disabled(caps: Capabilities) -> dict[str, str]:
    """Switches the hardware can't use -> why (shown beside the disabled switch)."""
    out = {}
    if not caps.cuda:
        out["optim.fused"] = "CUDA only: no CUDA GPU here"
        out["data.pin_memory"] = "CUDA only: no CUDA GPU here"
    if caps.compile_reason:
        out["speed.compile"] = caps.compile_reason
        out["speed.compile_mode"] = caps.compile_reason
    return out


def refuse(values: dict[str, Any], caps: Capabilities) -> dict[str, str]:
    """Chosen values this machine can't run -> the reason, per field."""
    out = {}
    device = values.get("speed.device", "auto")
    if device == "cuda" and not caps.cuda:
        out["speed.device"] = "no CUDA GPU here; choose auto or cpu"
    if device == "mps" and not caps.mps:
        out["speed.device"] = "this machine has no MPS; choose auto or cpu"
    on_cuda = device == "cuda" or (device == "auto" and caps.cuda)
    if values.get("speed.precision") == "bf16" and on_cuda and not caps.bf16:
        out["speed.precision"] = "this GPU has no bf16; choose fp16 (with its GradScaler) or tf32"
    if values.get("speed.compile") and caps.compile_reason:
        out["speed.compile"] = caps.compile_reason
    if values.get("optim.fused") is True and not on_cuda:
        out["optim.fused"] = "fused AdamW is CUDA-only; leave it on auto"
    return out
