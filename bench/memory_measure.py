"""What PyTorch really holds, measured device-independently, to hold the estimator to.

- `measure_saved`: one training forward of the real GPT under a
  `torch.autograd.graph.saved_tensors_hooks` that records every tensor autograd saves for
  backward, counted once per underlying storage (views of one buffer share it), split
  into activations and autocast's low-precision copies of the weights. Parameters saved
  by reference are not activations: the estimator counts them once as parameters.
- `measure_state`: the bytes of the real model's parameters, of its gradients after a
  backward, and of a torch.optim.AdamW's state after a step.
"""

from __future__ import annotations

import contextlib

import torch
from pydantic import BaseModel

from engine.config import RunConfig
from engine.train.model import GPT


class SavedBytes(BaseModel):
    activations: int  # saved storages that are neither parameters nor weight copies
    weight_copies: int  # autocast's bf16/fp16 copies of parameters, saved for backward
    tensors: int  # distinct storages saved


class StateBytes(BaseModel):
    parameters: int
    gradients: int
    optimizer: int


def _model_config(config: RunConfig):
    m = config.model
    if m.vocab_size is None:
        m = m.model_copy(update={"vocab_size": config.data.vocab_size})
    return m


def _autocast(config: RunConfig, device: torch.device):
    p = config.speed.precision
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(p)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


_VIEWS = {"TBackward0", "TransposeBackward0", "ViewBackward0", "PermuteBackward0", "ExpandBackward0"}


def _copy_of_parameter(t: torch.Tensor, params: set[int]) -> bool:
    """True if `t` is (a view of) a dtype cast of a parameter: its autograd history is
    ToCopy (maybe behind a transpose/view) ending at the parameter's AccumulateGrad."""
    fn = t.grad_fn
    while fn is not None and type(fn).__name__ in _VIEWS:
        fn = fn.next_functions[0][0]
    if fn is None or not type(fn).__name__.startswith("ToCopyBackward"):
        return False
    var = getattr(fn.next_functions[0][0], "variable", None)
    return var is not None and id(var) in params


def measure_saved(config: RunConfig, device: str = "cpu", seed: int = 0) -> SavedBytes:
    """Run one training forward (with targets) of `config`'s model and count what autograd saves."""
    dev = torch.device(device)
    torch.manual_seed(seed)
    model = GPT(_model_config(config)).to(dev)
    model.train()
    param_storages = {p.untyped_storage()._cdata for p in model.parameters()}
    param_ids = {id(p) for p in model.parameters()}
    seen: dict[int, tuple[int, bool]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        key = storage._cdata
        if key not in param_storages and key not in seen:
            seen[key] = (storage.nbytes(), _copy_of_parameter(t, param_ids))
        return t

    B, T, V = config.train.batch_size, config.seq_len, model.vocab_size
    x = torch.randint(0, V, (B, T), device=dev)
    y = torch.randint(0, V, (B, T), device=dev)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), _autocast(config, dev):
        _, loss = model(x, y)
    del loss
    acts = sum(n for n, copy in seen.values() if not copy)
    copies = sum(n for n, copy in seen.values() if copy)
    return SavedBytes(activations=acts, weight_copies=copies, tensors=len(seen))


def measure_state(config: RunConfig, device: str = "cpu", seed: int = 0) -> StateBytes:
    """Bytes of parameters, of gradients after one backward, of AdamW state after one step."""
    dev = torch.device(device)
    torch.manual_seed(seed)
    model = GPT(_model_config(config)).to(dev)
    params = list(model.parameters())  # unique: the tied embedding once
    o = config.optim
    optimizer = torch.optim.AdamW(
        [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": o.weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ],
        lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, fused=bool(o.fused) and dev.type == "cuda",
    )  # fmt: skip
    B, T, V = config.train.batch_size, config.seq_len, model.vocab_size
    x = torch.randint(0, V, (B, T), device=dev)
    y = torch.randint(0, V, (B, T), device=dev)
    with _autocast(config, dev):
        _, loss = model(x, y)
    loss.backward()
    optimizer.step()

    def nbytes(ts) -> int:
        return sum({t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in ts}.values())

    state = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    return StateBytes(
        parameters=nbytes(params),
        gradients=nbytes([p.grad for p in params if p.grad is not None]),
        optimizer=nbytes(state),
    )


class PeakBytes(BaseModel):
    peak: int  # most tensor bytes alive at once during one steady-state optimizer step
    by_category: dict[str, int]  # the profiler's categories at that moment


def measure_peak(config: RunConfig, dataset, run_dir) -> PeakBytes:  # dataset: engine.dataset.Dataset
    """The peak of live tensor bytes over one training step of the real Trainer, from the
    PyTorch profiler's memory timeline (works on CPU, where no allocator keeps a peak).

    `config` must come from open_data. The first step runs unmeasured so AdamW's state
    exists, as in every later step; nothing is written to run_dir.
    """
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX, MemoryProfileTimeline

    from engine.train.trainer import Trainer

    trainer = Trainer(config, run_dir, dataset)
    trainer.setup()
    try:
        trainer.train_step(config.optim.lr)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if trainer.parts.device.type == "cuda" else [])
        with profile(activities=activities, profile_memory=True, record_shapes=True, with_stack=True) as prof:
            trainer.train_step(config.optim.lr)
    finally:
        trainer.close()
    timeline = MemoryProfileTimeline(prof._memory_profile())
    device = "cpu" if trainer.parts.device.type == "cpu" else f"{trainer.parts.device.type}:{trainer.parts.device.index or 0}"
    _, sizes = timeline._coalesce_timeline(device)
    totals = [sum(row) for row in sizes]
    at = max(range(len(totals)), key=totals.__getitem__)
    names = [c.name.lower() if c is not None else "unknown" for c in _CATEGORY_TO_INDEX]
    return PeakBytes(peak=totals[at], by_category=dict(zip(names, sizes[at][1:], strict=True)))
