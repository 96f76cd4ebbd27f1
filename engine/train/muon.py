"""gpt2-tui's Muon: torch.optim.Muon's update (Nesterov momentum, then the momentum orthogonalized
by Newton-Schulz), computed so that a step costs little: the matrices of one shape are stacked
and orthogonalized by ONE batched Newton-Schulz (a 12-layer model's 48 matrices are 4 batched
iterations, not 48); the gradients are copied once a step (their stack: momentum, Nesterov and
the guard's skip verdict work in place on it, on the device; the momentum buffers are slices of
one bank a stack), and under DDP each rank orthogonalizes its share of each stack and
all-gathers the rest without waiting (one stack's gather overlaps the next one's work); where
the run compiles (speed.compile) the momentum stack and the Newton-Schulz are compiled too
(build.finish sets `compiled`), the first one fused pass. Per
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
from typing import Any, NamedTuple

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


def _tall(m: torch.Tensor) -> bool:
    return m.size(-2) > m.size(-1)


def _wide(m: torch.Tensor) -> torch.Tensor:
    """A matrix as Newton-Schulz takes it, rows <= cols: a tall one's transpose (a view)."""
    return m.mT if _tall(m) else m


def _as(p: torch.Tensor, wide: torch.Tensor) -> torch.Tensor:
    """A wide slice of a stack back in `p`'s shape (a view)."""
    return wide.mT if _tall(p) else wide


def orthogonalize(G: torch.Tensor, coefficients: tuple[float, float, float], steps: int, eps: float,
                  dtype: torch.dtype = torch.bfloat16, keep: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """Newton-Schulz on a stack of same-shape matrices (n, rows, cols) at once, in `dtype` (bf16,
    torch's, where the device does it natively: engine.device.newton_schulz_dtype): per matrix
    exactly torch.optim.Muon's _zeropower_via_newtonschulz (wide orientation, Frobenius
    normalisation, the quintic a X + (b A + c A^2) X with A = X X^T). `keep` (a 0/1 device
    tensor) 0: the result is exactly 0, folded into the normalisation (a divisor of inf)."""
    a, b, c = coefficients
    X = G.to(dtype)
    tall = _tall(G)
    if tall:
        X = X.mT
    norm = X.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)
    X = X / (norm if keep is None else norm / keep)  # keep 1: torch's division exactly; 0: X / inf = 0
    for _ in range(steps):
        A = X @ X.mT
        B = torch.baddbmm(A, A, A, beta=b, alpha=c)
        X = torch.baddbmm(X, B, X, beta=a)
    return X.mT if tall else X


def momentum_stack(grads: list[torch.Tensor], bank: torch.Tensor, momentum: float, nesterov: bool,
                   dtype: torch.dtype, bad: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
    """A stack's work before Newton-Schulz: the gradients stacked wide (n, rows, cols), the
    momentum `bank` lerped toward them in place by 1 - momentum, the Nesterov update
    made in place on the stack, cast to the iteration's dtype. `bad` set: the stack is zeroed
    (an inf or NaN gradient then reaches nothing) and the weight is 0, so the bank stays exactly
    as it was. Eager: one copy (the stack) and in-place passes; compiled: one fused pass."""
    G = torch.stack([_wide(g) for g in grads])  # the step's one copy
    weight: float | torch.Tensor = 1 - momentum
    if bad is not None:
        G.masked_fill_(bad, 0)
        weight = torch.where(bad, 0.0, weight)  # (): on the device, no host read
    bank.lerp_(G, weight)
    U = G.lerp_(bank, momentum) if nesterov else bank
    return U.to(dtype)  # fp32: the stack itself


@functools.cache
def compiled_momentum_stack() -> Callable[..., torch.Tensor]:
    """`momentum_stack` under torch.compile, made once a process: one graph per stack shape (the
    momentum is a float Dynamo does not specialize on: the warm-up's ramp never recompiles)."""
    return torch.compile(momentum_stack, dynamic=False)


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
    exactly as they were (folded into the step, see `_update`), with no host read."""

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
        self.compiled = False  # its step through torch.compile: the run's compile switch, not state
        self.ns_dtype = torch.bfloat16  # its dtype: the device's (engine.device.newton_schulz_dtype), not state
        self._banks: dict[int, tuple[torch.Tensor, list[torch.Tensor]]] = {}  # per stack: Muon._bank
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
        pending: _Launched | None = None  # the stack before: its gather in flight while this one computes
        for group in self.param_groups:
            stacks: dict[tuple[Any, ...], list[torch.Tensor]] = {}
            for p in group["params"]:  # by the wide shape (rows <= cols): (4C, C) and (C, 4C) share a stack
                if p.grad is not None:
                    stacks.setdefault((min(p.shape), max(p.shape), p.dtype, p.device), []).append(p)
            for params in sorted(stacks.values(), key=lambda ps: -sum(p.numel() for p in ps)):  # largest first
                launched = self._launch(group, params, bad)
                if pending is not None:
                    self._apply(pending)
                pending = launched
        if pending is not None:
            self._apply(pending)
        return loss

    def _bank(self, params: list[torch.Tensor]) -> torch.Tensor:
        """The stack's momentum as one (n, rows, cols) tensor, oriented wide, whose slices ARE the
        parameters' `momentum_buffer`s (so one lerp moves them all, and the state stays torch's):
        made at the first step, and again after a load replaced the buffers (its one copy)."""
        kept = self._banks.get(id(params[0]))
        bufs = [self.state[p].get("momentum_buffer") for p in params]
        if kept is not None and len(kept[1]) == len(bufs) and all(a is b for a, b in zip(kept[1], bufs)):
            return kept[0]
        bank = torch.stack([_wide(torch.zeros_like(p) if b is None else b) for p, b in zip(params, bufs)])
        for i, p in enumerate(params):
            self.state[p]["momentum_buffer"] = _as(p, bank[i])  # a view of the bank
        self._banks[id(params[0])] = (bank, [self.state[p]["momentum_buffer"] for p in params])
        return bank

    def _launch(self, group: dict[str, Any], params: list[torch.Tensor], bad: torch.Tensor | None) -> _Launched:
        """One stack of matrices of one shape or its transpose, up to its orthogonalized update:
        momentum and Nesterov on the gradients' stack (`momentum_stack`), then Newton-Schulz
        (`_orthogonalize`: under DDP this rank's share, its all-gather started, not waited for).
        A skipped step (`bad`) is folded in with no copy: the momentum as it was
        (`momentum_stack`), Newton-Schulz's input scaled by 0."""
        bank = self._bank(params)
        momentum_stack_ = compiled_momentum_stack() if self.compiled else momentum_stack
        U = momentum_stack_([p.grad for p in params], bank, group["momentum"], group["nesterov"], self.ns_dtype, bad)
        ortho, gather = self._orthogonalize(U, group, None if bad is None else ~bad)  # in the NS dtype
        return _Launched(group, params, bad, ortho, gather)

    def _apply(self, launched: _Launched) -> None:
        """A launched stack's update, once its gather (if any) is in: weight decay, then each shape
        at its lr straight from Newton-Schulz's result (no fp32 copy of it). On CUDA `wait` only
        orders the compute stream after the gather; the host goes on."""
        group, params, bad = launched.group, launched.params, launched.bad
        if launched.gather is not None:
            launched.gather.wait()
        lr, wd = group["lr"], group["weight_decay"]
        if wd:
            decay = 1 - lr * wd
            torch._foreach_mul_(params, decay if bad is None else torch.where(bad, 1.0, decay).to(params[0].dtype))
        outs = [_as(p, o) for p, o in zip(params, launched.ortho[: len(params)].unbind(0))]
        for shape in dict.fromkeys(p.shape for p in params):  # bf16 into fp32 adds exactly, as torch's add_ does
            mine = [i for i, p in enumerate(params) if p.shape == shape]
            torch._foreach_add_([params[i] for i in mine], [outs[i] for i in mine],
                                alpha=-lr * lr_scale(group["adjust_lr_fn"], shape))  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        """torch's, each buffer contiguous as its parameter (a tall one's bank view is a transpose)."""
        saved = super().state_dict()  # its per-parameter dicts are ours (self.state's): new ones, not edits
        saved["state"] = {i: {k: v.contiguous() if k == "momentum_buffer" else v for k, v in state.items()}
                          for i, state in saved["state"].items()}  # fmt: skip
        return saved

    def _orthogonalize(self, U: torch.Tensor, group: dict[str, Any],
                       keep: torch.Tensor | None) -> tuple[torch.Tensor, dist.Work | None]:  # fmt: skip
        """Newton-Schulz over the stack, and the all-gather still in flight (None: none). Under DDP
        (world > 1) rank r takes the r-th of `world` equal runs of the stack's matrices (the
        stack padded with zeros to a multiple of the world) and the results are all-gathered,
        asynchronously: every rank ends with the whole stack (its first n rows), each matrix
        computed once, and the gather overlaps the next stack's Newton-Schulz."""
        args = (group["ns_coefficients"], group["ns_steps"], group["eps"], self.ns_dtype, keep)
        orthogonalize_ = compiled_orthogonalize() if self.compiled else orthogonalize
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        if world == 1:
            return orthogonalize_(U, *args), None
        n = U.size(0)
        share = -(-n // world)
        if share * world != n:
            U = torch.cat([U, U.new_zeros(share * world - n, *U.shape[1:])])
        rank = dist.get_rank()
        mine = orthogonalize_(U[rank * share : (rank + 1) * share], *args).contiguous()
        out = mine.new_empty(share * world, *mine.shape[1:])
        return out, dist.all_gather_into_tensor(out, mine, async_op=True)


class _Launched(NamedTuple):
    """A stack between `Muon._launch` and `Muon._apply`: its orthogonalized update (under DDP
    padded to a multiple of the world, and whole only once `gather` is waited for)."""

    group: dict[str, Any]
    params: list[torch.Tensor]
    bad: torch.Tensor | None
    ortho: torch.Tensor
    gather: dist.Work | None
