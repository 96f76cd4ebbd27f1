"""Issue 20, findings 4, 9 and 10: the CUDA branches of the device checks, the FSDP2 policy and
the estimator's budget, shown on CPU with the one torch/host call involved faked as a GPU box
answers it. (1-3, 5, 6, 8, 12, 13 are in test_gpu_path*.py; what only a GPU can show is in
docs/gpu/README.md.)"""

from __future__ import annotations

import importlib.util
import shutil
import sysconfig

import pytest
import torch

from engine import device
from engine.config import resolve

# ---------------------------------------------------------------- 4: Triton's compiler on CUDA


@pytest.fixture
def triton_here(monkeypatch):
    """A CUDA box with Triton installed (only its presence is asked)."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "triton" else real(name, *a))
    monkeypatch.delenv("CC", raising=False)
    device._compiler_problem.cache_clear()
    yield
    device._compiler_problem.cache_clear()


def test_4_triton_without_gcc_or_clang_is_one_line_naming_them(triton_here, monkeypatch):
    """Triton uses $CC, else gcc, else clang; plain `cc` does not count."""
    real = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a: None if name in ("gcc", "clang") else real(name, *a))
    why = device.compile_reason(True) or ""
    assert "gcc" in why and "clang" in why and "$CC" in why and "\n" not in why, why


@pytest.mark.slow
def test_4_triton_needs_python_headers_on_cuda_too(triton_here, monkeypatch, tmp_path):
    real = sysconfig.get_paths
    monkeypatch.setattr(sysconfig, "get_paths", lambda *a, **k: real(*a, **k) | {"include": str(tmp_path)})
    monkeypatch.setenv("CC", shutil.which("python3") or "python3")  # a program that runs `--version`
    why = device.compile_reason(True) or ""
    assert "Python.h" in why and "CUDA" in why, why


def test_4_a_cc_from_the_environment_is_the_one_checked(triton_here, monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    why = device.compile_reason(True) or ""
    assert "no-such-cc" in why and "$CC" in why, why


# ---------------------------------------------------------------- 9: FSDP2's mixed precision


def _gpt2(**flags):
    return resolve("gpt2", None, {"speed.device": "cuda", "train.batch_size": 8} | flags)


@pytest.fixture
def a_cuda_box(monkeypatch):
    """torch.cuda as an 80 GiB Ampere+ card answers it (the calls the estimator and budget make)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)


def test_9_fsdp2_gathers_in_the_run_precision_and_reduces_in_fp32(monkeypatch):
    from torch.distributed import fsdp
    from torch.distributed import device_mesh

    from engine.train import distributed
    from engine.train.model import GPT

    seen: list[dict] = []
    monkeypatch.setattr(device_mesh, "init_device_mesh", lambda *a, **k: "mesh")
    monkeypatch.setattr(fsdp, "fully_shard", lambda module, **kw: seen.append(kw) or module)
    model = GPT(resolve("micro", None, {"model.vocab_size": 64}).model)
    ctx = distributed.Context(rank=0, world_size=2, local_rank=0, backend="gloo")
    distributed.shard(model, torch.device("cpu"), ctx, "bf16")
    policies = [kw.get("mp_policy") for kw in seen]
    assert len(policies) == len(model.transformer.h) + 1
    *blocks, root = policies  # each block gathers in bf16 and reduces in fp32; the root unit
    assert all(p is not None and p.param_dtype == torch.bfloat16 and p.reduce_dtype == torch.float32 for p in blocks)
    assert root is None  # stays fp32, so the residual stream is fp32 as under DDP and on one GPU
    seen.clear()
    distributed.shard(model, torch.device("cpu"), ctx, "fp32")
    assert all("mp_policy" not in kw for kw in seen)  # fp32: FSDP2's own default


def test_9_the_estimator_counts_gathered_units_at_the_gather_dtype(a_cuda_box):
    from engine.train import memory

    bf16 = memory.estimate(_gpt2(**{"speed.precision": "bf16"}), 2, "fsdp")
    fp32 = memory.estimate(_gpt2(**{"speed.precision": "fp32"}), 2, "fsdp")
    assert bf16.components["FSDP gathered units"] < fp32.components["FSDP gathered units"]
    assert bf16.components["autocast weight copies"] == 0  # the weights arrive in bf16 already


# ---------------------------------------------------------------- 10: NCCL buffers, free memory


def test_10_data_parallel_on_cuda_reserves_nccl_buffers_per_rank(a_cuda_box):
    from engine.train import memory

    cfg = _gpt2(**{"speed.precision": "bf16"})
    for sharding in ("ddp", "fsdp"):
        est = memory.estimate(cfg, 2, sharding)
        assert est.breakdown["NCCL buffers"] == memory.NCCL_COMM_BYTES
        assert sum(est.breakdown.values()) == est.peak_bytes
    assert "NCCL buffers" not in memory.estimate(cfg).breakdown  # one process: no communicator
    cpu = resolve("gpt2", None, {"speed.device": "cpu", "train.batch_size": 8})
    assert "NCCL buffers" not in memory.estimate(cpu, 2, "ddp").breakdown  # gloo on the host


def test_10_a_run_is_judged_against_the_memory_free_at_launch(a_cuda_box, monkeypatch):
    """80 GiB card, 60 GiB held by another process: a run the total would take is refused,
    in one line that says it compared with the free memory."""
    from engine.train import memory
    from engine.errors import UserError

    GiB = 2**30
    cfg = _gpt2(**{"speed.precision": "bf16"})
    peak = memory.estimate(cfg).peak_bytes
    assert peak < 80 * GiB - 60 * GiB + peak  # sanity: fits the total
    asked: list[int] = []
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i=0: asked.append(i) or (peak - 1, 80 * GiB))
    assert device.budget("cuda") == (peak - 1, "GPU memory free now")
    with pytest.raises(UserError) as err:
        memory.check_fits(cfg)
    assert "free" in str(err.value) and "\n" not in str(err.value)
    monkeypatch.setenv("LOCAL_RANK", "3")  # under torchrun each rank asks for its own GPU
    device.budget("cuda")
    assert asked[-1] == 3


# ---------------------------------------------------------------- 5: each rank its own GPU's RNG


def test_5_each_rank_restores_its_own_gpus_state_from_either_format(monkeypatch):
    """The resume on a CUDA rank (cuda:1 here), with torch.cuda's one RNG call faked: an older
    checkpoint's list gives this rank its own entry; one without that entry is a warning,
    not an IndexError; the new format holds one tensor, set on the run's device."""
    from engine.train.state import rng_state as _rng_state, set_rng_state as _set_rng_state

    set_calls: list[tuple[int, int]] = []
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda s, d: set_calls.append((int(s[0]), torch.device(d).index)))
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda d: torch.full((16,), 7, dtype=torch.uint8))
    rank1 = torch.device("cuda", 1)
    state = _rng_state(rank1)
    assert isinstance(state["cuda"], torch.Tensor)  # one device's state, not every GPU's
    assert _set_rng_state(state, rank1) is None and set_calls[-1] == (7, 1)
    old = state | {"cuda": [torch.zeros(16, dtype=torch.uint8), torch.ones(16, dtype=torch.uint8)]}
    assert _set_rng_state(old, rank1) is None and set_calls[-1] == (1, 1)
    set_calls.clear()
    warning = _set_rng_state(old | {"cuda": old["cuda"][:1]}, rank1)
    assert warning and "GPU 1" in warning and set_calls == []
    assert _set_rng_state(old, torch.device("cpu")) is None and set_calls == []  # a CPU run restores none
