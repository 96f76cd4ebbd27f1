"""Which SDPA kernel `attention = "flash"` runs: measured on CUDA, named everywhere.

torch's default SDPA priority takes FlashAttention-2 where it can; on Hopper, cuDNN's
attention is often faster. So on CUDA the kernels that can run the model's attention
(its dtype, heads, head size, context) are timed, forward and backward, and the fastest
one goes first in SDPA's priority for the segment (`prefer`); the others stay behind it,
so a shape it cannot take falls back rather than fails. The pick is measured once per
device, dtype and shape in a process. On CPU there is one fused kernel: nothing to pick.

`kernel_name` asks SDPA itself which kernel it would take for the model's shape, so what
the screen names is what ran, not what was asked for.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

CANDIDATES: dict[str, SDPBackend] = {  # the fused kernels worth timing on CUDA, by the name shown
    "cuDNN": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
}
NAMES = {  # SDPA's own choice (torch._fused_sdp_choice's SDPBackend value) as people name it
    int(SDPBackend.MATH): "math",
    int(SDPBackend.FLASH_ATTENTION): "flash",
    int(SDPBackend.EFFICIENT_ATTENTION): "efficient",
    int(SDPBackend.CUDNN_ATTENTION): "cuDNN",
}
ROUNDS = 5  # timed forward+backward calls per kernel, after one untimed warm-up


@dataclass(frozen=True)
class Shape:
    """One attention call: (batch, heads, context, head size) in a dtype on a device."""

    batch: int
    heads: int
    seq: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v drawn from a generator of their own: the run's RNG (dropout, a bit-exact
        resume) is never touched by measuring."""
        size = (self.batch, self.heads, self.seq, self.head_dim)
        gen = torch.Generator(self.device).manual_seed(0)
        return tuple(torch.randn(size, dtype=self.dtype, device=self.device, generator=gen, requires_grad=True)
                     for _ in range(3))  # type: ignore[return-value]  # fmt: skip


@dataclass(frozen=True)
class Choice:
    """What was measured (ms per forward+backward; None: the kernel cannot run this shape) and
    the kernel picked (None: nothing to pick, SDPA's default stands)."""

    timings: dict[str, float | None]
    picked: str | None

    def text(self) -> str:
        """'cuDNN 0.84 ms, flash 1.02 ms, efficient n/a: cuDNN' (the doctor row, the ladder note)."""
        each = ", ".join(f"{n} {'n/a' if ms is None else f'{ms:.2f} ms'}" for n, ms in self.timings.items())
        return f"{each}: {self.picked or 'none runs this shape'}"


def time_kernel(name: str, shape: Shape, rounds: int = ROUNDS) -> float | None:
    """ms per causal forward+backward with only `name`'s kernel allowed; None if it cannot run it."""
    q, k, v = shape.tensors()
    cuda = shape.device.type == "cuda"

    def once() -> None:
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()

    try:
        # torch warns why each kernel it skips cannot run: that is what None says here
        with sdpa_kernel(CANDIDATES[name]), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            once()  # warm-up (and the refusal, when the kernel cannot take this shape)
            if cuda:
                torch.cuda.synchronize(shape.device)
            t0 = time.perf_counter()
            for _ in range(rounds):
                once()
            if cuda:
                torch.cuda.synchronize(shape.device)
    except RuntimeError:  # "No available kernel": not this shape, dtype or GPU
        return None
    return 1000 * (time.perf_counter() - t0) / rounds


def pick(timings: dict[str, float | None]) -> str | None:
    """The fastest kernel that ran (the first named wins a tie)."""
    ran = [(ms, i, n) for i, (n, ms) in enumerate(timings.items()) if ms is not None]
    return min(ran)[2] if ran else None


_measured: dict[Shape, Choice] = {}


def choose(shape: Shape, timer: Callable[[str, Shape], float | None] = time_kernel) -> Choice:
    """Time each candidate kernel on CUDA (once per shape in this process) and pick the fastest.
    Elsewhere nothing is timed and nothing picked."""
    if shape.device.type != "cuda":
        return Choice({}, None)
    if shape not in _measured:
        timings = {name: timer(name, shape) for name in CANDIDATES}
        _measured[shape] = Choice(timings, pick(timings))
    return _measured[shape]


def order(first: str | None) -> list[SDPBackend]:
    """SDPA's priority with `first` ahead of the other fused kernels, math last."""
    rest = [b for n, b in CANDIDATES.items() if n != first]
    return ([CANDIDATES[first]] if first else []) + rest + [SDPBackend.MATH]


@contextlib.contextmanager
def prefer(first: str | None) -> Iterator[None]:
    """SDPA's priority for a segment's life (its steps, evals and compile: the compiled graph
    keeps the kernel chosen while it was traced). Nothing changes when `first` is None."""
    if first is None:
        yield
        return
    with sdpa_kernel(order(first), set_priority=True):
        yield


def kernel_name(shape: Shape) -> str:
    """The kernel SDPA takes for this shape under the current priority (what runs, in words)."""
    size = (shape.batch, shape.heads, shape.seq, shape.head_dim)
    q, k, v = (torch.empty(size, dtype=shape.dtype, device=shape.device) for _ in range(3))  # only their shape counts
    try:
        chosen = torch._fused_sdp_choice(q, k, v, is_causal=True)
    except RuntimeError:
        return "none"
    return NAMES.get(int(chosen), f"kernel {int(chosen)}")


def shape_of(batch: int, n_head: int, seq: int, n_embd: int, dtype: torch.dtype, device: torch.device) -> Shape:
    """The attention call of a GPT with these settings."""
    return Shape(batch, n_head, seq, n_embd // n_head, dtype, device)
