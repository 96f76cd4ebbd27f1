"""Check the memory estimator against what really happens; print the tables for docs/memory.md.

    python -m bench.memory_check            # on a CUDA GPU: the GPU tables (several minutes)
    python -m bench.memory_check --cpu      # anywhere: the saved-activation table

GPU: trains gpt2 and gpt2-medium for a few steps at several micro-batches (bf16, flash,
torch.compile off and on) with the real Trainer and compares torch.cuda.max_memory_allocated
with the predicted allocated peak; then takes the largest micro-batch the estimator says
fits this GPU, runs it and the next size up, and reports whether each ran or ran out of memory.
CPU: the saved-activation grid of tests/config/test_memory.py plus the presets' widths, measured
with saved_tensors_hooks against the formula; and the predicted allocated peak against the
live-tensor peak of a real Trainer step (the profiler's memory timeline).
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import itertools
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from engine import child, console
from engine import device

from engine.train import memory
from engine.text import human
from engine.config import RunConfig, resolve
from engine.errors import UserError

CPU_SHAPES = {
    "L2 H2 C32 V100 T32 B3": {"model.n_layer": 2, "model.n_head": 2, "model.n_embd": 32, "model.block_size": 32,
                              "model.vocab_size": 100, "train.batch_size": 3},
    "L3 H4 C64 V300 T64 B2 no-bias": {"model.n_layer": 3, "model.n_head": 4, "model.n_embd": 64,
                                      "model.block_size": 64, "model.vocab_size": 300, "model.bias": False,
                                      "train.batch_size": 2},
    "L1 H3 C48 V64 T40 B4 unpadded": {"model.n_layer": 1, "model.n_head": 3, "model.n_embd": 48,
                                      "model.block_size": 48, "model.vocab_size": 64, "model.pad_vocab": False,
                                      "train.batch_size": 4, "train.block_size": 40},
}  # fmt: skip


def _header(device: str) -> str:
    load = ""
    try:
        load = child.run(["uptime"], timeout=5).output.strip()
    except OSError:
        pass
    return (
        f"device: {device}; date: {dt.date.today().isoformat()}; torch {torch.__version__}; "
        f"command: `python -m bench.memory_check {' '.join(sys.argv[1:])}`".rstrip()
        + (f"; load: {load}" if load else "")
    )


def _pct(pred: int, real: int) -> str:
    return f"{(pred / real - 1) * 100:+.1f}%" if real else "n/a"


# ---------------------------------------------------------------- CPU: saved activations


def cpu_table() -> str:
    from bench.memory_measure import measure_saved

    rows = ["| shape | attention | precision | checkpointing | predicted | saved (measured) | error |",
            "|---|---|---|---|---:|---:|---:|"]  # fmt: skip
    grid = itertools.product(CPU_SHAPES.items(), ["flash", "manual"], ["fp32", "bf16"], [False, True])
    for (name, shape), attention, precision, ckpt in grid:
        cfg = resolve(None, None, shape | {"speed.device": "cpu", "model.attention": attention,
                                           "speed.precision": precision, "model.grad_checkpointing": ckpt})  # fmt: skip
        pred, real = memory.estimate(cfg).activation_bytes, measure_saved(cfg).activations
        rows.append(f"| {name} | {attention} | {precision} | {'on' if ckpt else 'off'} | {pred:,} | {real:,} | {_pct(pred, real)} |")
    for preset, attention in [("gpt2", "flash"), ("gpt2", "manual"), ("gpt2-medium", "flash"), ("gpt2-medium", "manual")]:
        cfg = resolve(preset, None, {"model.n_layer": 2, "speed.device": "cpu", "speed.precision": "bf16",
                                     "speed.compile": False, "train.batch_size": 1, "train.block_size": 128,
                                     "model.attention": attention})  # fmt: skip
        pred, real = memory.estimate(cfg).activation_bytes, measure_saved(cfg).activations
        rows.append(f"| {preset} widths, 2 layers, T128 B1 | {attention} | bf16 | off | {pred:,} | {real:,} | {_pct(pred, real)} |")
    return "\n".join(rows)


def cpu_peak_table() -> str:
    """Predicted allocated peak vs the live-tensor peak of one real Trainer step on CPU."""
    from bench.memory_measure import measure_peak
    from engine.run.preflight import prepared

    rows = ["| precision | attention | checkpointing | grad accum | predicted peak (phase) | measured peak | error |",
            "|---|---|---|---:|---:|---:|---:|"]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        data = _synthetic_dataset(Path(tmp) / "data", vocab=500, tokens=50_000)
        grid = [("fp32", "flash", False, 1), ("bf16", "flash", False, 2), ("bf16", "manual", True, 1),
                ("fp32", "manual", False, 2), ("bf16", "flash", True, 2), ("bf16", "manual", False, 1),
                ("fp32", "flash", True, 1)]  # fmt: skip
        for precision, attention, ckpt, accum in grid:
            cfg = resolve(None, None, {
                "model.n_layer": 2, "model.n_head": 2, "model.n_embd": 64, "model.block_size": 64,
                "train.batch_size": 8, "train.grad_accum": accum, "speed.device": "cpu",
                "speed.precision": precision, "model.attention": attention, "model.grad_checkpointing": ckpt,
                "data.path": str(data), "data.prefetch": False,
            })  # fmt: skip
            cfg, dataset = prepared(cfg, memory=False)
            est, real = memory.estimate(cfg), measure_peak(cfg, dataset, Path(tmp) / "run").peak
            rows.append(f"| {precision} | {attention} | {'on' if ckpt else 'off'} | {accum} | "
                        f"{est.allocated_peak_bytes:,} ({est.peak_phase}) | {real:,} | {_pct(est.allocated_peak_bytes, real)} |")  # fmt: skip
    return "\n".join(rows)


# ---------------------------------------------------------------- GPU: real training peaks


def _synthetic_dataset(root: Path, vocab: int = 50257, tokens: int = 4_000_000) -> Path:
    """Random GPT-2-vocab ids in our on-disk format: memory depends on shapes, not on text."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    rng.integers(0, vocab, tokens, dtype=np.int64).astype("<u2").tofile(root / "train.bin")
    rng.integers(0, vocab, tokens // 10, dtype=np.int64).astype("<u2").tofile(root / "val.bin")
    sidecar = {"format": "gpt2-tui", "version": 1, "dtype": "uint16", "vocab_size": vocab,
               "train_tokens": tokens, "val_tokens": tokens // 10, "tokenizer": None, "eot_id": None}  # fmt: skip
    (root / "dataset.json").write_text(json.dumps(sidecar))
    return root


def _gpu_config(preset: str, batch: int, compile_: bool, data: Path, steps: int) -> RunConfig:
    return resolve(preset, None, {
        "data.path": str(data), "model.vocab_size": 50257, "speed.device": "cuda", "speed.precision": "bf16",
        "model.attention": "flash", "speed.compile": compile_, "train.batch_size": batch, "train.grad_accum": 1,
        "train.block_size": 1024, "train.max_steps": steps, "train.log_interval": 1, "optim.warmup_steps": 0,
    })  # fmt: skip


def run_peak(config: RunConfig, workdir: Path) -> tuple[int | None, int | None, str]:
    """Train `config` for its max_steps with the real Trainer (evals and checkpoints skipped);
    (max_memory_allocated, max_memory_reserved, "ok" | "OOM" | error)."""
    from engine.train.trainer import measuring
    from engine.run.owner import start

    run_dir = Path(tempfile.mkdtemp(dir=workdir))
    torch._dynamo.reset()
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    outcome = "ok"
    try:
        start(config, run_dir / "run", force=True, components=measuring).run()
    except Exception as err:  # noqa: BLE001 - a failed run is a result here
        outcome = "OOM" if isinstance(err, torch.OutOfMemoryError) or "out of memory" in str(err) else f"error: {err}"
    allocated, reserved = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
    gc.collect()
    torch.cuda.empty_cache()
    return allocated, reserved, outcome


def largest_fitting_batch(config: RunConfig, device_bytes: int, limit: int = 4096) -> int:
    """The largest micro-batch (any size, not only divisors) the estimator says fits."""
    best = 0
    for b in range(1, limit + 1):
        if not memory.estimate(memory.with_batch(config, b, 1)).fits(device_bytes):
            break
        best = b
    return best


def gpu_tables(presets: list[str], batches: list[int], compile_modes: list[bool], steps: int) -> str:
    if not torch.cuda.is_available():
        raise UserError("no CUDA GPU here: run this on a GPU box, or pass --cpu for the saved-activation table")
    total = device.memory_bytes("cuda")
    assert total is not None
    out = [_header(torch.cuda.get_device_name()), "", f"GPU memory: {human(total)}", "",
           "| preset | compile | micro-batch | predicted allocated | max_memory_allocated | error "
           "| max_memory_reserved | reserved / allocated |",
           "|---|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data = _synthetic_dataset(work / "data")
        for preset, compile_, b in itertools.product(presets, compile_modes, batches):
            cfg = _gpu_config(preset, b, compile_, data, steps)
            pred = memory.estimate(cfg).allocated_peak_bytes
            alloc, reserved, outcome = run_peak(cfg, work)
            if outcome != "ok":
                out.append(f"| {preset} | {compile_} | {b} | {human(pred)} | {outcome} | | | |")
            else:
                out.append(f"| {preset} | {compile_} | {b} | {human(pred)} | {human(alloc)} | "
                           f"{_pct(pred, alloc)} | {human(reserved)} | {reserved / alloc:.3f} |")  # fmt: skip
            console.out.line(out[-1], flush=True)
        out += ["", "Largest micro-batch predicted to fit (peak incl. CUDA context and allocator margin "
                f"<= {human(total)}), run, and the next size up:", "",
                "| preset | compile | predicted largest | run at it | next size up |", "|---|---|---:|---|---|"]  # fmt: skip
        for preset, compile_ in itertools.product(presets, compile_modes):
            best = largest_fitting_batch(_gpu_config(preset, 1, compile_, data, steps), total)
            results = []
            for b in (best, best + 1):
                alloc, _, outcome = run_peak(_gpu_config(preset, b, compile_, data, steps), work)
                results.append(f"{outcome} ({human(alloc)} allocated)" if outcome == "ok" else outcome)
            out.append(f"| {preset} | {compile_} | {best} | {results[0]} | {results[1]} |")
            console.out.line(out[-1], flush=True)
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.memory_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu", action="store_true", help="the CPU saved-activation table (no GPU needed)")
    p.add_argument("--presets", default="gpt2,gpt2-medium")
    p.add_argument("--batch-sizes", default="4,8,16", help="micro-batches for the accuracy table")
    p.add_argument("--compile", choices=["both", "on", "off"], default="both")
    p.add_argument("--steps", type=int, default=3, help="optimizer steps per run (>= 2: AdamW state exists)")
    args = p.parse_args(argv)
    try:
        if args.cpu:
            console.out.line(_header("CPU (saved_tensors_hooks; device-independent)"))
            console.out.line()
            console.out.line(cpu_table())
            console.out.line()
            console.out.line("L2 H2 C64 V500 T64 B8, the real Trainer (prefetch off), one steady-state step profiled:")
            console.out.line()
            console.out.line(cpu_peak_table())
            return 0
        modes = {"both": [False, True], "on": [True], "off": [False]}[args.compile]
        batches = [int(b) for b in args.batch_sizes.split(",")]
        console.out.line(gpu_tables(args.presets.split(","), batches, modes, args.steps))
        return 0
    except UserError as err:
        console.err.line(f"error: {err}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
