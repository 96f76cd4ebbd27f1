"""`gpt2-tui estimate` and the memory check `gpt2-tui train` runs before it allocates anything.

The budget the check uses: on CUDA the GPU's total memory (the estimate already adds the
CUDA context and an allocator margin); on MPS the recommended working set; on CPU the RAM
the kernel reports available now (MemAvailable), since the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from engine import memory
from engine.config import RunConfig, resolve
from engine.errors import UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    from engine.cli import _add_flags

    p.description = (
        "Predict the peak device memory of a training config, part by part, and whether it fits. "
        "Exit status 0 when it fits (or the device memory is unknown), 1 when it does not, 2 on bad input."
    )
    p.add_argument("--preset", help="model preset name or TOML file (default gpt2)")
    p.epilog = (
        "The vocab is --vocab-size, else the sidecar of --data DIR (our format), else 50257 (GPT-2's); "
        "the embedded default corpus has 8192, so pass --vocab-size 8192 to estimate a run on it."
    )
    p.add_argument("--config", type=Path, help="run config TOML")
    p.add_argument(
        "--device-memory", metavar="SIZE",
        help="plan for a device with this much memory (80GiB, 24GB, 512MiB); with --device auto this "
        "means a CUDA GPU. Default: this machine's training device",
    )  # fmt: skip
    p.add_argument("--world-size", type=int, default=1, help="ranks sharing the run (each gets its own estimate)")
    p.add_argument("--sharding", choices=["ddp", "fsdp"], default="ddp", help="how ranks split the model state")
    p.add_argument("--json", action="store_true", help="print the MemoryEstimate as JSON instead of the table")
    _add_flags(p)


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--force", action="store_true",
        help="start even when the memory estimate says the config does not fit (CUDA: GPU memory; "
        "CPU: the RAM available now; `gpt2-tui estimate` shows the breakdown)",
    )  # fmt: skip


def budget(target: str) -> tuple[int | None, str]:
    """(bytes the run may use on this machine, what that figure is)."""
    if target == "cpu":
        return memory.available_host_memory(), "RAM available"
    if target == "mps":
        return memory.device_memory_bytes("mps"), "MPS working set"
    return memory.device_memory_bytes("cuda"), "GPU memory"


def run_from_args(args: argparse.Namespace) -> int:
    from engine.cli import overrides_from

    if args.world_size < 1:
        raise UserError(f"--world-size must be at least 1 (got {args.world_size})")
    overrides = overrides_from(args)
    device_bytes = memory.parse_bytes(args.device_memory) if args.device_memory else None
    if device_bytes is not None and overrides.get("speed.device", "auto") == "auto":
        overrides["speed.device"] = "cuda"  # a memory size to plan for means a GPU
    config = resolve(args.preset or (None if args.config else "gpt2"), args.config, overrides)
    config = _vocab_from_sidecar(config)
    est = memory.estimate(config, args.world_size, args.sharding)
    if device_bytes is None:
        device_bytes, _ = budget(est.target)  # None when this machine lacks that device
    if args.json:
        print(est.model_dump_json(indent=2))
    else:
        print(memory.format_table(est, device_bytes))
        if device_bytes is not None and not est.fits(device_bytes):
            print(_advice(config, device_bytes, args.world_size, args.sharding))
    return 1 if device_bytes is not None and not est.fits(device_bytes) else 0


def _vocab_from_sidecar(config: RunConfig) -> RunConfig:
    """With --data DIR of ours and no --vocab-size, the vocab the run would get: the sidecar's
    (read from dataset.json alone: no token scan). Otherwise data.vocab_size (GPT-2's 50257)."""
    if config.model.vocab_size is not None or config.data.path is None:
        return config
    sidecar = Path(config.data.path) / "dataset.json"
    try:
        vocab = int(json.loads(sidecar.read_text())["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return config
    return config.model_copy(update={"model": config.model.model_copy(update={"vocab_size": vocab})})


def _advice(config: RunConfig, device_bytes: int, world_size: int, sharding: str) -> str:
    fitted = memory.suggest_fit(config, device_bytes, world_size, sharding)  # type: ignore[arg-type]
    if fitted is not None:
        return f"suggested fix: {memory.fix_flags(config, fitted)} (same sequences per optimizer step)"
    return (
        "even micro-batch 1 does not fit: try --grad-checkpointing, a shorter --block-size, "
        "bf16, more ranks with fsdp, or a smaller model"
    )


def check_train(config: RunConfig, force: bool) -> None:
    """Refuse, before anything is allocated, a config predicted not to fit this machine's device.

    `config` comes from open_data (vocab and block size bound). Under torchrun the estimate
    is per rank (WORLD_SIZE from the environment).
    """
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    parallel = getattr(config.speed, "parallel", "ddp")
    # `auto` takes DDP when it fits and FSDP otherwise (engine.distributed): either may do
    shardings = ["ddp", "fsdp"] if parallel == "auto" and world > 1 else ["fsdp" if parallel == "fsdp" else "ddp"]
    est = memory.estimate(config, world, shardings[0])  # type: ignore[arg-type]
    available, label = budget(est.target)
    if force or available is None:
        return
    for sharding in shardings:
        est = memory.estimate(config, world, sharding)  # type: ignore[arg-type]
        if est.fits(available):
            return
    biggest = sorted(est.breakdown.items(), key=lambda kv: -kv[1])[:2]
    parts = ", ".join(f"{k} {memory.human(v)}" for k, v in biggest)
    fitted = memory.suggest_fit(config, available, world, sharding)
    fix = (
        f"pass {memory.fix_flags(config, fitted)} (same sequences per step)"
        if fitted is not None
        else "even micro-batch 1 does not fit: use --grad-checkpointing, a shorter --block-size or a smaller model"
    )
    raise UserError(
        f"predicted peak memory {memory.human(est.peak_bytes)} exceeds the {memory.human(available)} of "
        f"{label} (largest: {parts}); {fix}, or --force to start anyway"
    )
