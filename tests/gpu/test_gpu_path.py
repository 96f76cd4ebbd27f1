"""Issue 20: the CUDA path's findings, shown on CPU wherever torch lets CPU show them.

Each test names its finding. Where the GPU itself is the cause (a CUDA-graph pool, a second
visible GPU, a card without native bf16) the smallest stand-in takes its place: a fake of
the one torch.cuda call involved, behaving as torch's own code does on such a machine.
Faults inside a step (a loss spike, a NaN, an out-of-memory) are injected by wrapping the
real model's forward, so the real trainer, scaler, guard and optimizer handle them.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from engine import rundir
from engine.cli import main
from engine.errors import UserError
from engine.train.model import GPT
from engine.run.owner import start
from harness import micro_config, run_events

ROOT = Path(__file__).resolve().parents[2]


_config, _events = micro_config, run_events


def _on_training_calls(monkeypatch, hook) -> None:
    """Wrap GPT.forward: hook(model, n, loss) -> loss on the n-th training call (1-based;
    calls under no_grad, evals and samples, are passed through and not counted)."""
    real = GPT.forward
    calls = {"n": 0}

    def forward(self, idx, targets=None, **kw):
        logits, loss = real(self, idx, targets, **kw)
        if torch.is_grad_enabled() and loss is not None:
            calls["n"] += 1
            loss = hook(self, calls["n"], loss)
        return logits, loss

    monkeypatch.setattr(GPT, "forward", forward)


# ---------------------------------------------------------------- 1: CUDA graphs + accumulation


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
def test_1_cuda_graph_compile_modes_with_grad_accum_are_refused_in_one_line(mode, tmp_path, tiny_dataset, capsys):
    """torch's cudagraph trees overwrite the graph-owned .grad outputs on the next replay
    (_inductor/cudagraph_trees.py: "...reduce-overhead and gradient accumulation"): the
    config refuses compile + a CUDA-graph mode + grad_accum > 1, naming the fix."""
    flags = {"speed.compile": True, "speed.compile_mode": mode, "train.grad_accum": 2}
    with pytest.raises(UserError) as err:
        _config(tiny_dataset, **flags)
    assert "grad" in str(err.value) and mode in str(err.value)
    assert "\n" not in str(err.value)
    # the same rule through the CLI: one line, exit 2, nothing written
    out = tmp_path / "run"
    code = main(["train", "--preset", "micro", "--data", str(tiny_dataset), "--compile", "--compile-mode", mode,
                 "--grad-accum", "2", "--out", str(out)])  # fmt: skip
    err_text = capsys.readouterr().err.strip()
    assert code == 2 and len(err_text.splitlines()) == 1 and "Traceback" not in err_text, err_text
    assert "--grad-accum" in err_text or "--compile-mode" in err_text  # the fix, as flags
    assert not out.exists()


def test_1_the_rule_leaves_the_safe_combinations_alone(tiny_dataset):
    _config(tiny_dataset, **{"speed.compile": True, "speed.compile_mode": "reduce-overhead", "train.grad_accum": 1})
    _config(tiny_dataset, **{"speed.compile": True, "speed.compile_mode": "default", "train.grad_accum": 4})
    _config(tiny_dataset, **{"speed.compile": True, "speed.compile_mode": "max-autotune-no-cudagraphs",
                             "train.grad_accum": 4})  # fmt: skip


# ---------------------------------------------------------------- 3: fp16 honours the guard


@pytest.mark.slow
def test_3_fp16_skips_a_finite_spike_and_a_nan_step_like_bf16(tmp_path, tiny_dataset, monkeypatch):
    """fp16 + GradScaler("cpu") + fused AdamW + the guard, on CPU. Step 3's loss is a finite
    spike (+100, gradients untouched: the scaler sees nothing wrong), step 4's is NaN (NaN
    gradients: the scaler's own found_inf). Both fall between two reports. The guard must
    have the last word: neither update may reach the weights, and both are reported."""
    snapshots: dict[int, list[torch.Tensor]] = {}

    def hook(model, n, loss):
        snapshots[n] = [p.detach().clone() for p in model.parameters()]  # the weights this step starts from
        if n == 3:
            return loss + 100.0
        if n == 4:
            return loss * float("nan")
        return loss

    _on_training_calls(monkeypatch, hook)
    run_dir = tmp_path / "fp16"
    config = _config(tiny_dataset, **{"speed.precision": "fp16", "train.max_steps": 6, "train.log_interval": 5,
                                      "train.eval_interval": 100, "train.ckpt_interval": 100})  # fmt: skip
    run = start(config, run_dir)
    trainer = run.segment
    assert trainer.config.optim.fused in (None, True)  # fused AdamW: the default on CPU
    run.run()
    assert trainer.parts.scaler is not None and trainer.parts.optimizer.defaults.get("fused")
    for before, after in ((3, 4), (4, 5)):
        unchanged = all(torch.equal(a, b) for a, b in zip(snapshots[before], snapshots[after]))
        assert unchanged, f"the update of step {before} reached the weights; the guard skipped it"
    moved = any(not torch.equal(a, b) for a, b in zip(snapshots[5], snapshots[6]))
    assert moved  # a good step still trains
    warnings = [e.message for e in _events(run_dir) if e.event == "warning"]
    assert any("2 updates since the last report were skipped" in w for w in warnings), warnings


# ---------------------------------------------------------------- 5: resume on fewer GPUs


def _fake_gpus(monkeypatch, visible: int) -> list[tuple[str, int]]:
    """torch.cuda's RNG calls as on a machine with `visible` GPUs: setting the state of a
    GPU index it lacks raises IndexError, as torch.cuda.default_generators[idx] does."""
    calls: list[tuple[str, int]] = []

    def index(device) -> int:
        if isinstance(device, int):
            return device
        d = torch.device(device)
        return d.index or 0

    def get_rng_state(device="cuda"):
        calls.append(("get", index(device)))
        return torch.zeros(16, dtype=torch.uint8)

    def set_rng_state(new_state, device="cuda"):
        i = index(device)
        calls.append(("set", i))
        if i >= visible:
            raise IndexError("tuple index out of range")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
    for module in (torch.cuda, torch.cuda.random):  # *_all look their helpers up in torch.cuda.random
        monkeypatch.setattr(module, "get_rng_state", get_rng_state)
        monkeypatch.setattr(module, "set_rng_state", set_rng_state)
    return calls


@pytest.mark.slow
def test_5_a_checkpoint_from_a_two_gpu_box_resumes_where_fewer_are_visible(tmp_path, tiny_dataset, monkeypatch):
    """An old checkpoint holds get_rng_state_all() of 2 GPUs; the resume sees one. The run's
    own device's state is restored (none here: it trains on CPU), never a GPU it lacks."""
    run_dir = tmp_path / "run"
    start(_config(tiny_dataset, **{"train.max_steps": 2, "train.ckpt_interval": 2, "train.eval_interval": 2}),
          run_dir).run()  # fmt: skip
    path = run_dir / "checkpoints" / "step_000002.pt"
    state = torch.load(path, weights_only=True)
    state["rng"]["cuda"] = [torch.zeros(16, dtype=torch.uint8), torch.ones(16, dtype=torch.uint8)]
    torch.save(state, path)

    calls = _fake_gpus(monkeypatch, visible=1)
    config = rundir.load_config(run_dir)
    config = config.model_copy(update={"train": config.train.model_copy(update={"max_steps": 3})})
    start(config, run_dir, resume=True).run()  # today: IndexError from set_rng_state_all
    assert ("set", 1) not in calls
    steps = [e.step for e in _events(run_dir) if e.event == "step"]
    assert steps[-1] == 3
    saved = torch.load(run_dir / "checkpoints" / "step_000003.pt", weights_only=True)["rng"].get("cuda")
    assert not (isinstance(saved, list) and len(saved) > 1), "a checkpoint keeps one device's state, not every GPU's"


# ---------------------------------------------------------------- 6: bf16 without emulation


def test_6_auto_precision_does_not_count_emulated_bf16(monkeypatch):
    """torch.cuda.is_bf16_supported(including_emulation=True) is the default and says yes on
    V100/T4 (emulated). auto must ask with including_emulation=False and pick fp16 there."""
    from engine import device

    seen: list[dict] = []

    def is_bf16_supported(including_emulation: bool = True) -> bool:  # a V100: emulated only
        seen.append({"including_emulation": including_emulation})
        return including_emulation

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    assert device.precision("auto", "cuda") == "fp16"
    assert seen and all(s == {"including_emulation": False} for s in seen)


# 11 (a cold compile is cold): tests/train/test_compile_scope.py


# ---------------------------------------------------------------- 12: test_gpu's loss assertion


def _test_gpu_module():
    spec = importlib.util.spec_from_file_location("_test_gpu_for_issue20", ROOT / "tests" / "gpu" / "test_gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_12_test_gpu_trains_on_data_whose_loss_can_fall(request, tmp_path):
    """tests/gpu/test_gpu.py asserts the loss falls. On uniform random tokens the best loss is
    ln(vocab), about where training starts: a coin flip. Its data must have structure: a
    bigram model of its train tokens beats ln(vocab) by a wide margin, and the same 20
    micro steps on CPU lower the loss by much more than step-to-step noise."""
    module = _test_gpu_module()
    params = inspect.signature(module.test_bf16_compile_flash_fused).parameters
    fixtures = [p for p in params if p != "tmp_path"]
    assert len(fixtures) == 1, fixtures
    data = Path(request.getfixturevalue(fixtures[0]))
    info = json.loads((data / "dataset.json").read_text())
    V = info["vocab_size"]
    tokens = np.fromfile(data / "train.bin", dtype="<u2" if info["dtype"] == "uint16" else "<u4").astype(np.int64)
    pairs = np.zeros((V, V))
    np.add.at(pairs, (tokens[:-1], tokens[1:]), 1)
    rows = pairs.sum(1, keepdims=True)
    p = pairs / np.maximum(rows, 1)
    bigram_entropy = -np.sum(pairs * np.log(np.where(p > 0, p, 1))) / pairs.sum()
    assert bigram_entropy < math.log(V) - 1.0, f"bigram entropy {bigram_entropy:.2f} vs ln {V} = {math.log(V):.2f}"

    run_dir = tmp_path / "cpu"
    start(_config(data, **{"train.max_steps": 20}), run_dir).run()
    losses = [e.loss for e in _events(run_dir) if e.event == "step"]
    assert losses[-1] < losses[0] - 0.5, losses


# ---------------------------------------------------------------- 13: out of memory, in words


def _oom_on_training_calls(monkeypatch) -> None:
    def hook(model, n, loss):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    _on_training_calls(monkeypatch, hook)


def _says_out_of_memory_with_the_estimate(text: str) -> None:
    assert text.startswith("out of memory"), text
    assert "estimat" in text and re.search(r"\d(\.\d+)? (GiB|MiB|KiB)", text), text


@pytest.mark.slow
def test_13_best_records_out_of_memory_with_the_estimate(tmp_path, tiny_dataset, monkeypatch, capsys):
    from gpt2_tui import main as gpt2_tui_main  # bench is gpt2_tui's command (bench/cli.py), not engine.cli's

    _oom_on_training_calls(monkeypatch)
    out = tmp_path / "best"
    gpt2_tui_main(["bench", "--best", "--preset", "micro", "--data", str(tiny_dataset), "--device", "cpu", "--vocab-size", "64",
          "--batch-sizes", "2", "--compile-modes", "eager", "--steps", "1", "--warmup", "1", "--out", str(out)])  # fmt: skip
    from bench.best import BestResult

    result = BestResult.model_validate_json((out / "best.json").read_text())
    [candidate] = result.candidates
    _says_out_of_memory_with_the_estimate(candidate.status)


@pytest.mark.slow
def test_13_ladder_records_out_of_memory_with_the_estimate(tmp_path, tiny_dataset, monkeypatch):
    from bench import ladder

    _oom_on_training_calls(monkeypatch)
    cfg = ladder.BenchConfig(preset="micro", data=str(tiny_dataset), device="cpu", vocab_size=64, steps=1, warmup=1,
                             skip=["compile", "amp"])  # fmt: skip
    result = ladder.run_ladder(cfg, tmp_path / "out", command="test")
    ran = [r for r in result.rungs if r.status != "skipped"]
    assert ran and all(r.status == "failed" for r in ran)
    for r in ran:
        _says_out_of_memory_with_the_estimate(r.reason or "")


def test_the_ladder_takes_fp16_where_bf16_is_only_emulated(monkeypatch):
    """The AMP rung's precision is the engine's decision (device.half_precision): a GPU that
    only emulates bf16 (V100, T4) gets fp16, which the engine also runs, never an emulated bf16
    that `train` would refuse. Shown on CPU by a CUDA stand-in that answers like a T4."""
    import torch

    from bench import ladder
    from engine import device as devices

    def t4_bf16(including_emulation: bool = True) -> bool:
        return including_emulation  # emulated: yes; native: no

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", t4_bf16)
    value, why = ladder.applicable("speed.precision", "amp", torch.device("cuda"), 50304)
    assert value == "fp16" and why is None
    assert devices.precision("auto", "cuda") == value
    with pytest.raises(UserError, match="no bf16"):
        devices.precision("bf16", "cuda")
