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
GPU's 16-bit precision, and compiled with grad checkpointing and with the chunked loss (the
refused ones, CUDA graphs with scope blocks, are checked refused).

Under torchrun (2 processes: gloo on CPU, NCCL on 2+ GPUs): the compiles only several ranks
reach (matrix.PARALLEL_COMPILES: DDP with CUDA graphs, FSDP2 with compiled blocks), each
trained where the matrix supports it, or refused with its reason.
"""

from __future__ import annotations

import json
import math
import os

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


# compiled in the GPU's 16-bit precision besides each mode x scope once: what a compiled graph
# holds only with them (the recomputed blocks of checkpointing, the chunked loss's loop)
CUDA_COMPILED_TOO = ({"model.grad_checkpointing": True, "model.loss": "plain"},
                     {"model.grad_checkpointing": False, "model.loss": "chunked"})  # fmt: skip


def _cuda_picks(target: matrix.Target, half: str) -> list[dict]:
    """Every supported uncompiled combination; compiled, in `half`: each mode x scope once, and
    the default mode and scope with checkpointing, and with the chunked loss."""
    combos = matrix.combinations(target)
    eager = [c for c in combos if not c["speed.compile"]]
    seen, compiled = set(), []
    for c in combos:
        key = (c["speed.compile_mode"], c["speed.compile_scope"])
        if c["speed.compile"] and c["speed.precision"] == half and key not in seen:
            seen.add(key)
            compiled.append(c)
    for extra in CUDA_COMPILED_TOO:
        want = {"speed.compile": True, "speed.compile_mode": "default", "speed.compile_scope": "blocks",
                "speed.precision": half, "model.attention": "flash", **extra}  # fmt: skip
        compiled.append(next(c for c in combos if all(c[k] == v for k, v in want.items())))
    return eager + compiled


def _cuda() -> list[dict]:
    if not torch.cuda.is_available():
        return []
    return _cuda_picks(_cuda_target(), devices.half_precision("cuda"))


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


def test_the_cuda_matrix_compiles_with_checkpointing_and_the_chunked_loss_in_16_bit():
    """What a GPU box runs of the matrix (the tests part of the GPU report), listed on CPU for
    each CUDA target: compiled runs in its 16-bit precision with checkpointing and chunked."""
    for target, half in ((matrix.Target("cuda", True, 1), "bf16"), (matrix.Target("cuda", False, 1), "fp16")):
        compiled = [c for c in _cuda_picks(target, half) if c["speed.compile"]]
        assert all(c["speed.precision"] == half for c in compiled)
        assert any(c["model.grad_checkpointing"] for c in compiled)
        assert any(c["model.loss"] == "chunked" for c in compiled)
        modes = {(c["speed.compile_mode"], c["speed.compile_scope"]) for c in compiled}
        assert ("reduce-overhead", "model") in modes and ("reduce-overhead", "blocks") not in modes


def test_each_parallel_compile_is_supported_or_refused_with_its_reason():
    two_gpus = matrix.Target("cuda", True, 2)
    supported = matrix.combinations(two_gpus)
    for name, values in matrix.PARALLEL_COMPILES.items():
        why = matrix.verdict(values, two_gpus)
        trained = [c for c in supported if all(c[k] == v for k, v in values.items())]
        assert (why is None) == bool(trained), name  # supported: in the matrix; else refused, with words
        assert why is None or len(why) > 20
    graphs_fsdp = {**matrix.PARALLEL_COMPILES["fsdp + compiled blocks"], "speed.compile_mode": "reduce-overhead"}
    assert "FSDP2" in (matrix.verdict({**graphs_fsdp, "speed.compile_scope": "model"}, two_gpus) or "")


_FLAGS = {"speed.parallel": "--parallel", "speed.compile_mode": "--compile-mode",
          "speed.compile_scope": "--compile-scope"}  # fmt: skip


def _parallel_cases(kind: str) -> list[tuple[str, dict]]:
    target = matrix.Target(kind, True, 2)
    return [(n, v) for n, v in matrix.PARALLEL_COMPILES.items() if matrix.verdict(v, target) is None]


def _torchrun_compile(tmp_path, data, device: str, values: dict) -> None:
    from harness import cli_process

    run = tmp_path / "run"
    flags = [a for k, v in values.items() if k in _FLAGS for a in (_FLAGS[k], str(v))]
    done = cli_process("train", "--preset", "micro", "--device", device, "--data", str(data), "--nproc", "2",
                       "--compile", *flags, "--max-steps", "2", "--eval-interval", "2", "--eval-batches", "1",
                       "--ckpt-interval", "2", "--out", str(run), env=dict(os.environ, OMP_NUM_THREADS="1"),
                       timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines() if line.strip()]
    started = next(e for e in events if e["event"] == "run_started")
    assert started["parallel"] == values["speed.parallel"] and started["world_size"] == 2
    losses = [e["loss"] for e in events if e["event"] == "step"]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    assert any(e["event"] == "eval" for e in events) and any(e["event"] == "run_finished" for e in events)


@pytest.mark.slow
@pytest.mark.parametrize("name, values", _parallel_cases("cpu"), ids=[n for n, _ in _parallel_cases("cpu")])
def test_parallel_compiles_train_under_torchrun_on_cpu(name, values, tmp_path, tiny_dataset):
    """gloo, 2 processes: DDP around a whole-model compile (its CUDA graphs idle on CPU) and FSDP2
    over compiled blocks, each 2 steps with an eval and a checkpoint."""
    _torchrun_compile(tmp_path, tiny_dataset, "cpu", values)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
@pytest.mark.parametrize("name, values", _parallel_cases("cuda"), ids=[n for n, _ in _parallel_cases("cuda")])
def test_parallel_compiles_train_under_torchrun_on_two_gpus(name, values, tmp_path, tiny_dataset):
    _torchrun_compile(tmp_path, tiny_dataset, "cuda", values)
