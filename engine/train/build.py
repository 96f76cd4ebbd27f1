"""What a segment is built from, given its config: the precision context, the model, its
optimizer, its batch loaders, its compiled forward. The trainer's set-up calls these in
order (engine/train/trainer.py `_setup`); each says what it decides and why.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any, ContextManager

import torch

from engine import device as devices
from engine.config import OptimConfig, RunConfig
from engine.errors import UserError
from engine.train import distributed
from engine.train.data import BatchLoader, BatchSampler, Dataset
from engine.train.model import GPT


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
    """TF32 matmuls and convolutions on or off. Where torch has the fp32_precision API (2.9+,
    whose allow_tf32 flags print a deprecation warning) it is set alone: torch refuses reading
    a mix of the two APIs. Older torch: set_float32_matmul_precision and cudnn's flag."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    if hasattr(matmul, "fp32_precision"):
        value = "tf32" if on else "ieee"
        matmul.fp32_precision = value
        conv = getattr(cudnn, "conv", None)
        (conv if conv is not None and hasattr(conv, "fp32_precision") else cudnn).fp32_precision = value
    else:
        torch.set_float32_matmul_precision("high" if on else "highest")
        cudnn.allow_tf32 = on


def model(config: RunConfig, device: torch.device, init_state: Mapping[str, torch.Tensor] | None) -> GPT:
    """The model on its device; `init_state`: pretrained weights (`--init-from`) to start from."""
    built = GPT(config.model).to(device)
    if init_state is not None:
        built.load_state_dict(dict(init_state), strict=True)  # keeps the tie: lm_head is wte
    return built


def optimizer(module: torch.nn.Module, o: OptimConfig, device: torch.device) -> torch.optim.Optimizer:
    """AdamW with decay on the 2-D weights only; fused by default where PyTorch has the kernel:
    faster, and it honours the guard's device-side skip flag (found_inf), which keeps the
    loop free of host syncs."""
    params = [p for p in module.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": o.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    fused = o.fused if o.fused is not None else device.type in ("cuda", "cpu")
    try:
        return torch.optim.AdamW(groups, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, fused=fused)
    except RuntimeError as err:
        raise UserError(f"fused AdamW is not available here ({err})", {"optim.fused": False}) from None


def loaders(
    config: RunConfig, dataset: Dataset, device: torch.device, dist: distributed.Context
) -> tuple[BatchLoader, list[Any]]:
    """(the training batches: this rank's share, pinned and prefetched where that helps;
    the validation batches: the same set at every eval)."""
    T, B, seed = config.seq_len, config.train.batch_size, config.train.seed
    sampler = distributed.train_sampler(dataset.train, B, T, seed, config.data.vectorized, dist)
    idle = devices.idle_data_switches(device.type)  # switches that do nothing on this device
    train = BatchLoader(
        sampler, device, pin_memory=config.data.pin_memory and "data.pin_memory" not in idle,
        prefetch=config.data.prefetch and "data.prefetch" not in idle,
    )  # fmt: skip
    val = BatchSampler(dataset.val, B, T, seed=seed + 1, vectorized=True)
    return train, distributed.val_share(val, config.train.eval_batches, dist)
