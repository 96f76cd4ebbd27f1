"""The sliding window through FlexAttention (engine/train/window.py, GPT.use_flex): where it runs,
and that compiled flex attends exactly what SDPA's dense band does. torch has no flex backward on
CPU, so what trains through it is CUDA's; here the forward is compared, compiled, both scopes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.config import ModelConfig, resolve
from engine.run.preflight import open_data
from engine.train import build, compiling, distributed, window
from engine.train.model import GPT

T, WINDOW = 64, 8
ROOT = Path(__file__).resolve().parents[2]


def test_flex_runs_the_window_only_where_it_trains_and_is_fast() -> None:
    """CUDA, compiled, no dropout, a window shorter than the sequence, a sequence of whole 128-token
    blocks: each one off names why."""
    assert window.flex_reason("cuda", True, WINDOW, 1024, 0.0) is None
    assert "CUDA" in window.flex_reason("cpu", True, WINDOW, 1024, 0.0)
    assert "compiled" in window.flex_reason("cuda", False, WINDOW, 1024, 0.0)
    assert "dropout" in window.flex_reason("cuda", True, WINDOW, 1024, 0.1)
    assert "multiple of 128" in window.flex_reason("cuda", True, WINDOW, 1000, 0.0)  # flex's block
    for w in (None, 1023, 2000):  # no band: a token already sees everything before it
        assert "no window" in window.flex_reason("cuda", True, w, 1024, 0.0)


def test_the_block_mask_keeps_the_bands_blocks_and_is_built_once() -> None:
    """The block mask is the band (`attention.band`) densified, built once per (T, window, device)."""
    mask = window.block_mask(T, WINDOW, torch.device("cpu"))
    assert window.block_mask(T, WINDOW, torch.device("cpu")) is mask
    dense = mask.to_dense()  # (1, 1, blocks, blocks): which blocks flex visits
    assert dense.shape[-1] == 1 and bool(dense.all())  # 64 tokens: one 128-token block
    big = window.block_mask(512, 100, torch.device("cpu")).to_dense()[0, 0]  # 4 x 4 blocks
    assert big.tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]  # the band's, no more


def _model(**switches: object) -> GPT:
    torch.manual_seed(0)
    shape = dict(n_layer=2, n_head=2, n_embd=32, block_size=T, vocab_size=61, attn_window=WINDOW)
    return GPT(ModelConfig(**(shape | switches))).eval()


@pytest.mark.slow  # two CPU compiles of flex's forward each
@pytest.mark.parametrize("switches,scope", [
    ({}, "blocks"),  # q, k, v views of c_attn's output
    ({"qk_norm": True, "positions": "rotary"}, "model"),  # q, k of their own, v a view: v copied for flex
    ({"value_residual": True}, "blocks"),  # the second layer's v its own, q and k views: q and k copied
], ids=["window", "qk-norm+rotary", "value-residual"])  # fmt: skip
def test_compiled_flex_attends_what_the_dense_band_does_and_eager_calls_keep_sdpa(switches: dict, scope: str) -> None:
    """With a block mask of another window, compiled logits change and eager ones do not: the block
    mask is what compiled code attends through, eager code takes SDPA's band. With the window's own
    block mask, compiled logits equal the dense band's, whatever layout the switches give q, k, v
    (on the code before flex got one layout, qk-norm's case differed by 0.14)."""
    x = torch.randint(0, 61, (2, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = _model(**switches)(x, x, return_logits=True)[0]
        model = _model(**switches)
        model.use_flex(window.block_mask(T, 2, torch.device("cpu")))  # not the model's window: tells them apart
        assert torch.equal(model(x, x, return_logits=True)[0], want)  # eager: SDPA's band, the mask unused
        forward = compiling.compile_forward(model, scope, None)
        torch._dynamo.reset()
        assert not torch.allclose(forward(x, x, return_logits=True)[0], want, atol=1e-3)
        model.use_flex(window.block_mask(T, WINDOW, torch.device("cpu")))
        torch._dynamo.reset()
        torch.testing.assert_close(forward(x, x, return_logits=True)[0], want, rtol=1e-4, atol=1e-4)
    torch._dynamo.reset()


@pytest.mark.slow  # four traced forward+backward passes
@pytest.mark.parametrize("scope", ["blocks", "model"])
def test_training_through_flex_traces_with_checkpointing_and_its_gradients_are_the_dense_bands(
        scope: str, monkeypatch) -> None:  # fmt: skip
    """What a compiled CUDA run traces, traced here: Dynamo and AOTAutograd (backend aot_eager: no
    code generated) over a training forward and backward through flex, per-block checkpointing on,
    q and k of their own. torch refuses flex's backward on a CPU before tracing anything; that
    refusal is lifted here so the graph can be traced, and flex's reference kernel computes it.
    The loss and every gradient equal the dense band's; a block mask of another window changes them
    (flex is what ran). CUDA's generated kernels are left to the GPU report's window row."""
    import torch.nn.attention.flex_attention as flex_module

    monkeypatch.setattr(flex_module, "_validate_device", lambda *a: None)
    switches = {"qk_norm": True, "positions": "rotary", "grad_checkpointing": True}
    x = torch.randint(0, 61, (2, T), generator=torch.Generator().manual_seed(1))
    dense = _model(**switches).train()
    dense(x, x)[1].backward()
    for w, same in ((WINDOW, True), (2, False)):
        model = _model(**switches).train()
        model.use_flex(window.block_mask(T, w, torch.device("cpu")))
        forward = compiling.compile_forward(model, scope, None, backend="aot_eager")
        loss = forward(x, x)[1]
        loss.backward()
        grads = [(a.grad, b.grad) for a, b in zip(dense.parameters(), model.parameters())]
        assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in grads) == same, w
        torch._dynamo.reset()


@pytest.mark.slow  # a torchrun launch
def test_under_ddp_the_split_graph_carries_the_block_mask_and_the_gradients_are_the_dense_bands(tmp_path) -> None:
    """Scope model under DDP: Dynamo's DDPOptimizer splits the graph at DDP's buckets (a model of
    4 x 512 wide fills more than one), and each piece takes the block mask's tensors as inputs.
    Traced as above (aot_eager, flex's reference kernel, the CPU refusal lifted): each rank's
    gradients equal one process's dense-band gradients over both ranks' batches, all-reduced."""
    env = dict(os.environ, OMP_NUM_THREADS="1", TORCH_LOGS="ddp_graphs")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "--max-restarts=0"]
    proc = subprocess.run([*torchrun, __file__, "worker", str(tmp_path)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=420)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "submod_1" in proc.stderr  # DDPOptimizer split the graph: more than one piece
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"{rank}.json").read_text())
        assert seen["flex"] and seen["worst"] < 1e-5, seen


def _worker(out: Path) -> None:
    import torch.distributed as dist
    import torch.nn.attention.flex_attention as flex_module

    from engine.train import distributed

    flex_module._validate_device = lambda *a: None  # the CPU refusal lifted: flex's reference kernel
    ctx = distributed.init("cpu")
    switches = {"qk_norm": True, "positions": "rotary", "n_layer": 4, "n_head": 8, "n_embd": 512}
    model, dense = _model(**switches).train(), _model(**switches).train()
    model.use_flex(window.block_mask(T, WINDOW, torch.device("cpu")))
    ddp = distributed.replicate(compiling.compile_forward(model, "model", None, backend="aot_eager"),
                                torch.device("cpu"))  # fmt: skip
    x = torch.randint(0, 61, (2, T), generator=torch.Generator().manual_seed(1 + ctx.rank))
    ddp(x, x)[1].backward()
    both = [torch.empty_like(x) for _ in range(2)]
    dist.all_gather(both, x)
    (sum(dense(b, b)[1] for b in both) / 2).backward()
    worst = max((a.grad - b.grad).abs().max().item() for a, b in zip(dense.parameters(), model.parameters()))
    flex = all(b.attn.block_mask is not None for b in model.transformer.h)
    (out / f"{ctx.rank}.json").write_text(json.dumps({"worst": worst, "flex": flex}))
    distributed.shutdown()
    distributed.leave(0)


def test_a_segment_sets_every_layers_block_mask_where_flex_runs_and_clears_it_where_not(
        tiny_dataset, tmp_path, monkeypatch) -> None:  # fmt: skip
    """build.finish asks flex_reason: where it says flex (a compiled CUDA run's answer, given here),
    every layer gets the window's block mask and the segment names flex with nothing timed; the next
    segment on this CPU (the real answer) clears it and times SDPA as before."""
    config = resolve("micro", None, {"data.path": str(tiny_dataset), "speed.device": "cpu", "speed.precision": "fp32",
                                     "model.attn_window": 8})  # uncompiled: no process-wide compile set-up  # fmt: skip
    config, dataset = open_data(config)
    p = build.parts(config, dataset, distributed.Context(), None)
    real = window.flex_reason
    monkeypatch.setattr(window, "flex_reason", lambda *a: None)
    build.finish(p, config, tmp_path)
    masks = {id(b.attn.block_mask) for b in p.model.transformer.h}
    assert masks == {id(window.block_mask(config.seq_len, 8, p.device))}
    assert p.attention == window.FLEX and p.attention_ms == {} and p.sdpa is None
    monkeypatch.setattr(window, "flex_reason", real)
    build.finish(p, config, tmp_path)
    assert all(b.attn.block_mask is None for b in p.model.transformer.h) and p.attention == "flash"
    torch._dynamo.reset()


if __name__ == "__main__" and sys.argv[1:2] == ["worker"]:
    _worker(Path(sys.argv[2]))
