"""The memory estimator with issue 40's recipe switches on, held to what PyTorch really saves and holds
(as tests/config/test_memory.py holds GPT-2): activations within its stated 10% of what autograd saves,
parameters, gradients and optimizer state to the byte, and the peak of a real training step."""

from __future__ import annotations

import itertools

import pytest
import torch

from bench.memory_measure import measure_peak, measure_saved, measure_state
from engine.config import resolve
from engine.train import memory
from engine.train.memory import estimate
from engine.train.model import GPT

from harness import MEMORY_SHAPES as SHAPES  # even and odd depths, bias or not, padding or not
from harness import model_switches

ALL = model_switches()  # every recipe switch the config declares, each turned on
ONE_EACH = {k: {k: v} for k, v in ALL.items()}


def _config(shape: dict, **flags):
    return resolve(None, None, {"speed.device": "cpu", "speed.compile": False} | shape | flags)


def _check_saved(cfg) -> None:
    est, saved = estimate(cfg), measure_saved(cfg)
    assert abs(est.activation_bytes / saved.activations - 1) <= 0.10, (est.activation_bytes, saved.activations)
    assert est.components["autocast weight copies"] == saved.weight_copies  # the gates' casts too


@pytest.mark.parametrize("shape,attention,precision,ckpt",
                         list(itertools.product(SHAPES, ["flash", "manual"], ["fp32", "bf16"], [False, True])),
                         ids=str)  # fmt: skip
def test_every_switch_at_once_matches_what_autograd_saves(shape, attention, precision, ckpt):
    _check_saved(_config(SHAPES[shape] | ALL, **{"model.attention": attention, "speed.precision": precision,
                                                 "model.grad_checkpointing": ckpt}))  # fmt: skip


@pytest.mark.parametrize("switch,attention,precision",
                         list(itertools.product(ONE_EACH, ["flash", "manual"], ["fp32", "bf16"])), ids=str)
def test_each_switch_alone_matches_what_autograd_saves(switch, attention, precision):
    cfg = _config(SHAPES["s2"] | ONE_EACH[switch], **{"model.attention": attention, "speed.precision": precision})
    _check_saved(cfg)
    if switch in ("model.qk_norm", "model.value_embeds", "model.logit_softcap", "model.value_residual"):
        plain = estimate(_config(SHAPES["s2"], **{"model.attention": attention, "speed.precision": precision}))
        assert estimate(cfg).activation_bytes > plain.activation_bytes  # each saves something more


@pytest.mark.parametrize("loss", ["plain", "chunked"])
@pytest.mark.parametrize("bias", [True, False])
def test_parameters_gradients_and_optimizer_state_to_the_byte(bias, loss):
    for shape in ("s1", "s2", "s3"):
        cfg = _config(SHAPES[shape] | ALL, **{"speed.precision": "bf16", "model.bias": bias, "model.loss": loss})
        est, real = estimate(cfg), measure_state(cfg)
        assert est.components["parameters"] == real.parameters
        assert est.components["gradients"] == real.gradients
        assert est.components["AdamW state"] == real.optimizer
        assert est.n_params == GPT(cfg.model).num_params() == cfg.model.n_params()


def test_muon_state_with_every_switch_to_the_byte():
    """Muon keeps the blocks' matrices; the recipe's tables and scalars stay with AdamW."""
    from engine.train import build

    cfg = _config(SHAPES["s1"] | ALL, **{"speed.precision": "fp32", "optim.optimizer": "muon"})
    model = GPT(cfg.model)
    opt = build.optimizer(model, cfg.optim, torch.device("cpu"))
    x = torch.randint(0, 100, (2, 16))
    model(x, x)[1].backward()
    opt.step()
    real = sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values()
               if isinstance(v, torch.Tensor))  # fmt: skip
    assert memory.estimate(cfg).components["AdamW + Muon state"] == real


PEAK_GRID = [("fp32", "flash", False, 1, "plain"), ("bf16", "flash", True, 2, "plain"),
             ("fp32", "manual", False, 2, "plain"), ("fp32", "flash", True, 1, "plain"),
             ("fp32", "flash", False, 1, "chunked"), ("bf16", "flash", False, 2, "chunked")]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("precision,attention,ckpt,accum,loss", PEAK_GRID, ids=str)
def test_peak_with_every_switch_matches_the_live_tensor_peak_of_a_real_step(tmp_path, make_dataset, precision,
                                                                           attention, ckpt, accum, loss):  # fmt: skip
    """As test_memory's peak test: the real Trainer's steady-state step, the profiler's memory timeline."""
    from engine.run.preflight import open_data

    data = make_dataset("gpt2-tui", vocab_size=500)
    cfg = _config({"model.n_layer": 2, "model.n_head": 2, "model.n_embd": 64, "model.block_size": 64,
                   "train.batch_size": 8, "data.path": str(data), "data.prefetch": False} | ALL,
                  **{"speed.precision": precision, "model.attention": attention, "model.grad_checkpointing": ckpt,
                     "train.grad_accum": accum, "model.loss": loss, "model.attn_window": 8})  # fmt: skip
    cfg, dataset = open_data(cfg)
    measured = measure_peak(cfg, dataset, tmp_path / "run")
    est = estimate(cfg)
    assert abs(est.allocated_peak_bytes / measured.peak - 1) <= 0.10, (est.phases, measured)
    assert not (tmp_path / "run").exists()


def test_where_flex_runs_the_window_no_t_by_t_bias_is_counted():
    """SDPA's masked kernels take the window as a T x T bias in q's dtype, saved by every layer; a
    compiled CUDA run without dropout at whole 128-token blocks runs FlexAttention, which takes a
    block mask instead (engine.train.window.flex_reason): its window adds nothing to the saved
    bytes. Uncompiled, the bias is counted as before."""
    shape = {"model.n_layer": 4, "model.n_head": 4, "model.n_embd": 128, "model.block_size": 256,
             "train.batch_size": 4, "model.vocab_size": 512}  # fmt: skip
    T, L, a = 256, 4, 2
    for compiled in (True, False):
        flags = {"speed.device": "cuda", "speed.precision": "bf16", "speed.compile": compiled}
        windowed = estimate(_config(shape, **flags, **{"model.attn_window": 32})).activation_bytes
        plain = estimate(_config(shape, **flags)).activation_bytes
        assert windowed - plain == (0 if compiled else L * a * T * T), compiled
