"""The GPU path's switch rules, checked on CPU with stand-ins where CUDA is needed: CUDA graphs
with compile scope blocks or FSDP2 refused (engine/switch_matrix.py), TF32 (tests/train/test_tf32.py,
through torch itself), the control group's timeout, FSDP2's per-block mixed precision, and
parallel=auto deciding against the launch's own memory budget."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch

from engine import device as devices
from engine.config import resolve
from engine.errors import UserError
from engine.train import distributed

MODES = ("reduce-overhead", "max-autotune")


def _cfg(tiny_dataset, **flags):
    return resolve("micro", None, {"data.path": str(tiny_dataset), "speed.precision": "fp32"} | flags)


# ---------------------------------------------------------------- 1: CUDA graphs + blocks, + FSDP2


@pytest.mark.parametrize("device", ["cuda", "auto"])
@pytest.mark.parametrize("mode", MODES)
def test_cuda_graph_modes_with_compile_scope_blocks_are_refused_with_both_fixes(mode, device, tiny_dataset):
    with pytest.raises(UserError) as err:
        _cfg(tiny_dataset, **{"speed.device": device, "speed.compile": True, "speed.compile_mode": mode})
    assert err.value.fixes == ({"speed.compile_scope": "model"}, {"speed.compile_mode": "max-autotune-no-cudagraphs"})
    text = str(err.value)
    assert "\n" not in text and mode in text and "--compile-scope model" in text


def test_cuda_graph_modes_pass_with_scope_model_or_off_cuda(tiny_dataset):
    _cfg(tiny_dataset, **{"speed.device": "cuda", "speed.compile": True, "speed.compile_mode": "reduce-overhead",
                          "speed.compile_scope": "model"})  # fmt: skip
    _cfg(tiny_dataset, **{"speed.device": "cpu", "speed.compile": True, "speed.compile_mode": "max-autotune"})
    _cfg(tiny_dataset, **{"speed.device": "cuda", "speed.compile": False, "speed.compile_mode": "max-autotune"})


def test_cuda_graph_modes_with_fsdp_are_refused(tiny_dataset):
    with pytest.raises(UserError) as err:
        _cfg(tiny_dataset, **{"speed.device": "cuda", "speed.compile": True, "speed.compile_mode": "reduce-overhead",
                              "speed.compile_scope": "model", "speed.parallel": "fsdp"})  # fmt: skip
    assert {"speed.parallel": "ddp"} in err.value.fixes and "FSDP2" in str(err.value)


def test_the_form_refuses_it_at_the_field_through_the_matrix():
    caps = devices.Capabilities(True, False, True, "cuda", "NVIDIA H100", None, 1)
    got = devices.refuse({"speed.compile": True, "speed.compile_mode": "reduce-overhead"}, caps)
    assert "compile scope model" in got["speed.compile_mode"]
    old = devices.Capabilities(True, False, False, "cuda", "Tesla T4", None, 1)
    assert "no bf16" in devices.refuse({"speed.precision": "bf16"}, old)["speed.precision"]


# ---------------------------------------------------------------- 3: TF32
# tests/train/test_tf32.py: through torch itself, no stand-in backends (a stand-in hid the
# "mix of the legacy and new APIs" crash that every max-autotune compile met, issue 37).


# ---------------------------------------------------------------- 5: the control group's timeout


def test_the_gloo_control_group_takes_the_runs_timeout(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv(distributed.TIMEOUT_ENV, "77")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: None)
    d = distributed.dist
    monkeypatch.setattr(d, "is_initialized", lambda: False)
    seen = {}
    monkeypatch.setattr(d, "init_process_group", lambda backend, timeout=None: seen.update(world=timeout))
    monkeypatch.setattr(d, "new_group", lambda backend=None, timeout=None, **kw: seen.update(control=timeout) or "g")
    monkeypatch.setattr(distributed, "current", lambda: distributed.Context(0, 2, 0, "nccl"))
    try:
        distributed.init("cuda")
    finally:
        distributed._control_group = None
    assert seen == {"world": timedelta(seconds=77), "control": timedelta(seconds=77)}


# ---------------------------------------------------------------- 6: FSDP2's policy per block


def test_fsdp_mixed_precision_is_per_block_and_the_root_stays_fp32(monkeypatch, tiny_dataset):
    import torch.distributed.device_mesh as device_mesh
    import torch.distributed.fsdp as fsdp

    from engine.train.model import GPT

    calls = []
    monkeypatch.setattr(fsdp, "fully_shard", lambda module, **kw: calls.append((module, kw)))
    monkeypatch.setattr(device_mesh, "init_device_mesh", lambda *a, **k: "mesh")
    model = GPT(_cfg(tiny_dataset, **{"model.vocab_size": 64}).model)
    distributed.shard(model, torch.device("cpu"), distributed.Context(0, 2, 0, "gloo"), precision="bf16")
    blocks = [kw for m, kw in calls if m is not model]
    (root,) = [kw for m, kw in calls if m is model]
    assert len(blocks) == len(model.transformer.h)
    for kw in blocks:
        p = kw["mp_policy"]
        assert p.param_dtype == torch.bfloat16 and p.reduce_dtype == torch.float32 and not p.cast_forward_inputs
    assert root.get("mp_policy") is None  # FSDP2's default: fp32 embeddings, ln_f and head


# ---------------------------------------------------------------- 7: parallel=auto's budget


def test_parallel_auto_decides_against_the_launch_budget_not_the_cards_total(monkeypatch, tiny_dataset):
    """A card of 80 GB with 10 GB free: the fit check refuses a replica needing 20 GB, so auto
    must shard rather than pick DDP against the 80 GB total."""
    from engine.train import memory

    config = _cfg(tiny_dataset, **{"speed.device": "cuda", "model.vocab_size": 64})
    G = 2**30
    monkeypatch.setattr(devices, "memory_bytes", lambda name="auto": 80 * G)
    monkeypatch.setattr(devices, "budget", lambda kind, free=True: (10 * G if free else 80 * G, "GPU memory free now"))
    need = {"ddp": 20 * G, "fsdp": 6 * G}
    monkeypatch.setattr(memory, "estimate", lambda c, w, s: SimpleNamespace(fits=lambda avail: need[s] <= avail))
    ctx = distributed.Context(0, 2, 0, "nccl")
    assert distributed.choose("auto", config, ctx, torch.device("cuda", 0)) == "fsdp"
    # and never FSDP2 with CUDA graphs, which the matrix refuses
    graphs = config.model_copy(update={"speed": config.speed.model_copy(update={
        "compile": True, "compile_mode": "reduce-overhead", "compile_scope": "model"})})  # fmt: skip
    assert distributed.choose("auto", graphs, ctx, torch.device("cuda", 0)) == "ddp"


def test_free_memory_is_read_without_making_a_cuda_context(monkeypatch):
    """The --nproc launcher and the form ask how much GPU memory is free before any rank runs:
    through torch.cuda.mem_get_info that made a CUDA context on GPU 0 for the launcher's whole
    life (0.3-0.6 GiB less for rank 0). NVML answers without one."""
    import torch

    from engine import device, gpu_monitor

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)

    def context(*a, **k):
        raise AssertionError("this would create a CUDA context")

    monkeypatch.setattr(torch.cuda, "mem_get_info", context)
    monkeypatch.setattr(torch.cuda, "current_device", context)
    monkeypatch.setattr(gpu_monitor, "free_bytes", lambda index: 40 * 2**30 + index)
    assert device.free_cuda_bytes() == 40 * 2**30
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert device.free_cuda_bytes() == 40 * 2**30 + 1
