"""`gpt2-tui doctor`: what a new box can run, checked before anything else.

The first thing to run on a new machine: versions, the GPU(s) and driver, free memory,
bf16/TF32/flash availability, what torch.compile needs (Triton and its compiler, Python.h),
NVML, the compile cache, and then a short real run of each switch on this device (the micro
preset, a few steps, on a tiny random dataset in a temporary directory) with pass/fail and
its time. Each check returns rows; this module prints nothing (engine.cli renders them).
A row whose status is "problem" carries its fix; the command exits 1 when any does.
On CPU the GPU rows say "needs a GPU", and the CPU's own checks and runs still count.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from engine import files

OK, INFO, PROBLEM, NEEDS_GPU, SKIPPED = "ok", "info", "problem", "needs a GPU", "skipped"
RUN_STEPS = 3
# optional packages -> what their absence switches off (none of them is a problem)
OPTIONAL = {
    "rich": "prepare's progress bar (plain lines instead)",
    "textual": "the app and the dashboard (headless commands still run)",
    "textual_plotext": "the dashboard's charts",
    "plotext": "the dashboard's charts",
    "pytest": "the GPU report's tests part",
    "pynvml": "GPU utilization, power and temperature in the dashboard (nvidia-ml-py)",
}


@dataclass(frozen=True)
class Row:
    """One check: `status` is ok, info, problem, needs a GPU or skipped; a problem has a `fix`."""

    section: str
    name: str
    status: str
    detail: str
    fix: str = ""
    seconds: float | None = None

    def line(self) -> str:
        """A problem in one line, with its fix."""
        return f"{self.name}: {self.detail}" + (f"; fix: {self.fix}" if self.fix else "")


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


# ---------------------------------------------------------------- the machine


def machine_rows() -> list[Row]:
    import torch

    from engine.train import compile_cache
    from engine.train.contention import half_reason
    from engine import device

    rows = [Row("machine", "python", OK, f"{platform.python_version()} ({sys.executable})"),
            Row("machine", "torch", OK, f"{torch.__version__} (CUDA {torch.version.cuda or 'none'})"),
            Row("machine", "cuDNN", INFO, _cudnn_text())]  # fmt: skip
    for dist in ("numpy", "tokenizers", "pydantic", "tomli-w"):
        v = _version(dist)
        rows.append(Row("machine", dist, OK if v else PROBLEM, v or "not installed",
                        "" if v else f"pip install {dist}"))  # fmt: skip
    for module, what in OPTIONAL.items():
        found = importlib.util.find_spec(module) is not None
        rows.append(Row("packages", module, OK if found else INFO, "installed" if found else f"not installed: no {what}"))
    cuda = torch.cuda.is_available()
    why = device.compile_reason(cuda)
    rows.append(Row("machine", "torch.compile", OK if why is None else PROBLEM,
                    "can run here" if why is None else why,
                    "" if why is None else "install what it names (e.g. build-essential python3-dev), "
                    "or train without --compile"))  # fmt: skip
    headers = device.python_headers_problem("this machine")
    rows.append(Row("machine", "Python.h", OK if headers is None else PROBLEM, "found" if headers is None else headers,
                    "" if headers is None else "install python3-dev (or your Python's headers)"))  # fmt: skip
    rows.append(Row("machine", "$CC / $CXX", INFO, f"CC={os.environ.get('CC') or '-'}, CXX={os.environ.get('CXX') or '-'} "
                    "(unset: Triton takes gcc, else clang; Inductor's CPU kernels g++)"))  # fmt: skip
    rows += _cache_rows(compile_cache.default_dir())
    ram = device.available_host_memory()
    from engine.text import human

    rows.append(Row("machine", "RAM available", INFO, human(ram) if ram else "unknown"))
    for half in ("bf16", "fp16"):  # the CPU's own half precision: emulated is ~1/400 of fp32
        slow = half_reason(half)
        rows.append(Row("machine", f"CPU {half}", INFO, slow or "native: the CPU does it in hardware"))
    return rows


def _cudnn_text() -> str:
    """cuDNN's version, and what it means for its attention (engine.train.attention.cudnn_allowed)."""
    import torch

    from engine.train.attention import CUDNN_SAFE_FROM, CUDNN_SEQ_MULTIPLE

    version = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    if version is None:
        return "not available"
    if version >= CUDNN_SAFE_FROM:
        return f"{version}: its attention takes any sequence length"
    return f"{version}: its attention is used only for sequence lengths that are a multiple of {CUDNN_SEQ_MULTIPLE}"


def _cache_rows(cache: Path) -> list[Row]:
    from engine.text import human

    existing = next((p for p in [cache, *cache.parents] if p.exists()), None)
    writable = existing is not None and os.access(existing, os.W_OK)
    rows = [Row("machine", "compile cache", OK if writable else PROBLEM, str(cache),
                "" if writable else f"make {existing} writable, or set GPT2_TUI_CACHE to a writable directory")]  # fmt: skip
    if existing is not None:
        free = shutil.disk_usage(existing).free
        low = free < 2 * 2**30
        rows.append(Row("machine", "free disk", PROBLEM if low else OK, f"{human(free)} at {existing}",
                        "free some disk space (checkpoints and the compile cache need a few GiB)" if low else ""))  # fmt: skip
    return rows


# ---------------------------------------------------------------- the GPU


def gpu_rows() -> list[Row]:
    import torch

    from engine import device, gpu_monitor
    from engine.text import human

    if not torch.cuda.is_available():
        why = "this torch has no CUDA build" if torch.version.cuda is None else "torch sees no CUDA GPU"
        return [Row("gpu", "CUDA", NEEDS_GPU, f"{why}: GPUs, driver, bf16, TF32, flash attention, Triton and pinned "
                    "memory are checked on a CUDA box")]  # fmt: skip
    rows = [Row("gpu", "CUDA", OK, f"torch built with CUDA {torch.version.cuda}; {torch.cuda.device_count()} GPU(s)")]
    for i in range(torch.cuda.device_count()):
        name, cap = torch.cuda.get_device_name(i), torch.cuda.get_device_capability(i)
        free, total = torch.cuda.mem_get_info(i)
        rows.append(Row("gpu", f"GPU {i}", OK, f"{name}, capability {cap[0]}.{cap[1]}, {human(free)} free of {human(total)}"))
    bf16 = device.has_bf16("cuda")  # the engine's own decision: emulated bf16 is none
    rows.append(Row("gpu", "bf16", OK if bf16 else INFO, "native" if bf16 else "emulated only: auto precision takes fp16"))
    tf32 = torch.cuda.get_device_capability(0) >= (8, 0)
    rows.append(Row("gpu", "TF32", OK if tf32 else INFO, "tensor cores (Ampere+)" if tf32 else "needs Ampere or newer"))
    flash = torch.backends.cuda.is_flash_attention_available()
    rows.append(Row("gpu", "flash SDPA", OK if flash else INFO, "available" if flash else "not in this build: SDPA picks another kernel"))
    rows.append(_attention_row())
    triton = _version("triton")
    rows.append(Row("gpu", "Triton", OK if triton else PROBLEM, triton or "not installed",
                    "" if triton else "pip install triton (the version your torch names), or train without --compile"))  # fmt: skip
    nvml, why = gpu_monitor.available()
    driver = _driver_version() if nvml else None
    rows.append(Row("gpu", "NVML", OK if nvml else INFO, (f"driver {driver}; " if driver else "") + why))
    return rows


def _attention_row() -> Row:
    """Each fused SDPA kernel timed on GPT-2's attention (bf16, B8 x 12 heads x T1024 x 64): the
    one `flash` runs is the fastest (engine.train.attention, measured again per run shape)."""
    import torch

    from engine.device import has_bf16
    from engine.train import attention

    dtype = torch.bfloat16 if has_bf16("cuda") else torch.float16
    choice = attention.choose(attention.shape_of(8, 12, 1024, 768, dtype, torch.device("cuda", 0)))
    return Row("gpu", "SDPA kernels", OK if choice.picked else PROBLEM, f"GPT-2 attention fwd+bwd: {choice.text()}",
               "" if choice.picked else "no fused kernel runs here: set attention to manual")  # fmt: skip


def _driver_version() -> str | None:
    try:
        import pynvml

        v = pynvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else str(v)
    except Exception:  # NVML is a nicety here: the row above says what is wrong
        return None


# ---------------------------------------------------------------- short real runs


def _switches(cuda: bool, include_compile: bool, gpus: int = 0) -> list[tuple[str, dict[str, Any] | str]]:
    """(name, config overrides) per switch, or (name, why it is not run here). Each run has an
    eval inside it (at its last step), so a switch that breaks only in eval mode (a compiled
    block under no_grad, CUDA graphs) fails here, not in someone's first hour."""
    gpu = "needs a GPU: CUDA only"
    compile_skip = "left out on CPU (about 40 s each); `gpt2-tui doctor --compile` runs it"
    compiled = cuda or include_compile
    out: list[tuple[str, dict[str, Any] | str]] = [
        ("eager fp32", {"speed.precision": "fp32"}),
        ("bf16 autocast", {"speed.precision": "bf16"}),
        ("fp16 + GradScaler", {"speed.precision": "fp16"}),
        ("fused AdamW", {"optim.fused": True}),
        # SDPA takes its flash kernel only in 16-bit on CUDA: in fp32 it would time another one
        ("flash attention", {"model.attention": "flash", "speed.precision": "bf16"} if cuda else {"model.attention": "flash"}),
        ("grad checkpointing", {"model.grad_checkpointing": True}),
        ("pinned + prefetch", {"data.pin_memory": True, "data.prefetch": True} if cuda else gpu),
        ("TF32", {"speed.precision": "tf32"} if cuda else gpu),
        ("torch.compile (+ eval)", {"speed.compile": True} if compiled else compile_skip),
        # the precision a GPU trains in: TF32 on, autocast's casts in the graph
        ("torch.compile bf16", {"speed.compile": True, "speed.precision": "bf16"} if compiled else compile_skip),
        # Inductor's GEMM autotuner reads the TF32 flags (the crash of issue 37 met it first)
        ("compile max-autotune (bf16)", {"speed.compile": True, "speed.compile_mode": "max-autotune-no-cudagraphs",
                                         "speed.precision": "bf16"} if cuda else gpu),  # fmt: skip
        ("compile + grad checkpointing", {"speed.compile": True, "model.grad_checkpointing": True} if compiled else compile_skip),
        ("CUDA graphs (reduce-overhead)", {"speed.compile": True, "speed.compile_mode": "reduce-overhead",
                                           "speed.compile_scope": "model"} if cuda else gpu),
        ("two ranks (DDP)", "not run by doctor (a torchrun launch): `gpt2-tui train --preset micro --nproc 2 --max-steps 5` checks them"
         if gpus >= 2 else "needs 2 GPUs: CUDA only"),
    ]
    return out


def run_rows(include_compile: bool = False, say: Callable[[str], None] | None = None) -> list[Row]:
    """A short real training run per switch on this device, each through engine.run.owner.start."""
    import numpy as np
    import torch

    from engine.config import resolve
    from engine.run.owner import start

    cuda = torch.cuda.is_available()
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpt2-tui-doctor-") as tmp:
        data = _tiny_dataset(Path(tmp) / "data", np)
        base = {"data.path": str(data), "speed.device": "cuda" if cuda else "cpu", "speed.precision": "fp32",
                "train.max_steps": RUN_STEPS, "train.eval_interval": RUN_STEPS, "train.ckpt_interval": 1000,
                "train.eval_batches": 1, "train.sample_tokens": 0, "train.batch_size": 4, "optim.warmup_steps": 0}  # fmt: skip
        for i, (name, over) in enumerate(_switches(cuda, include_compile, torch.cuda.device_count() if cuda else 0)):
            if isinstance(over, str):
                rows.append(Row("runs", name, NEEDS_GPU if over.startswith("needs") else SKIPPED, over))
                continue
            if say:
                say(f"doctor: {name}...")
            t0 = time.perf_counter()
            try:
                start(resolve("micro", None, base | over), Path(tmp) / f"run{i}").run()
            except Exception as err:  # a switch that fails here is exactly what the doctor reports
                line = str(err).strip().splitlines()[0] if str(err).strip() else ""
                rows.append(Row("runs", name, PROBLEM, f"failed: {type(err).__name__}: {line}"[:300],
                                "train without it here, or fix what it says", time.perf_counter() - t0))  # fmt: skip
            else:
                rows.append(Row("runs", name, OK, f"{RUN_STEPS} steps", seconds=time.perf_counter() - t0))
    return rows


def _tiny_dataset(root: Path, np: Any) -> Path:
    """A gpt2-tui dataset of random ids, vocab 64: the runs time switches, not learning."""
    from engine.dataset import FORMAT_NAME, FORMAT_VERSION, SIDECAR

    files.make_dir(root, exist_ok=False)
    rng = np.random.default_rng(0)
    files.atomic_write_bytes(root / "train.bin", rng.integers(0, 64, 8192).astype("<u2").tobytes())
    files.atomic_write_bytes(root / "val.bin", rng.integers(0, 64, 2048).astype("<u2").tobytes())
    import json

    files.write_text(root / SIDECAR, json.dumps({"format": FORMAT_NAME, "version": FORMAT_VERSION, "dtype": "uint16",
                                            "vocab_size": 64, "train_tokens": 8192, "val_tokens": 2048,
                                            "tokenizer": None, "eot_id": None}))  # fmt: skip
    return root


# ---------------------------------------------------------------- all of it


def diagnose(runs: bool = True, include_compile: bool = False, say: Callable[[str], None] | None = None) -> list[Row]:
    return machine_rows() + gpu_rows() + (run_rows(include_compile, say) if runs else [])


def problems(rows: list[Row]) -> list[Row]:
    return [r for r in rows if r.status == PROBLEM]


def to_table(rows: list[Row]) -> str:
    """Plain text: section, check, status, seconds, detail; then one line per problem with its fix."""
    head = ("section", "check", "status", "s", "detail")
    body = [(r.section, r.name, r.status, f"{r.seconds:.1f}" if r.seconds is not None else "", r.detail) for r in rows]
    widths = [max(len(str(x[i])) for x in [head, *body]) for i in range(4)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row[:4], widths)) + "  " + row[4] for row in [head, *body]]
    bad = problems(rows)
    lines.append("")
    lines += [f"problem: {r.line()}" for r in bad] or ["no problems found"]
    return "\n".join(lines)


def to_json(rows: list[Row]) -> dict[str, Any]:
    return {"rows": [asdict(r) for r in rows], "problems": [r.line() for r in problems(rows)], "ok": not problems(rows)}
