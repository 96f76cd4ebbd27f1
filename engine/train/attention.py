"""Which SDPA kernel `attention = "flash"` runs: measured on CUDA, named everywhere.

torch's default SDPA priority takes FlashAttention-2 where it can; on Hopper, cuDNN's
attention is often faster. So on CUDA the kernels that can run the model's attention
(its dtype, heads, head size, context) are timed, forward and backward, and the fastest
one goes first in SDPA's priority for the segment (`prefer`); the others stay behind it,
so a shape it cannot take falls back rather than fails. The timing is fair (the GPU warmed,
the candidates alternated over rounds, each one's best kept), measured once per device, dtype
and shape in a process, on rank 0 alone under torchrun (every rank runs its pick). On CPU
there is one fused kernel: nothing to pick. The pick is part of the compile caches' key
(`cache_tag`): a graph traced under one pick is never loaded under another.

`kernel_name` asks SDPA itself which kernel it would take for the model's shape, so what
the screen names is what ran, not what was asked for.

The sliding window's kernel where FlexAttention runs it: engine/train/window.py.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.backends.cuda import (SDPAParams, can_use_cudnn_attention, can_use_efficient_attention,
                                 can_use_flash_attention)  # fmt: skip
from torch.nn.attention import SDPBackend, sdpa_kernel

from engine.train.window import banded

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
    int(SDPBackend.OVERRIDEABLE): "overrideable",
}
ROUNDS = 5  # rounds over the candidates; each kernel keeps its best (time_rounds)
PER_SAMPLE = 3  # forward+backward calls per timed sample
WARM_S = 0.5  # seconds of matmuls before timing: the GPU's clocks up from idle


@dataclass(frozen=True)
class Shape:
    """One attention call as the model makes it: (batch, heads, context, head size) in a dtype on
    a device, the sliding window's band mask (None: plain causal), and the layout q, k and v come
    in (views of the (B, T, 3C) projection, or tensors of their own where qk-norm or rotary made
    new q and k, value embeddings or the value residual a new v): the kernels are timed on the
    call that runs, not on a causal call of contiguous tensors."""

    batch: int
    heads: int
    seq: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device
    window: int | None = None
    qk_own: bool = False
    v_own: bool = False

    def tensors(self, filled: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v (B, H, T, D) with the model's strides, drawn from a generator of their own: the
        run's RNG (dropout, a bit-exact resume) is never touched by measuring. Leaves (detached
        views), so each timed call's backward starts afresh."""
        B, H, T, D = self.batch, self.heads, self.seq, self.head_dim
        gen = torch.Generator(self.device).manual_seed(0)
        size = (B, T, 3 * H * D)  # `filled` False: only the strides count (kernel_name), nothing drawn
        proj = (torch.randn(size, dtype=self.dtype, device=self.device, generator=gen) if filled else
                torch.empty(size, dtype=self.dtype, device=self.device))  # fmt: skip
        q, k, v = proj.split(H * D, dim=2)  # (B, T, C) views, as c_attn's output splits
        q, k = (q.clone(), k.clone()) if self.qk_own else (q, k)
        v = v.clone() if self.v_own else v
        return tuple(t.view(B, T, H, D).transpose(1, 2).detach().requires_grad_()
                     for t in (q, k, v))  # type: ignore[return-value]  # fmt: skip

    def mask(self) -> torch.Tensor | None:
        return band(self.seq, self.window, self.device)


def band(T: int, window: int | None, device: torch.device) -> torch.Tensor | None:
    """The sliding window's (T, T) mask, True = attended: causal and at most `window` back; None
    where it is the plain causal mask (no window, or one as long as the sequence)."""
    if not banded(window, T):
        return None
    i = torch.arange(T, device=device)
    back = i[:, None] - i[None, :]  # (T, T): how far key j is behind query i
    return (back >= 0) & (back <= window)


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


# cuDNN's SDPA up to 9.15 writes out of bounds for a sequence length that is not a multiple of 128
# (pytorch#169849, worst under CUDA-graph capture); torch itself deprioritizes it there, so do we
CUDNN_SAFE_FROM = 91600  # torch.backends.cudnn.version() of cuDNN 9.16
CUDNN_SEQ_MULTIPLE = 128


def cudnn_allowed(seq: int) -> bool:
    """Whether cuDNN's attention may be timed or preferred for sequences of `seq` tokens: any length
    from cuDNN 9.16 on, a multiple of 128 before it (torch's own rule: its default order avoids it)."""
    version = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return seq % CUDNN_SEQ_MULTIPLE == 0 or (version is not None and version >= CUDNN_SAFE_FROM)


def can_run(name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None) -> bool:
    """Whether `name`'s kernel takes this call (causal, or the window's `mask`), asked of SDPA's
    own checks with their reasons off: asked, not tried, so no why-not warning is printed and
    none needs hiding (warnings.catch_warnings() swaps the process's filters: not thread-safe,
    and the training thread's warnings would be lost meanwhile). On CPU the one fused kernel is
    SDPA's flash."""
    if q.device.type != "cuda":
        return name == "flash"
    if name == "cuDNN" and not cudnn_allowed(q.size(-2)):
        return False
    check = {"cuDNN": can_use_cudnn_attention, "flash": can_use_flash_attention,
             "efficient": can_use_efficient_attention}[name]  # fmt: skip
    return bool(check(SDPAParams(q, k, v, mask, 0.0, mask is None, False), False))


def warm(device: torch.device, seconds: float = WARM_S) -> None:
    """Matmuls for `seconds` before anything is timed: a GPU idle until now runs its first
    kernels at low clocks, which would favour whichever candidate happens to go last."""
    if device.type != "cuda":
        return
    a = torch.full((4096, 4096), 0.5, dtype=torch.float16, device=device)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(8):
            a @ a
        torch.cuda.synchronize(device)


def time_rounds(calls: dict[str, Callable[[], None]], rounds: int = ROUNDS, sync: Callable[[], None] = lambda: None,
                per_sample: int = PER_SAMPLE) -> dict[str, float]:  # fmt: skip
    """ms per call of each, measured fairly: `rounds` rounds over all of them, the order turned
    one place each round (none always first after the host's pause, none always last), and
    each one's best sample kept (noise only ever adds time). Call each once before: a first
    call pays its set-up (kernel load, workspace), which is no part of its speed."""
    names, best = list(calls), {n: float("inf") for n in calls}
    for r in range(rounds):
        turn = r % max(len(names), 1)
        for name in names[turn:] + names[:turn]:
            sync()
            t0 = time.perf_counter()
            for _ in range(per_sample):
                calls[name]()
            sync()
            best[name] = min(best[name], 1000 * (time.perf_counter() - t0) / per_sample)
    return best


def measure(shape: Shape, rounds: int = ROUNDS) -> dict[str, float | None]:
    """ms per forward+backward of each candidate kernel on the model's call (the window's mask,
    the model's layout: Shape), None where it cannot run it: each called once (set-up, and a
    refusal SDPA's checks did not foresee), the device warmed, then timed in alternating rounds
    (time_rounds)."""
    q, k, v = shape.tensors()
    mask = shape.mask()

    def call(name: str) -> Callable[[], None]:
        def once() -> None:
            with sdpa_kernel(CANDIDATES[name]):
                F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None).sum().backward()

        return once

    calls: dict[str, Callable[[], None]] = {}
    for name in CANDIDATES:
        if not can_run(name, q, k, v, mask):
            continue
        try:
            call(name)()
        except RuntimeError:  # "No available kernel": not this shape, dtype or GPU after all
            continue
        calls[name] = call(name)
    cuda = shape.device.type == "cuda"
    warm(shape.device)
    ms = time_rounds(calls, rounds, (lambda: torch.cuda.synchronize(shape.device)) if cuda else (lambda: None))
    return {name: ms.get(name) for name in CANDIDATES}


def pick(timings: dict[str, float | None]) -> str | None:
    """The fastest kernel that ran (the first named wins a tie)."""
    ran = [(ms, i, n) for i, (n, ms) in enumerate(timings.items()) if ms is not None]
    return min(ran)[2] if ran else None


_measured: dict[Shape, Choice] = {}


def choose(shape: Shape, timer: Callable[[Shape], dict[str, float | None]] = measure) -> Choice:
    """Time the candidate kernels on CUDA (once per shape in this process) and pick the fastest.
    Under torchrun rank 0 measures and every rank takes its timings (a broadcast): ranks that
    measured apart could pick different kernels, and a compiled graph per pick. Elsewhere
    nothing is timed and nothing picked."""
    from engine.train import distributed

    if shape.device.type != "cuda":
        return Choice({}, None)
    if shape not in _measured:
        timings = timer(shape) if distributed.current().is_main else None
        timings = distributed.broadcast_object(timings)
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


ENABLED = {  # SDPA's on/off switch per kernel (sdpa_kernel(...) without set_priority turns the rest off)
    "math": torch.backends.cuda.math_sdp_enabled,
    "flash": torch.backends.cuda.flash_sdp_enabled,
    "efficient": torch.backends.cuda.mem_efficient_sdp_enabled,
    "cuDNN": torch.backends.cuda.cudnn_sdp_enabled,
}


def cache_tag(first: str | None) -> str:
    """What decides which SDPA kernel a compiled graph holds, in words for the compile caches'
    key (compile_cache.tag): the priority `prefer(first)` sets and the kernels switched on now.
    The kernel is fixed when the graph is traced, yet torch's AOTAutograd and FX graph caches
    (on disk, shared by all of a user's runs) key on neither: without the tag a run under
    another pick loads the first pick's graph and runs its kernel while naming the new one."""
    with prefer(first):
        ranked = [NAMES.get(int(b), f"kernel {int(b)}") for b in torch._C._get_sdp_priority_order()]
    on = [name for name, enabled in ENABLED.items() if enabled()]
    return f"sdpa {'>'.join(ranked)} on {','.join(on)}"


def kernel_name(shape: Shape) -> str:
    """The kernel SDPA takes for the model's call under the current priority (what runs, in
    words): with the window's band mask FlashAttention takes none."""
    q, k, v = shape.tensors(filled=False)
    mask = shape.mask()
    try:
        chosen = torch._fused_sdp_choice(q, k, v, attn_mask=mask, is_causal=mask is None)
    except RuntimeError:
        return "none"
    return NAMES.get(int(chosen), f"kernel {int(chosen)}")


def shape_of(batch: int, n_head: int, seq: int, n_embd: int, dtype: torch.dtype, device: torch.device,
             model: Any = None) -> Shape:  # fmt: skip
    """The attention call of a GPT with these settings; `model` (its ModelConfig) adds the window
    and the layout its switches give q, k and v (engine.train.model.CausalSelfAttention)."""
    if model is None:
        return Shape(batch, n_head, seq, n_embd // n_head, dtype, device)
    mixed = set(model.value_embed_layers) | set(model.value_residual_layers)  # layers whose v is a tensor of its own
    return Shape(batch, n_head, seq, n_embd // n_head, dtype, device, window=model.attn_window,
                 qk_own=bool(model.qk_norm or model.positions == "rotary"),
                 v_own=2 * len(mixed) > model.n_layer)  # as most layers pass it  # fmt: skip
