"""Every combination of speed switches engine/switch_matrix.py calls supported trains: a few
steps of the micro preset each, with an eval and a checkpoint inside (step 2 of 2).

On CPU: every supported uncompiled combination (precision x attention x grad checkpointing x
loss), and compile in two of them only: the defaults compiled (scope blocks), and scope model
with mode reduce-overhead, grad checkpointing, manual attention and the chunked loss. The
matrix supports 192 compiled CPU combinations; each costs a 30-50 s compile on a 2-core CI
machine, and the compiled graph differs from the eager one only where compile's own mode and
scope go, which these two cover. They share the session's compile cache (tests/conftest.py).

On CUDA (bench/gpu_report.py's tests part runs this file first): the same for this GPU's
Target (one process; several GPUs need torchrun: tests/train/test_distributed_torchrun.py):
every supported uncompiled combination, and every supported compile mode x scope once, in the
GPU's 16-bit precision (the refused ones, CUDA graphs with scope blocks, are checked refused).
"""

from __future__ import annotations

import math

import pytest
import torch

from engine import device as devices
from engine import events as ev
from engine import switch_matrix as matrix
from engine.config import resolve
from engine.errors import UserError
from engine.run.owner import start
from engine.train import compiling

TWO = {"speed.compile": True, "speed.compile_scope": "model", "speed.compile_mode": "reduce-overhead",
       "model.grad_checkpointing": True, "model.attention": "manual", "model.loss": "chunked", "speed.precision": "fp32"}  # fmt: skip


def _cpu() -> list[dict]:
    combos = matrix.combinations(matrix.CPU)
    eager = [c for c in combos if not c["speed.compile"]]
    compiled = [c for c in combos if c["speed.compile"]]
    first = next(c for c in compiled if all(c[k] == v for k, v in
                 {"speed.compile_mode": "default", "speed.compile_scope": "blocks", "speed.precision": "fp32",
                  "model.attention": "flash", "model.grad_checkpointing": False, "model.loss": "plain"}.items()))  # fmt: skip
    second = next(c for c in compiled if all(c[k] == v for k, v in TWO.items()))
    return eager + [first, second]


def _cuda_target() -> matrix.Target:
    return matrix.Target("cuda", devices.has_bf16("cuda"), 1)


def _cuda() -> list[dict]:
    if not torch.cuda.is_available():
        return []
    target = _cuda_target()
    combos = matrix.combinations(target)
    half = devices.half_precision("cuda")
    eager = [c for c in combos if not c["speed.compile"]]
    seen, compiled = set(), []
    for c in combos:
        key = (c["speed.compile_mode"], c["speed.compile_scope"])
        if c["speed.compile"] and c["speed.precision"] == half and key not in seen:
            seen.add(key)
            compiled.append(c)
    return eager + compiled


def _name(combo: dict) -> str:
    return "-".join(f"{k.split('.')[1]}={v}" for k, v in combo.items() if k != "speed.compile" or v)


def _train(tmp_path, dataset, device: str, combo: dict) -> None:
    config = resolve("micro", None, {
        "data.path": str(dataset), "speed.device": device, "train.max_steps": 2, "train.eval_interval": 2,
        "train.ckpt_interval": 2, "train.eval_batches": 1, "train.log_interval": 1, "train.sample_tokens": 0,
        "train.batch_size": 2, **combo})  # fmt: skip
    compiling.reset()
    seen: list = []
    start(config, tmp_path / "run", sinks=[ev.CallbackSink(seen.append)], force=True).run()
    losses = [e.loss for e in seen if isinstance(e, ev.Step)]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses), seen
    assert 2 in [e.step for e in seen if isinstance(e, ev.Eval)] and [e for e in seen if isinstance(e, ev.RunFinished)]
    assert [e.step for e in seen if isinstance(e, ev.Checkpoint)] == [2]
    assert (tmp_path / "run" / "checkpoints" / "step_000002.pt").is_file()


def test_the_matrix_lists_cpu_combinations_and_refuses_cuda_graphs_with_blocks_on_cuda():
    cpu = matrix.combinations(matrix.CPU)
    assert cpu and not any(c["speed.precision"] == "tf32" for c in cpu)  # tf32 idles on CPU: it would train as fp32
    for target in matrix.CUDA_TARGETS:
        for c in matrix.combinations(target):
            assert not (c["speed.compile"] and c["speed.compile_mode"] in matrix.CUDA_GRAPH_MODES
                        and c["speed.compile_scope"] == "blocks")  # fmt: skip
            if not target.bf16:
                assert c["speed.precision"] != "bf16"


@pytest.mark.slow
@pytest.mark.parametrize("combo", _cpu(), ids=_name)
def test_every_supported_cpu_combination_trains_evals_and_saves(combo, tmp_path, tiny_dataset):
    _train(tmp_path, tiny_dataset, "cpu", combo)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("combo", _cuda() or [{}], ids=_name)
def test_every_supported_cuda_combination_trains_evals_and_saves(combo, tmp_path, tiny_dataset):
    _train(tmp_path, tiny_dataset, "cuda", combo)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("mode", matrix.CUDA_GRAPH_MODES)
def test_refused_cuda_combinations_are_refused_before_training(mode, tiny_dataset):
    with pytest.raises(UserError):
        resolve("micro", None, {"data.path": str(tiny_dataset), "speed.device": "cuda", "speed.compile": True,
                                "speed.compile_mode": mode, "speed.compile_scope": "blocks"})  # fmt: skip
