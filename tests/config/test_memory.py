"""The memory estimator, held to what PyTorch really holds and saves.

Parameters, gradients and AdamW state must equal a real model's and a stepped AdamW's
bytes; activations must be within 10% of what autograd saves (one forward of the real
model under saved_tensors_hooks, unique storages) over a grid of shapes and switches.
"""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine import device

from engine.train import memory
from engine import text as tx
from gpt2_tui import main
from engine.config import resolve
from engine.train.memory import MemoryEstimate, estimate, suggest_fit
from bench.memory_measure import measure_saved, measure_state
from engine.train.model import GPT
from harness import MEMORY_SHAPES as SHAPES


GRID = list(itertools.product(SHAPES, ["flash", "manual"], ["fp32", "bf16"], [False, True]))


def _config(shape: dict | str, **flags):
    base = SHAPES[shape] if isinstance(shape, str) else shape
    over = {"speed.device": "cpu", "speed.compile": False} | base
    over |= {k.replace("__", "."): v for k, v in flags.items()}
    return resolve(None, None, over)


@pytest.mark.parametrize("shape,attention,precision,ckpt", GRID, ids=lambda v: str(v))
def test_activations_match_what_autograd_saves(shape, attention, precision, ckpt):
    cfg = _config(shape, model__attention=attention, speed__precision=precision, model__grad_checkpointing=ckpt)
    est, saved = estimate(cfg), measure_saved(cfg)
    assert saved.activations > 0
    assert abs(est.activation_bytes / saved.activations - 1) <= 0.10, (est.activation_bytes, saved.activations)
    # autocast's weight copies are counted separately and exactly
    assert est.components["autocast weight copies"] == saved.weight_copies
    assert (saved.weight_copies > 0) == (precision == "bf16")


@pytest.mark.parametrize(
    "preset,attention", [("gpt2", "flash"), ("gpt2-medium", "manual")], ids=["gpt2-flash", "gpt2-medium-manual"]
)
def test_activation_formula_holds_at_real_preset_widths(preset, attention):
    """The presets' own widths, heads and 50257-id vocab; one layer and a short sequence keep it fast
    (the formula is linear in layers; the T and T^2 terms are exercised by the grid)."""
    cfg = resolve(preset, None, {"model.n_layer": 1, "speed.device": "cpu", "speed.precision": "bf16",
                                 "speed.compile": False, "train.batch_size": 1, "train.block_size": 64,
                                 "model.attention": attention})  # fmt: skip
    est, saved = estimate(cfg), measure_saved(cfg)
    assert abs(est.activation_bytes / saved.activations - 1) <= 0.10
    assert est.components["autocast weight copies"] == saved.weight_copies


@pytest.mark.parametrize("shape,precision", list(itertools.product(["s1", "s2"], ["fp32", "bf16"])), ids=str)
def test_chunked_loss_activations_match_what_autograd_saves(shape, precision):
    """model.loss = chunked: the saved gradients replace the log-softmax; no lm_head weight copy."""
    cfg = _config(shape, model__loss="chunked", speed__precision=precision)
    est, saved = estimate(cfg), measure_saved(cfg)
    assert abs(est.activation_bytes / saved.activations - 1) <= 0.10, (est.activation_bytes, saved.activations)
    assert est.components["autocast weight copies"] == saved.weight_copies
    plain = estimate(_config(shape, speed__precision=precision))
    assert est.activation_bytes < plain.activation_bytes


PEAK_GRID = [("fp32", "flash", False, 1, "plain"), ("bf16", "flash", True, 2, "plain"),
             ("fp32", "manual", False, 2, "plain"), ("fp32", "flash", True, 1, "plain"),
             ("fp32", "flash", False, 1, "chunked"), ("bf16", "flash", False, 2, "chunked")]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("precision,attention,ckpt,accum,loss", PEAK_GRID, ids=lambda v: str(v))
def test_peak_matches_the_live_tensor_peak_of_a_real_training_step(tmp_path, make_dataset, precision,
                                                                    attention, ckpt, accum, loss):  # fmt: skip
    """Parameters + AdamW + gradients + activations + the transients (the loss's fp32 gradients,
    the held logits, a recomputed block; with the chunked loss its chunk working set and saved
    gradients instead): the predicted allocated peak vs the profiler's memory timeline of one
    steady-state step of the real Trainer on CPU."""
    from bench.memory_measure import measure_peak
    from engine.run.preflight import open_data

    data = make_dataset("gpt2-tui", vocab_size=500)
    cfg = _config({"model.n_layer": 2, "model.n_head": 2, "model.n_embd": 64, "model.block_size": 64,
                   "train.batch_size": 8, "data.path": str(data), "data.prefetch": False},
                  speed__precision=precision, model__attention=attention, model__grad_checkpointing=ckpt,
                  train__grad_accum=accum, model__loss=loss)  # fmt: skip
    cfg, dataset = open_data(cfg)
    measured = measure_peak(cfg, dataset, tmp_path / "run")
    est = estimate(cfg)
    assert abs(est.allocated_peak_bytes / measured.peak - 1) <= 0.10, (est.phases, measured)
    # No exact check of the profiler's per-category split here: its categories are inferred
    # heuristically, and about one run in four it files a LayerNorm mean/rstd (B*T floats,
    # 2048 bytes at this size) under "parameter". Parameters, gradients and AdamW state are
    # checked exactly against the real tensors in test_parameters_gradients_adamw_state_exact.
    assert not (tmp_path / "run").exists()


def test_llmc_anchor_gpt2_124m_bf16_flash():
    """llm.c reports ~331 MiB of activations per 1024-token sequence for GPT-2 124M (bf16, flash)."""
    cfg = resolve("gpt2", None, {"speed.device": "cuda", "speed.precision": "bf16", "speed.compile": False,
                                 "train.batch_size": 1, "train.block_size": 1024})  # fmt: skip
    est = estimate(cfg)
    blocks = 12 * est.layer_activation_bytes / tx.MiB
    assert blocks == pytest.approx(324.75, abs=0.01)  # 27,712 bytes per token per layer
    assert abs(blocks / 331 - 1) < 0.03


@pytest.mark.parametrize("flags", [{}, {"model__bias": False, "model__pad_vocab": False}], ids=["bias", "no-bias"])
def test_parameters_gradients_adamw_state_exact(flags):
    cfg = _config("s1", speed__precision="bf16", **flags)
    est, real = estimate(cfg), measure_state(cfg)
    assert est.components["parameters"] == real.parameters
    assert est.components["gradients"] == real.gradients
    assert est.components["AdamW state"] == real.optimizer
    assert est.n_params == GPT(cfg.model).num_params()


def test_preset_parameter_counts_match_the_real_models():
    for preset in ["gpt2", "gpt2-medium", "gpt2-xl"]:
        cfg = resolve(preset, None, {"model.vocab_size": 50257})
        with torch.device("meta"):  # real module shapes, no memory, no init time
            model = GPT(cfg.model)
        assert memory.param_count(cfg) == model.num_params(), preset
    assert memory.param_count(resolve("gpt2", None, {"model.vocab_size": 50257})) == 124_475_904


def test_peak_is_the_sum_of_its_parts_and_grows_with_the_batch():
    cfg = resolve("gpt2", None, {"speed.device": "cuda", "speed.compile": False})
    est = estimate(cfg)
    assert sum(est.breakdown.values()) == est.peak_bytes
    assert est.allocated_peak_bytes == max(est.phases.values()) == est.phases[est.peak_phase]
    assert est.peak_bytes > est.allocated_peak_bytes  # CUDA context + allocator margin
    peaks = [estimate(memory.with_batch(cfg, b, 1)).peak_bytes for b in (1, 2, 4, 8, 16)]
    assert peaks == sorted(peaks) and peaks[0] < peaks[-1]
    # the fp32 B*T*V logits dominate GPT-2 small at micro-batch 16
    assert est.components["logits & loss"] > est.components["parameters"]


def test_switches_move_the_estimate_the_right_way():
    cfg = resolve("gpt2", None, {"speed.device": "cuda", "speed.compile": False, "speed.precision": "bf16"})
    base = estimate(cfg)
    ckpt = estimate(cfg.model_copy(update={"model": cfg.model.model_copy(update={"grad_checkpointing": True})}))
    assert ckpt.layer_activation_bytes < base.layer_activation_bytes / 3
    assert ckpt.activation_bytes < base.activation_bytes
    manual = estimate(cfg.model_copy(update={"model": cfg.model.model_copy(update={"attention": "manual"})}))
    assert manual.layer_activation_bytes > 2 * base.layer_activation_bytes  # T^2 probabilities
    fp32 = estimate(cfg.model_copy(update={"speed": cfg.speed.model_copy(update={"precision": "fp32"})}))
    assert fp32.layer_activation_bytes > base.layer_activation_bytes
    compiled = estimate(cfg.model_copy(update={"speed": cfg.speed.model_copy(update={"compile": True})}))
    assert compiled.layer_activation_bytes < base.layer_activation_bytes and compiled.notes
    fsdp = estimate(cfg, world_size=8, sharding="fsdp")
    assert fsdp.components["parameters"] * 8 >= base.components["parameters"] > fsdp.components["parameters"]
    assert base.peak_bytes > fsdp.peak_bytes
    # DDP's gradient buckets outlive zero_grad: without accumulation they add to the peak
    single = memory.with_batch(cfg, 16, 1)
    assert estimate(single, world_size=8, sharding="ddp").peak_bytes > estimate(single).peak_bytes


def test_suggest_fit_keeps_the_step_and_takes_the_largest_batch_that_fits():
    cfg = resolve("gpt2", None, {"speed.device": "cuda", "train.batch_size": 64, "train.grad_accum": 8})
    device = 24 * tx.GiB
    assert not estimate(cfg).fits(device)
    fitted = suggest_fit(cfg, device)
    assert fitted is not None
    b, accum = fitted.train.batch_size, fitted.train.grad_accum
    assert b * accum == 64 * 8 and estimate(fitted).fits(device)
    larger = [d for d in range(b + 1, 513) if 512 % d == 0]
    assert not estimate(memory.with_batch(cfg, larger[0], 512 // larger[0])).fits(device)
    assert fitted.model == cfg.model and fitted.optim == cfg.optim
    # a roomy device gets a larger micro-batch (fewer accumulation steps), not the same one
    roomy = suggest_fit(memory.with_batch(cfg, 2, 256), 140 * tx.GiB)
    assert roomy is not None and roomy.train.batch_size > 2
    assert suggest_fit(cfg, tx.GiB) is None


def test_vocab_comes_from_the_data_config_when_unset():
    cfg = resolve("gpt2", None, {"speed.device": "cuda"})
    assert cfg.model.vocab_size is None
    same = resolve("gpt2", None, {"speed.device": "cuda", "model.vocab_size": cfg.data.vocab_size})
    assert estimate(cfg) == estimate(same)


def test_device_memory():
    total = device.memory_bytes("cpu")
    assert total is not None and total > 2**28
    assert device.available_host_memory() <= total
    if not torch.cuda.is_available():
        assert device.memory_bytes("cuda") is None


@pytest.mark.parametrize("text,expected", [("80GiB", 80 * 2**30), ("24GB", 24 * 10**9), ("512 MiB", 512 * 2**20),
                                           ("16g", 16 * 2**30), ("1e9", 10**9)])  # fmt: skip
def test_parse_bytes(text, expected):
    assert tx.parse_bytes(text) == expected


def test_format_table_names_the_parts_the_peak_and_the_verdict():
    est = estimate(resolve("gpt2", None, {"speed.device": "cuda", "train.batch_size": 64, "speed.compile": False}))
    table = tx.format_table(est, 80 * tx.GiB)
    for part in ["parameters", "AdamW state", "activations (12 blocks)", "logits & loss", "CUDA context", "peak ("]:
        assert part in table
    assert "fits" in table and tx.human(est.peak_bytes) in table
    assert "does not fit" in tx.format_table(est, 8 * tx.GiB)
    assert "unknown" in tx.format_table(est, None)


# ---------------------------------------------------------------- the CLI


def test_estimate_cli_table_json_and_exit_status(capsys):
    argv = ["estimate", "--preset", "gpt2", "--batch-size", "16", "--block-size", "1024", "--precision", "bf16"]
    assert main([*argv, "--device-memory", "80GiB"]) == 0
    out = capsys.readouterr().out
    assert "bf16 on cuda" in out and "fits: peak" in out
    assert main([*argv, "--device-memory", "80GiB", "--json"]) == 0
    est = MemoryEstimate.model_validate_json(capsys.readouterr().out)
    assert est.batch_size == 16 and est.precision == "bf16" and est.target == "cuda"
    assert main([*argv, "--batch-size", "128", "--device-memory", "24GiB"]) == 1
    out = capsys.readouterr().out
    fix = re.search(r"--batch-size (\d+) --grad-accum (\d+)", out)
    assert "does not fit" in out and fix and int(fix[1]) * int(fix[2]) == 128 * 32


@pytest.mark.parametrize("flags,words", [(["--device-memory", "lots"], "memory size"),
                                         (["--world-size", "0"], "--world-size"),
                                         (["--preset", "nope"], "unknown preset")])  # fmt: skip
def test_estimate_cli_bad_input_is_one_line(capsys, flags, words):
    try:
        code = main(["estimate", *flags])
    except SystemExit as stop:  # argparse's own refusal of a bounded flag: exit 2, one line
        code = stop.code
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and words in err, err


@pytest.mark.slow
def test_train_refuses_a_config_that_cannot_fit_before_writing_anything(tmp_path, tiny_dataset):
    """Real subprocess, real dataset: 65536 sequences a micro-batch (the largest allowed) of a
    512-wide, 8-layer model is hundreds of GB; refused with the fix."""
    exe = Path(sys.executable).with_name("gpt2-tui")
    run = tmp_path / "run"
    argv = [str(exe), "train", "--preset", "micro", "--device", "cpu", "--precision", "fp32",
            "--data", str(tiny_dataset), "--out", str(run), "--batch-size", "65536", "--n-embd", "512",
            "--n-layer", "8"]  # fmt: skip
    res = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "predicted peak memory" in err and "RAM available" in err and "--force" in err
    fix = re.search(r"--batch-size (\d+) --grad-accum (\d+)", err)
    assert fix and int(fix[1]) * int(fix[2]) == 65536
    assert not run.exists()


def test_force_skips_the_check():
    from engine.errors import UserError
    from engine.train.memory import check_fits

    cfg = _config("s1", train__batch_size=65536, model__n_embd=512, model__n_layer=8)  # hundreds of GB
    with pytest.raises(UserError, match="predicted peak memory"):
        check_fits(cfg, force=False)
    check_fits(cfg, force=True)
    check_fits(_config("s1"), force=False)  # a small config passes


def test_memory_check_needs_a_gpu_and_says_so(capsys):
    from bench.memory_check import main as check_main

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the GPU check below runs instead")
    assert check_main([]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--cpu" in err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_total_within_10_percent_of_max_memory_allocated(tmp_path):
    """The acceptance check on a GPU: gpt2, bf16, flash, eager, micro-batch 8, real Trainer."""
    from bench.memory_check import _gpu_config, _synthetic_dataset, run_peak

    data = _synthetic_dataset(tmp_path / "data", tokens=200_000)
    cfg = _gpu_config("gpt2", 8, False, data, steps=2)
    allocated, _, outcome = run_peak(cfg, tmp_path)
    assert outcome == "ok" and allocated
    assert abs(estimate(cfg).allocated_peak_bytes / allocated - 1) <= 0.10


@pytest.mark.parametrize("bias", [True, False])
def test_muon_state_is_one_buffer_per_block_matrix_to_the_byte(bias: bool) -> None:
    """optimizer muon: the blocks' matrices keep one fp32 momentum buffer (Muon), the rest AdamW's
    two plus a step scalar; the estimate equals what the real optimizers hold after a step."""
    import torch

    from engine.train import memory
    from engine.config import resolve
    from engine.train import build
    from engine.train.model import GPT

    flags = {"speed.device": "cpu", "speed.precision": "fp32", "model.vocab_size": 100, "model.bias": bias}
    muon = resolve("micro", None, flags | {"optim.optimizer": "muon"})
    model = GPT(muon.model)
    opt = build.optimizer(model, muon.optim, torch.device("cpu"))
    x = torch.randint(0, 100, (2, 16))
    model(x, x)[1].backward()
    opt.step()
    real = sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor))
    est = memory.estimate(muon)
    assert est.components["AdamW + Muon state"] == real
    adamw = memory.estimate(resolve("micro", None, flags)).components["AdamW state"]
    assert adamw - real == 4 * memory.muon_params(memory._shape(muon)) + 4 * 4 * muon.model.n_layer  # one buffer and 4 step scalars less a block
