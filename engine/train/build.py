"""What a segment is built from, given its config: the precision context, the model, its
optimizer, its batch loaders (`parts`), then, once a resume has loaded its state into them,
the compiled forward and the attention kernel (`finish`). The trainer holds the `Parts`
(engine/train/trainer.py); each function here says what it decides and why.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ContextManager

import numpy as np

import torch

from engine import device as devices
from engine.config import OptimConfig, RunConfig
from engine.errors import UserError
from engine.train import attention, compile_cache, compiling, distributed, window
from engine.train.flops import flops_per_token, peak_flops
from engine.train.guard import StepGuard
from engine.dataset import Dataset
from engine.train.batches import BatchLoader, BatchSampler, documents
from engine.train.model import GPT
from engine.train.muon import Muon, momentum_at


@dataclass
class Parts:
    """What one segment trains with. `forward` is the model until `finish` compiles (and, under
    DDP, replicates) it; the attention fields name the SDPA kernel measured fastest (CUDA)."""

    device: torch.device
    device_label: str
    precision: str
    autocast: Callable[[], ContextManager[Any]]
    scaler: Any  # torch.amp.GradScaler (fp16) or None
    guard: StepGuard
    model: Any  # GPT, or FSDP2's sharded GPT
    parallel: str  # "single", "ddp" or "fsdp"
    optimizer: Any  # torch AdamW or MuonAdamW
    loader: BatchLoader
    val_batches: list[Any]
    forward: Any = None
    warmup: compiling.Warmup | None = None  # a compiled segment's counters, read after its first steps
    artifacts_note: str | None = None  # why the run's compile artifacts were ignored
    sdpa: Any = None  # SDPA's backend priority for the segment (attention.prefer)
    attention: str | None = None
    attention_ms: dict[str, float | None] = field(default_factory=dict)
    n_params: int = 0
    flops_token: int = 0
    peak: float | None = None  # the device's peak FLOP/s for MFU (CUDA only; None: unknown)


def parts(config: RunConfig, dataset: Dataset, dist: distributed.Context,
          init_state: Mapping[str, torch.Tensor] | None) -> Parts:  # fmt: skip
    """Device, precision, seeded model (sharded first under FSDP2: before its optimizer),
    optimizer and loaders: everything a resume loads its state into."""
    cfg = config
    device = distributed.place(devices.pick(cfg.speed.device), dist)
    precision = devices.precision(cfg.speed.precision, device.type)
    autocast, scaler = precision_context(precision, device)
    random.seed(cfg.train.seed)
    np.random.seed(cfg.train.seed)
    torch.manual_seed(cfg.train.seed)
    built = model(cfg, device, init_state)
    parallel = distributed.choose(cfg.speed.parallel, cfg, dist, device)
    if parallel == "fsdp":
        built = distributed.shard(built, device, dist, precision)
    train, val = loaders(cfg, dataset, device, dist)
    return Parts(device=device, device_label=devices.describe(device), precision=precision, autocast=autocast,
                 scaler=scaler, guard=StepGuard(cfg.train.max_bad_steps, device), model=built, parallel=parallel,
                 optimizer=optimizer(built, cfg.optim, device), loader=train, val_batches=val)  # fmt: skip


def finish(p: Parts, config: RunConfig, run_dir: Path) -> None:
    """Last, on the training thread, around the module whose state a resume just loaded: the
    compiled forward (its caches in gpt2-tui's, the run's saved artifacts first), DDP's
    replica, the SDPA kernel measured fastest on CUDA, and what MFU divides by. The kernel is
    picked first: the compile caches key on it (attention.cache_tag)."""
    cfg = config
    p.forward = p.model
    flex = window.runs_flex(cfg, p.device.type)
    p.model.use_flex(window.block_mask(cfg.seq_len, cfg.model.attn_window, p.device) if flex else None)
    if flex:  # every layer's window runs through FlexAttention: no SDPA kernel to time
        p.sdpa, p.attention_ms, p.attention = None, {}, window.FLEX
    elif cfg.model.attention == "flash":  # on CUDA the fastest kernel measured leads SDPA's priority
        dtype = devices.autocast_dtype(p.precision) or torch.float32
        shape = attention.shape_of(cfg.train.batch_size, cfg.model.n_head, cfg.seq_len, cfg.model.n_embd, dtype,
                                   p.device, cfg.model)  # the model's own call: its window, its layout  # fmt: skip
        choice = attention.choose(shape)  # rank 0's measurement on every rank
        p.sdpa, p.attention_ms = choice.picked, choice.timings
        with attention.prefer(p.sdpa):
            p.attention = attention.kernel_name(shape)
    if cfg.speed.compile:
        mode = None if cfg.speed.compile_mode == "default" else cfg.speed.compile_mode
        compile_cache.enable()  # PyTorch's compile caches in the gpt2-tui cache: a rerun skips the compile
        # a graph traced under another SDPA pick (or none) is another cache entry
        compile_cache.tag(attention.cache_tag(p.sdpa) if cfg.model.attention == "flash" else "")
        loaded, p.artifacts_note = compiling.load_artifacts(run_dir, p.device_label)
        p.warmup = compiling.Warmup(cfg.speed.compile_scope, loaded)
        p.forward = compiling.compile_forward(p.model, cfg.speed.compile_scope, mode)
    if isinstance(p.optimizer, MuonAdamW):  # its step compiled where the model is (a toggle too)
        p.optimizer.muon.compiled = cfg.speed.compile
    if p.parallel == "ddp":
        p.forward = distributed.replicate(p.forward, p.device)
    p.n_params = p.model.num_params()
    p.flops_token = flops_per_token(cfg.model, p.n_params, cfg.seq_len)
    p.peak = peak_flops(p.device_label, p.precision) if p.device.type == "cuda" else None


def precision_context(precision: str, device: torch.device) -> tuple[Callable[[], ContextManager[Any]], Any]:
    """(autocast factory, GradScaler or None) for a resolved precision; on CUDA, TF32 matmuls
    follow the precision (off only for fp32) and the peak-memory counter starts here."""
    if device.type == "cuda":
        set_tf32(precision != "fp32")
        torch.cuda.reset_peak_memory_stats(device)
    dtype = devices.autocast_dtype(precision)
    autocast = (lambda: torch.autocast(device.type, dtype=dtype)) if dtype is not None else contextlib.nullcontext
    scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None
    return autocast, scaler


def set_tf32(on: bool) -> None:
    """TF32 matmuls and cuDNN convolutions on or off, each through the one call that writes torch's
    legacy and new (fp32_precision, 2.9+) flags together: torch raises on reading one API after
    only the other was written ("a mix of the legacy and new APIs"), and Inductor's GEMM autotuner
    reads the legacy torch.get_float32_matmul_precision() (pytorch#196728: every max-autotune
    compile died at its first step). cuDNN's allow_tf32 setter sets its conv and RNN fp32_precision
    with its own flag; writing fp32_precision alone leaves allow_tf32 unreadable once off."""
    torch.set_float32_matmul_precision("high" if on else "highest")
    torch.backends.cudnn.allow_tf32 = on


def model(config: RunConfig, device: torch.device, init_state: Mapping[str, torch.Tensor] | None) -> GPT:
    """The model on its device; `init_state`: pretrained weights (`--init-from`) to start from."""
    built = GPT(config.model).to(device)
    if init_state is not None:
        built.load_state_dict(dict(init_state), strict=True)  # keeps the tie: lm_head is wte
    return built


def optimizer(module: torch.nn.Module, o: OptimConfig, device: torch.device) -> torch.optim.Optimizer | MuonAdamW:
    """AdamW with decay on the 2-D weights only; fused by default where PyTorch has the kernel:
    faster, and it honours the guard's device-side skip flag (found_inf), which keeps the
    loop free of host syncs. With `optimizer = "muon"`: Muon for the 2-D weight matrices inside
    the transformer blocks (muon_params), AdamW as above for the rest (MuonAdamW)."""
    params = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    matrices = {id(p) for p in muon_params(module)} if o.optimizer == "muon" else set()
    rest = [p for _, p in params if id(p) not in matrices]
    groups = [
        {"params": [p for p in rest if p.dim() >= 2], "weight_decay": o.weight_decay},
        {"params": [p for p in rest if p.dim() < 2], "weight_decay": 0.0},
    ]
    fused = o.fused if o.fused is not None else device.type in ("cuda", "cpu")
    try:
        adamw = torch.optim.AdamW(groups, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, fused=fused)
    except RuntimeError as err:
        raise UserError(f"fused AdamW is not available here ({err})", {"optim.fused": False}) from None
    if o.optimizer == "adamw":
        return adamw
    # ours (engine.train.muon): torch.optim.Muon's numbers, one Newton-Schulz per shape, the skip
    # on the device. No weight decay on the Muon matrices (modded-nanogpt's); adjust_lr_fn None =
    # Keller Jordan's original scaling, sqrt(max(1, rows/cols)), which the 0.02 default is tuned for
    muon = Muon([p for _, p in params if id(p) in matrices], lr=o.muon_lr, weight_decay=0.0,
                momentum=momentum_at(0, o), nesterov=True, adjust_lr_fn=None)  # fmt: skip
    muon.ns_dtype = devices.newton_schulz_dtype(device.type)  # bf16 only where the device does it natively
    return MuonAdamW(adamw, muon, o.muon_lr / o.lr)


def apply_settings(opt: torch.optim.Optimizer | MuonAdamW, o: OptimConfig, device: torch.device) -> None:
    """The run's settings over a resumed optimizer: load_state_dict puts back the groups a
    checkpoint saved (its betas, eps, weight decay, momentum, fused), so flags given at resume
    or a live toggle would train with the old values, and `fused` over unfused groups crashes
    the step (the trainer hands the fused kernel found_inf). Every group's hyper-parameters
    become what `optimizer` builds from `o` (the lr aside: set_lr sets it each step); only the
    state (moments, momentum, step counts) is the checkpoint's, each step count kept where
    its kernel reads it (fused: a float32 on the parameter's device; else on the CPU)."""
    adamw, muon = (opt.adamw, opt.muon) if isinstance(opt, MuonAdamW) else (opt, None)
    fused = o.fused if o.fused is not None else device.type in ("cuda", "cpu")
    adamw.defaults["fused"] = fused  # the trainer reads it: found_inf for the fused kernel only
    adamw._step_supports_amp_scaling = fused  # what torch's constructor sets with it (GradScaler)
    if muon is not None:
        opt.defaults["fused"] = False  # MuonAdamW: the step is skipped on the host (see its docstring)
    for i, group in enumerate(adamw.param_groups):  # optimizer(): the 2-D group decays, the 1-D one not
        group.update({k: v for k, v in adamw.defaults.items() if k != "lr"})
        group.update(betas=(o.beta1, o.beta2), eps=o.eps, weight_decay=o.weight_decay if i == 0 else 0.0,
                     fused=fused, foreach=None, capturable=False)  # fmt: skip
    for group in muon.param_groups if muon is not None else []:
        group.update({k: v for k, v in muon.defaults.items() if k != "lr"})
        group.update(momentum=o.muon_momentum, weight_decay=0.0, nesterov=True, adjust_lr_fn=None)
    for param, state in adamw.state.items():
        step = state.get("step")
        if isinstance(step, torch.Tensor):
            state["step"] = step.to(dtype=torch.float32, device=param.device if fused else "cpu")


def muon_params(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters Muon trains: the 2-D weight matrices inside the transformer blocks
    (attention and MLP projections). Embeddings, the lm_head tied to wte, LayerNorms and
    biases stay with AdamW: Muon's orthogonalized update suits hidden linear maps only."""
    return [p for n, p in module.named_parameters() if p.requires_grad and p.dim() == 2 and ".h." in f".{n}"]


class MuonAdamW:
    """Muon and AdamW stepped together as one optimizer, for the trainer, the GradScaler and
    the checkpoint: `param_groups` are AdamW's then Muon's, and `state_dict` is one torch-format
    dict over both (parameter ids numbered across them, AdamW's first), so a checkpoint is
    checked (engine.train.checkpoint) and resumed exactly like a plain AdamW's.

    `step_unless` skips a bad step on the device with no host read: AdamW's half through
    found_inf when fused, Muon's (engine.train.muon.Muon) through its own `skip`."""

    def __init__(self, adamw: torch.optim.Optimizer, muon: Muon, lr_scale: float):
        self.adamw, self.muon = adamw, muon
        self.lr_scale = lr_scale  # muon_lr / lr: the schedule's lr times this is Muon's
        self.defaults: dict[str, Any] = {"fused": False}  # no found_inf of its own: see step_unless

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.adamw.param_groups + self.muon.param_groups

    @property
    def state(self) -> dict[Any, Any]:
        return {**self.adamw.state, **self.muon.state}

    def set_lr(self, lr: float) -> None:
        for group in self.adamw.param_groups:
            group["lr"] = lr
        for group in self.muon.param_groups:
            group["lr"] = lr * self.lr_scale

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.adamw.zero_grad(set_to_none=set_to_none)
        self.muon.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        self.adamw.step()
        self.muon.step()

    def _split(self) -> int:
        return sum(len(g["params"]) for g in self.adamw.param_groups)

    def state_dict(self) -> dict[str, Any]:
        a, m, n = self.adamw.state_dict(), self.muon.state_dict(), self._split()
        groups = a["param_groups"] + [{**g, "params": [i + n for i in g["params"]]} for g in m["param_groups"]]
        return {"state": {**a["state"], **{i + n: v for i, v in m["state"].items()}}, "param_groups": groups}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        k, n = len(self.adamw.param_groups), self._split()
        groups, state = saved["param_groups"], saved["state"]
        self.adamw.load_state_dict({"state": {i: v for i, v in state.items() if i < n}, "param_groups": groups[:k]})
        self.muon.load_state_dict({"state": {i - n: v for i, v in state.items() if i >= n},
                                   "param_groups": [{**g, "params": [i - n for i in g["params"]]} for g in groups[k:]]})


KEPT_CHUNK_BYTES = 16 * 2**20  # parameter bytes stepped at once where a skip puts tensors back


def folds_clip(opt: torch.optim.Optimizer | MuonAdamW, model: torch.nn.Module) -> bool:
    """Whether the gradient clip folds into the optimizer step: fused AdamW divides the gradients
    by its `grad_scale` as its kernel reads them, so the clip's own pass over every gradient
    (read and write, ~1.5 GB a step at gpt2) is saved. Not Muon (its own step), not FSDP2's
    sharded gradients."""
    from engine.train import distributed

    return not isinstance(opt, MuonAdamW) and bool(opt.defaults.get("fused")) and not distributed.is_sharded(model)


def clip_scale(norm: torch.Tensor, clip: float) -> torch.Tensor:
    """What the gradients are divided by to clip them to `clip`: clip_grad_norm_'s factor
    (clip / (norm + 1e-6), at most 1) as a divisor, on the device, no sync."""
    return ((norm.float() + 1e-6) / clip).clamp(min=1.0)


def step_unless(opt: torch.optim.Optimizer | MuonAdamW, skip: torch.Tensor, on_device: bool | None = None,
                grad_scale: torch.Tensor | None = None) -> None:  # fmt: skip
    """The optimizer step, skipped where `skip` (the guard's 0/1 verdict) is set, with no host
    read on an accelerator. Fused AdamW honours it as found_inf: its kernel leaves weights,
    moments and step counts as they were; our Muon takes it as its `skip` (engine.train.muon:
    the update zeroed, no copies). Unfused AdamW reads none: on a GPU it steps a chunk of
    parameters at a time (KEPT_CHUNK_BYTES: the copies stay small) and puts back, where `skip`
    is set, everything the chunk's step changed (torch.where): weights, moments, and state the
    step created (zeros, as new); not put back: its step count where it lives on the host (a
    GPU's non-capturable AdamW), so its bias correction counts the step. On the CPU the
    verdict is already a number (its ops run in order: no queue to drain), so unfused AdamW
    reads it and steps or not: the put-back cost it 3x its step there (nano 7 -> 21 ms).
    `on_device` (None: not on the CPU) forces either form. `grad_scale` (clip_scale, where
    folds_clip): what the fused step divides each gradient by as it reads it, the clip."""
    on_device = skip.device.type != "cpu" if on_device is None else on_device
    if isinstance(opt, MuonAdamW):
        step_unless(opt.adamw, skip, on_device)
        opt.muon.step(skip=skip)
    elif opt.defaults.get("fused"):
        opt.found_inf = skip.float()
        opt.grad_scale = grad_scale  # type: ignore[attr-defined]  # None: the gradients as they are
        opt.step()
    elif not on_device:
        if not skip.item():
            opt.step()
    else:
        bad = skip > 0
        for chunk in _chunks(opt):
            _step_kept(opt, chunk, bad)


def _chunks(opt: torch.optim.Optimizer) -> list[list[torch.Tensor]]:
    """The parameters a step changes (those with a gradient), in chunks of about KEPT_CHUNK_BYTES."""
    chunks: list[list[torch.Tensor]] = [[]]
    size = 0
    for p in (p for g in opt.param_groups for p in g["params"] if p.grad is not None):
        if chunks[-1] and size + p.numel() * p.element_size() > KEPT_CHUNK_BYTES:
            chunks.append([])
            size = 0
        chunks[-1].append(p)
        size += p.numel() * p.element_size()
    return [c for c in chunks if c]


def _kept(opt: torch.optim.Optimizer, p: torch.Tensor, param: bool = True) -> list[torch.Tensor]:
    """What a step changes for `p` on its device (local shards under FSDP2)."""
    local = lambda t: t.to_local() if hasattr(t, "to_local") else t  # noqa: E731
    state = [v for v in opt.state.get(p, {}).values() if isinstance(v, torch.Tensor) and v.device == p.device]
    return [local(t) for t in ([p] if param else []) + state]


def _step_kept(opt: torch.optim.Optimizer, chunk: list[torch.Tensor], bad: torch.Tensor) -> None:
    """`opt.step()` over `chunk` alone, everything it changed put back where `bad`."""
    ids, groups = {id(p) for p in chunk}, [g["params"] for g in opt.param_groups]
    new = [p for p in chunk if not opt.state.get(p)]  # state this step creates: as new (zeros) where bad
    saved = [(t, t.clone()) for p in chunk for t in _kept(opt, p)]
    try:
        for g in opt.param_groups:
            g["params"] = [p for p in g["params"] if id(p) in ids]
        with torch.no_grad():
            opt.step()
            for t, old in saved:
                torch.where(bad, old, t, out=t)
            for t in (t for p in new for t in _kept(opt, p, param=False)):
                t.masked_fill_(bad, 0)
    finally:
        for g, params in zip(opt.param_groups, groups):
            g["params"] = params


def set_lr(opt: torch.optim.Optimizer | MuonAdamW, lr: float) -> None:
    """The schedule's lr for this step into every group (Muon's scaled by muon_lr / lr)."""
    if isinstance(opt, MuonAdamW):
        opt.set_lr(lr)
        return
    for group in opt.param_groups:
        group["lr"] = lr


def set_momentum(opt: torch.optim.Optimizer | MuonAdamW, o: OptimConfig, step: int) -> None:
    """Muon's momentum for `step` (its warm-up's ramp: engine.train.muon.momentum_at), set beside
    the lr each step: a function of the step alone, so a resume sets what a straight run did."""
    if isinstance(opt, MuonAdamW):
        for group in opt.muon.param_groups:
            group["momentum"] = momentum_at(step, o)


def loaders(
    config: RunConfig, dataset: Dataset, device: torch.device, dist: distributed.Context
) -> tuple[BatchLoader, list[Any]]:
    """(the training batches: this rank's share, pinned and prefetched where that helps;
    the validation batches: the same set at every eval, pinned where the training batches are)."""
    T, B, seed = config.seq_len, config.train.batch_size, config.train.seed
    sampler = distributed.train_sampler(dataset.train, B, T, seed, config.data.vectorized, dist)
    if config.data.align_docs:  # train rows only: the val set stays the one every recipe is judged on
        sampler.align(documents(dataset, T, B))
    idle = devices.idle_data_switches(device.type)  # switches that do nothing on this device
    train = BatchLoader(
        sampler, device, pin_memory=config.data.pin_memory and "data.pin_memory" not in idle,
        prefetch=config.data.prefetch and "data.prefetch" not in idle,
    )  # fmt: skip
    val = distributed.val_share(BatchSampler(dataset.val, B, T, seed=seed + 1, vectorized=True),
                                config.train.eval_batches, dist)  # fmt: skip
    if train.pin:  # pinned once, in place of the arrays: each eval's copies then never block the host
        val = [(torch.from_numpy(x).pin_memory(), torch.from_numpy(y).pin_memory()) for x, y in val]
    return train, val
