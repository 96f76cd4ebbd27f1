"""Every device and precision decision, in one place: the trainer, the estimator, the
launcher and the form ask here, so they can never disagree.

- `auto` device: cuda > mps > cpu.
- `auto` precision: bf16 on a CUDA GPU that has it, fp16 (with a GradScaler) on an older
  CUDA GPU, fp32 elsewhere. Planning for CUDA from a machine without one assumes bf16.
- The memory budget a run is checked against: GPU memory on CUDA, the recommended working
  set on MPS, the RAM available now on CPU (the machine is shared).
- What this machine can run (compile, pinned memory, prefetch, bf16), with the reason
  when it cannot: the form disables those switches and says why. A CPU without native
  bf16/fp16 (cpu_native) runs them emulated, far slower than fp32: said, with the measure.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import platform
import shutil
import sys
import sysconfig
from dataclasses import dataclass
from typing import Any, Literal

import torch

from engine import child, files, switch_matrix
from engine.errors import UserError

Kind = Literal["cuda", "mps", "cpu"]
# The CUDA context with PyTorch's kernels (CUDA 12 lazy loading: typically 0.3-0.6 GiB): not
# seen by torch.cuda.max_memory_allocated, taken from the device all the same. The estimator
# counts it; the free-memory budget adds back the one its own query created.
CUDA_CONTEXT_BYTES = 512 * 2**20


def _mps() -> bool:
    return bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())


def kind(name: str) -> Kind:
    """The device kind a `speed.device` value means on this machine (auto: cuda > mps > cpu)."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "mps" if _mps() else "cpu"
    return name.split(":")[0]  # type: ignore[return-value]


def pick(name: str) -> torch.device:
    """The torch device to train on; a device this machine lacks is one clear line."""
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda asked for, but torch sees no CUDA GPU; use --device cpu or auto")
    if name == "mps" and not _mps():
        raise UserError("--device mps asked for, but this machine has no MPS; use --device cpu or auto")
    return torch.device(kind(name))


def has_bf16(device_kind: str) -> bool:
    """CPUs autocast to bf16; a CUDA GPU needs native bf16 (Ampere or newer), not emulation. Planning for CUDA from a machine
    without one assumes a current GPU (bf16)."""
    if device_kind == "cuda" and torch.cuda.is_available():
        return torch.cuda.is_bf16_supported(including_emulation=False)  # V100/T4 emulate it: fp16 there
    return True


def _cpu_flags() -> set[str]:
    """The CPU's feature flags (x86 `flags`, aarch64 `Features` in /proc/cpuinfo); empty off Linux."""
    try:
        for line in files.read_text("/proc/cpuinfo", files.PROC_CAP).splitlines():
            if line.split(":")[0].strip() in ("flags", "Features"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


# x86: torch's own probes of the CPU (private but present since 2.3), else /proc/cpuinfo's flags
_X86_NATIVE = {"bf16": (("_is_avx512_bf16_supported", "_is_amx_tile_supported"), {"avx512_bf16", "amx_bf16"}),
               "fp16": (("_is_amx_fp16_supported",), {"amx_fp16"})}  # fmt: skip
_ARM_NATIVE = {"bf16": "bf16", "fp16": "asimdhp"}


# Overrides the probe: the half precisions this CPU is to be taken as doing natively, comma-separated
# ("bf16", "bf16,fp16", or "none"). For a CPU the probe misjudges, and for the test suite, which runs
# every branch on each side whatever CPU it is on (`pytest --cpu-native=none|bf16|...`).
CPU_NATIVE_ENV = "GPT2_TUI_CPU_NATIVE"


def cpu_native(dtype: str) -> bool:
    """Whether this CPU does `dtype` (bf16 or fp16) math in hardware. Without it torch emulates
    it at a few hundredths of fp32's speed (bf16 on an AVX2 CPU: ~0.3 GFLOP/s vs ~130 fp32):
    avx512_bf16 or AMX for bf16, AMX-FP16 for fp16 (avx512_fp16 alone measured slower than
    fp32); on aarch64 the bf16 / asimdhp features. The ladder, the estimate and the form ask here."""
    forced = os.environ.get(CPU_NATIVE_ENV)
    if forced is not None:
        return dtype in {w.strip() for w in forced.split(",")}
    if platform.machine().lower() in ("aarch64", "arm64"):
        return _ARM_NATIVE[dtype] in _cpu_flags()
    names, flags = _X86_NATIVE[dtype]
    probes = [getattr(torch.cpu, n, None) for n in names]
    if any(callable(p) for p in probes):
        return any(bool(p()) for p in probes if callable(p))
    return bool(flags & _cpu_flags())


@functools.cache
def _matmul_ms(dtype: str) -> float:
    """The best timing of a 256x256 matmul in `dtype` on this CPU, in ms: as many tries as fit in
    ~50 ms (3 to 50), so a busy machine's pauses rarely stand in for the CPU's speed (< 0.3 s emulated)."""
    import time

    a = torch.randn(256, 256).to(autocast_dtype(dtype) or torch.float32)
    a @ a
    best, tries, spent = float("inf"), 0, 0.0
    while tries < 3 or (tries < 50 and spent < 0.05):
        t0 = time.perf_counter()
        a @ a
        took = time.perf_counter() - t0
        best, tries, spent = min(best, took), tries + 1, spent + took
    return 1000 * best


def cpu_half_reason(precision_name: str, measure: bool = True) -> str | None:
    """Why `precision_name` (bf16/fp16) is slow on this CPU, with the measured factor when asked
    (a factor, not a time: it holds better on a busy machine; engine.train.contention.half_reason
    says when it was timed on one, the front doors' road here); None when the CPU does it natively
    (or it is no half precision)."""
    if precision_name not in ("bf16", "fp16") or cpu_native(precision_name):
        return None
    why = {"bf16": "no avx512_bf16 or AMX", "fp16": "no AMX-FP16"}[precision_name]
    if platform.machine().lower() in ("aarch64", "arm64"):
        why = f"no {_ARM_NATIVE[precision_name]} feature"
    text = f"this CPU has no native {precision_name} ({why}): torch emulates it"
    if measure:
        half, full = _matmul_ms(precision_name), _matmul_ms("fp32")
        text += (f"; a 256x256 matmul took {half / full:.2g}x fp32's time here ({half:.1f} vs {full:.2f} ms, "
                 "the best of many tries)")  # fmt: skip
    return text


def precision(name: str, device_kind: str) -> str:
    """The precision a `speed.precision` value means on this device kind."""
    bf16 = has_bf16(device_kind)
    if name == "auto":
        return half_precision(device_kind) if device_kind == "cuda" else "fp32"
    for rule in switch_matrix.refusals({"speed.precision": name}, switch_matrix.Target(device_kind, bf16)):  # type: ignore[arg-type]
        why = rule.refusal({"speed.precision": name})
        raise UserError(why.problem, *why.fixes)
    return name


def newton_schulz_dtype(device_kind: str) -> torch.dtype:
    """The dtype Muon's Newton-Schulz iterates in on this device kind: bf16 (torch.optim.Muon's)
    where the device does it natively (a CUDA GPU with bf16, a CPU with avx512_bf16 or AMX), fp32
    where it would only emulate it (an AVX2 or AMD EPYC CPU: emulated bf16 took ~30x fp32's time)."""
    native = cpu_native("bf16") if device_kind == "cpu" else has_bf16(device_kind)
    return torch.bfloat16 if native else torch.float32


def half_precision(device_kind: str) -> str:
    """The 16-bit autocast this device kind runs: bf16 where it is native (CPUs autocast to
    bf16), else fp16 with its GradScaler (a V100 or T4 only emulates bf16)."""
    return "bf16" if has_bf16(device_kind) else "fp16"


def autocast_dtype(precision_name: str) -> torch.dtype | None:
    """The autocast dtype of a resolved precision; None: no autocast (fp32, tf32)."""
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision_name)


def describe(device: torch.device) -> str:
    """The name shown for a device: the GPU's model, or the CPU's."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{device.type.upper()} ({platform.processor() or platform.machine()})"


def memory_bytes(name: str = "auto") -> int | None:
    """Total memory of a device (GPU memory; MPS's working set; physical RAM on CPU), or None."""
    k = kind(name)
    if k == "cuda":
        if not torch.cuda.is_available():
            return None
        index = int(name.split(":")[1]) if ":" in name else torch.cuda.current_device()
        return int(torch.cuda.get_device_properties(index).total_memory)
    if k == "mps":
        try:
            return int(torch.mps.recommended_max_memory()) if _mps() else None
        except (AttributeError, RuntimeError):
            return None
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def available_host_memory() -> int | None:
    """RAM a new allocation can get now (MemAvailable), or None off Linux."""
    try:
        for line in files.read_text("/proc/meminfo", files.PROC_CAP).splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def free_cuda_bytes(index: int | None = None) -> int | None:
    """Memory free on a GPU now: other processes' share is not the run's. Under torchrun each
    rank asks for its own GPU (LOCAL_RANK). A process without a CUDA context yet (the --nproc
    launcher, the form) reads NVML, which makes none; else torch.cuda.mem_get_info, and when
    that call is what created the context, the context is added back (the estimate counts it)."""
    if not torch.cuda.is_available():
        return None
    fresh = not torch.cuda.is_initialized()
    if index is None:
        local = os.environ.get("LOCAL_RANK", "")
        index = int(local) if local.isdigit() else (0 if fresh else torch.cuda.current_device())
    if fresh:  # no CUDA context here yet: NVML answers without making one (the launcher, the form)
        from engine import gpu_monitor

        nvml = gpu_monitor.free_bytes(index)
        if nvml is not None:
            return nvml
    free, _total = torch.cuda.mem_get_info(index)
    if fresh:
        free += CUDA_CONTEXT_BYTES
    return int(free)


def budget(device_kind: str, held: int | None = None) -> tuple[int | None, str]:
    """(bytes a run may use on this machine's device of that kind, what that figure is):
    on CUDA the memory free now, not the card's total. `held`: a live toggle's budget, where
    the running segment's memory (what its process holds: `held_bytes()` in that process)
    goes to the new segment: free now + held. The engine's toggle check and the app's
    Switches screen both ask here, so what one accepts the other does."""
    if device_kind == "cpu":
        return available_host_memory(), "RAM available"
    if device_kind == "mps":
        return memory_bytes("mps"), "MPS working set"
    free = free_cuda_bytes()
    if held is None:
        return free, "GPU memory free now"
    return (None if free is None else free + held), "GPU memory free now + what the run holds"


def held_bytes() -> int:
    """GPU memory this process has reserved (its running segment's, before a hand-over)."""
    return torch.cuda.memory_reserved() if torch.cuda.is_available() else 0


def check(device_name: str, precision_name: str, compile_: bool) -> None:
    """Refuse, before anything is written, a device, precision or compile this machine cannot run."""
    k = pick(device_name).type
    precision(precision_name, k)
    why = compile_reason(k == "cuda") if compile_ else None
    if why:
        raise UserError(f"--compile cannot run here: {why}; install it, or run without compiling (--no-compile)")


# ---------------------------------------------------------------- what this machine can run


@dataclass(frozen=True)
class Capabilities:
    cuda: bool
    mps: bool
    bf16: bool  # on the auto-picked device
    device: str  # what "auto" picks
    device_name: str
    compile_reason: str | None  # None: torch.compile can run here
    gpus: int = 0  # CUDA devices visible: > 1 offers a multi-GPU (torchrun) launch


@functools.cache
def capabilities() -> Capabilities:
    cuda = torch.cuda.is_available()
    k = kind("auto")
    name = torch.cuda.get_device_name(0) if cuda else k.upper()
    gpus = torch.cuda.device_count() if cuda else 0
    return Capabilities(cuda, _mps(), has_bf16(k), k, name, compile_reason(cuda), gpus)


def compile_reason(cuda: bool) -> str | None:
    """Why torch.compile cannot run here (None: it can): what is missing, in words. Checked the
    way the compilers look: on CPU, Inductor uses $CXX (else g++) with Python's C headers; on
    CUDA, Triton builds its driver stub with $CC, else gcc, else clang (triton/runtime/build.py;
    never plain `cc`), against Python.h too. Without this, a missing compiler is a page of
    traceback at step 1."""
    try:
        from torch._dynamo.eval_frame import is_dynamo_supported

        if not is_dynamo_supported():
            return "torch.compile is not supported on this Python"
    except ImportError:
        return "this torch has no torch.compile"
    if cuda:
        if importlib.util.find_spec("triton") is None:
            return "torch.compile on CUDA needs Triton, which is not installed"
        found = os.environ.get("CC") or next((c for c in ("gcc", "clang") if shutil.which(c)), None)
        if found is None:
            return "torch.compile on CUDA needs a C compiler for Triton: neither $CC, gcc nor clang was found (e.g. the build-essential package)"
        return _compiler_problem("CC", found, "Triton's C compiler") or python_headers_problem("CUDA")
    default = "clang++" if sys.platform == "darwin" else "g++"
    return _compiler_problem("CXX", os.environ.get("CXX") or default, "a C++ compiler") or python_headers_problem("CPU")


def python_headers_problem(where: str) -> str | None:
    """None when Python's C headers (Python.h) are installed: Inductor's C++ kernels and
    Triton's driver stub both compile against them."""
    include = sysconfig.get_paths().get("include") or ""
    if os.path.isfile(os.path.join(include, "Python.h")):
        return None
    return f"torch.compile on {where} needs Python's C headers (Python.h, e.g. the python3-dev package), not found in {include}"


@functools.cache
def _compiler_problem(env: str, name: str, what: str) -> str | None:
    """None when the compiler `name` runs (`NAME --version`), else what is wrong with it."""
    source = f"{name} (from ${env})" if os.environ.get(env) else name
    exe = shutil.which(name)
    if exe is None:
        return f"torch.compile needs {what}: {source} was not found"
    try:
        ran = child.run([exe, "--version"], timeout=20)
    except OSError:
        ran = None
    if ran is None or ran.returncode != 0:
        return f"torch.compile needs {what}: {source} does not run"
    return None


def idle_data_switches(device_kind: str) -> dict[str, str]:
    """The data switches that do nothing on this device kind -> why (engine/switch_matrix.py
    IDLE: pinned buffers and the prefetch thread overlap host work with an accelerator's). The
    trainer, the estimator, the ladder and the form all ask here."""
    idle = switch_matrix.idle_switches(switch_matrix.Target(device_kind))  # type: ignore[arg-type]
    return {k: v for k, v in idle.items() if k.startswith("data.")}


def target(caps: Capabilities, device: str = "auto") -> switch_matrix.Target:
    """This machine as engine/switch_matrix.py's Target, for a `speed.device` value."""
    k = caps.device if device == "auto" else device.split(":")[0]
    return switch_matrix.Target(k, caps.bf16 if k == caps.device else True, max(1, caps.gpus))  # type: ignore[arg-type]


def disabled(caps: Capabilities) -> dict[str, str]:
    """Switches the hardware can't use -> why (shown beside the disabled switch)."""
    out = idle_data_switches("cuda" if caps.cuda else "mps" if caps.mps else "cpu")
    if caps.compile_reason:
        out["speed.compile"] = caps.compile_reason
        out["speed.compile_mode"] = caps.compile_reason
        out["speed.compile_scope"] = caps.compile_reason
    return out


def _field_words(dotted: str, value: Any) -> str:
    return f"{dotted.split('.')[1].replace('_', ' ')} {value}"


def refuse(values: dict[str, Any], caps: Capabilities) -> dict[str, str]:
    """Chosen values this machine can't run -> the reason, per field."""
    out = {}
    device = values.get("speed.device", "auto")
    if device == "cuda" and not caps.cuda:
        out["speed.device"] = "no CUDA GPU here; choose auto or cpu"
    if device == "mps" and not caps.mps:
        out["speed.device"] = "this machine has no MPS; choose auto or cpu"
    for rule in switch_matrix.refusals(values, target(caps, device)):  # the switch matrix, on this machine
        for dotted in rule.settings:
            if dotted in values:
                out.setdefault(dotted, rule.refusal(values).words(_field_words, verb="choose "))
    if values.get("speed.compile") and caps.compile_reason:
        out["speed.compile"] = caps.compile_reason
    return out
