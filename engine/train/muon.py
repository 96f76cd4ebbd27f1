"""gpt2-tui's Muon: torch.optim.Muon's update (Nesterov momentum, then the momentum orthogonalized
by Newton-Schulz), computed so that a step costs little: the matrices of one shape are stacked
and orthogonalized by ONE batched Newton-Schulz (a 12-layer model's 48 matrices are 4 batched
iterations, not 48), the guard's skip verdict is honoured on the device with no copies, and under
DDP each rank orthogonalizes its share of each stack and all-gathers the rest; where the run
compiles (speed.compile) the Newton-Schulz is compiled too (build.finish sets `compiled`). Per
matrix the numbers are torch's (the same coefficients, eps, lr scaling and weight decay; the
iteration in bf16 where the device does bf16 natively, in fp32 where it would only emulate it:
tests/train/test_muon_fast.py checks a step against torch.optim.Muon), and the state is torch's
(one `momentum_buffer` per parameter, the same group keys), so a checkpoint is read and checked
as a torch Muon's (engine.train.checkpoint).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist

from engine.config import OptimConfig

# torch.optim.Muon's (torch/optim/_muon.py: Keller Jordan's quintic, tuned for slope at zero)
COEFFICIENTS = (3.4445, -4.7750, 2.0315)
EPS = 1e-7
NS_STEPS = 5
WARMUP_MOMENTUM = 0.85  # modded-nanogpt's momentum at step 0 when the warm-up is on


def momentum_at(step: int, o: OptimConfig) -> float:
    """Muon's momentum for `step` (0-based): with muon_momentum_warmup, a linear ramp from 0.85
    at step 0 to muon_momentum at the warm-up's end (modded-nanogpt's); else muon_momentum. A
    function of the step alone, so a resumed run sets exactly what a straight run did."""
    if o.muon_momentum_warmup <= 0 or step >= o.muon_momentum_warmup:
        return o.muon_momentum
    frac = step / o.muon_momentum_warmup
    return (1 - frac) * WARMUP_MOMENTUM + frac * o.muon_momentum


def orthogonalize(G: torch.Tensor, coefficients: tuple[float, float, float], steps: int, eps: float,
                  dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:  # fmt: skip
    """Newton-Schulz on a stack of same-shape matrices (n, rows, cols) at once, in `dtype` (bf16,
    torch's, where the device does it natively: engine.device.newton_schulz_dtype): per matrix
    exactly torch.optim.Muon's _zeropower_via_newtonschulz (wide orientation, Frobenius
    normalisation, the quintic a X + (b A + c A^2) X with A = X X^T)."""
    a, b, c = coefficients
    X = G.to(dtype)
    tall = G.size(-2) > G.size(-1)
    if tall:
        X = X.mT
    X = X / X.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)
    for _ in range(steps):
        A = X @ X.mT
        B = torch.baddbmm(A, A, A, beta=b, alpha=c)
        X = torch.baddbmm(X, B, X, beta=a)
    return X.mT if tall else X


@functools.cache
def compiled_orthogonalize() -> Callable[..., torch.Tensor]:
    """`orthogonalize` under torch.compile, made once a process: one graph per stack shape (a
    model has two or three), built at the first step that compiles, on the training thread."""
    return torch.compile(orthogonalize, dynamic=False)


def lr_scale(adjust_lr_fn: str | None, shape: torch.Size) -> float:
    """torch.optim.Muon's per-shape lr factor: original (None) sqrt(max(1, rows/cols)),
    match_rms_adamw 0.2 sqrt(max(rows, cols))."""
    rows, cols = shape[:2]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        return math.sqrt(max(1, rows / cols))
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    return 1.0


class Muon(torch.optim.Optimizer):
    """torch.optim.Muon's algorithm and state, stepped a shape at a time (see the module docstring).
    `step(skip=...)` takes the guard's 0/1 device verdict: where set, weights and momentum stay
    exactly as they were (the momentum's lerp gets its own buffer, the update is zeroed), with no
    host read."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float = 1e-3, weight_decay: float = 0.1,
                 momentum: float = 0.95, nesterov: bool = True,
                 ns_coefficients: tuple[float, float, float] = COEFFICIENTS, eps: float = EPS,
                 ns_steps: int = NS_STEPS, adjust_lr_fn: str | None = None) -> None:  # fmt: skip
        if lr < 0 or momentum < 0 or weight_decay < 0:
            raise ValueError(f"Muon needs lr, momentum and weight decay >= 0 (got {lr}, {momentum}, {weight_decay})")
        defaults = {"lr": lr, "weight_decay": weight_decay, "momentum": momentum, "nesterov": nesterov,
                    "ns_coefficients": ns_coefficients, "eps": eps, "ns_steps": ns_steps,
                    "adjust_lr_fn": adjust_lr_fn}  # fmt: skip
        super().__init__(params, defaults)
        self.compiled = False  # Newton-Schulz through torch.compile: the run's compile switch, not state
        self.ns_dtype = torch.bfloat16  # its dtype: the device's (engine.device.newton_schulz_dtype), not state
        for group in self.param_groups:
            if any(p.ndim != 2 for p in group["params"]):
                raise ValueError("Muon trains 2-D matrices only")

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None, skip: torch.Tensor | None = None) -> Any:
        """One Muon step over every parameter with a gradient; `skip` (a device 0/1 tensor) set:
        nothing changes."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        bad = None if skip is None else skip > 0
        for group in self.param_groups:
            stacks: dict[tuple[Any, ...], list[torch.Tensor]] = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
                # oriented wide (rows <= cols) as Newton-Schulz works on them: (4C, C) and (C, 4C) share a stack
                stacks.setdefault((min(p.shape), max(p.shape), p.dtype, p.device), []).append(p)
            for params in stacks.values():
                self._update(group, params, bad)
        return loss

    def _update(self, group: dict[str, Any], params: list[torch.Tensor], bad: torch.Tensor | None) -> None:
        """One stack of matrices of one shape or its transpose: momentum, one Newton-Schulz (the
        tall ones transposed to wide, as torch's does each), the update at each shape's lr."""
        grads = [p.grad for p in params]
        bufs = [self.state[p]["momentum_buffer"] for p in params]
        if bad is not None:  # a skipped step lerps each buffer to itself: exactly unchanged, whatever the grad
            grads = [torch.where(bad, b, g) for g, b in zip(grads, bufs)]
        momentum, lr, wd = group["momentum"], group["lr"], group["weight_decay"]
        torch._foreach_lerp_(bufs, grads, 1 - momentum)
        updates = torch._foreach_lerp(grads, bufs, momentum) if group["nesterov"] else bufs
        tall = [p.size(0) > p.size(1) for p in params]
        stack = torch.stack([(u.mT if t else u).to(self.ns_dtype) for u, t in zip(updates, tall)])  # NS's dtype
        del grads, updates  # freed before the iteration's temporaries are made
        ortho = self._orthogonalize(stack, group)
        del stack
        ortho = ortho.to(params[0].dtype)  # bf16 -> fp32 is exact: torch's add_ promotes the same way
        if bad is not None:
            ortho.masked_fill_(bad, 0)
        if wd:
            decay = 1 - lr * wd
            torch._foreach_mul_(params, decay if bad is None else torch.where(bad, 1.0, decay).to(params[0].dtype))
        outs = [o.mT if t else o for o, t in zip(ortho.unbind(0), tall)]
        for shape in dict.fromkeys(p.shape for p in params):
            mine = [i for i, p in enumerate(params) if p.shape == shape]
            torch._foreach_add_([params[i] for i in mine], [outs[i] for i in mine],
                                alpha=-lr * lr_scale(group["adjust_lr_fn"], shape))  # fmt: skip

    def _orthogonalize(self, U: torch.Tensor, group: dict[str, Any]) -> torch.Tensor:
        """Newton-Schulz over the stack; under DDP (world > 1) each rank takes every world-th
        slice of it (padded to a multiple of the world) and the results are all-gathered:
        every rank ends with the whole stack, each matrix computed once."""
        args = (group["ns_coefficients"], group["ns_steps"], group["eps"], self.ns_dtype)
        orthogonalize_ = compiled_orthogonalize() if self.compiled else orthogonalize
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        if world == 1:
            return orthogonalize_(U, *args)
        n = U.size(0)
        share = -(-n // world)
        if share * world != n:
            U = torch.cat([U, U.new_zeros(share * world - n, *U.shape[1:])])
        rank = dist.get_rank()
        mine = orthogonalize_(U[rank * share : (rank + 1) * share], *args).contiguous()
        out = mine.new_empty(share * world, *mine.shape[1:])
        dist.all_gather_into_tensor(out, mine)
        return out[:n]
