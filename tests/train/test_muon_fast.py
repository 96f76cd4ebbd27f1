"""Our Muon (engine/train/muon.py, issue 40 item 2): torch.optim.Muon's numbers with one batched
Newton-Schulz per shape, the guard's skip honoured on the device, the work shared under DDP, and
the momentum warm-up (optim.muon_momentum_warmup) set by the step, so a resume is bit-exact.
Run as a script under torchrun (`... test_muon_fast.py ddp OUT`) it is the DDP test's worker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from engine.config import resolve
from engine.train.muon import COEFFICIENTS, EPS, NS_STEPS, Muon, compiled_orthogonalize, momentum_at

SHAPES = [(24, 8), (8, 8), (8, 24), (24, 8), (8, 8), (16, 8)]  # tall, square, wide: stacks of 3 (one transposed), 2, 1


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g) * 0.1) for s in SHAPES]


def _grads(step: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(s, generator=g) for s in SHAPES]


def _stepped(opt: torch.optim.Optimizer, params: list[torch.nn.Parameter], steps: int, **kw) -> None:
    for i in range(steps):
        for p, grad in zip(params, _grads(i)):
            p.grad = grad.clone()
        opt.step(**kw)


@pytest.mark.parametrize("settings", [
    {"weight_decay": 0.0, "momentum": 0.95, "nesterov": True, "adjust_lr_fn": None},
    {"weight_decay": 0.1, "momentum": 0.9, "nesterov": False, "adjust_lr_fn": "match_rms_adamw"},
])  # fmt: skip
def test_three_steps_equal_torch_muon(settings):
    """Per matrix, the batched step is torch's: params and momentum after 3 steps within 1e-5 (fp32),
    with and without the skip verdict given (set to 0)."""
    if not hasattr(torch.optim, "Muon"):
        pytest.skip("torch.optim.Muon (PyTorch 2.9+) is the reference")
    theirs, ours, kept = _params(), _params(), _params()
    ref = torch.optim.Muon(theirs, lr=0.02, **settings)
    opt, opt_kept = Muon(ours, lr=0.02, **settings), Muon(kept, lr=0.02, **settings)
    _stepped(ref, theirs, 3)
    _stepped(opt, ours, 3)
    _stepped(opt_kept, kept, 3, skip=torch.zeros(()))
    for mine in (ours, kept):
        for a, b in zip(theirs, mine):
            torch.testing.assert_close(b, a, atol=1e-5, rtol=0)
    for a, b in zip(theirs, ours):
        torch.testing.assert_close(opt.state[b]["momentum_buffer"], ref.state[a]["momentum_buffer"], atol=1e-5, rtol=0)
    assert not all(torch.equal(a, b) for a, b in zip(_params(), ours))  # it trained
    buffers = [opt.state[q]["momentum_buffer"] for q in ours]
    saved = opt.state_dict()  # torch's layout: one momentum_buffer per parameter, torch's group keys
    assert all(opt.state[q]["momentum_buffer"] is b for q, b in zip(ours, buffers))  # saving left the bank as it was
    assert all(b.is_contiguous() for b in (s["momentum_buffer"] for s in saved["state"].values()))
    assert set(saved["param_groups"][0]) == set(ref.state_dict()["param_groups"][0])
    assert all(set(s) == {"momentum_buffer"} for s in saved["state"].values()) and len(saved["state"]) == len(SHAPES)


@pytest.mark.parametrize("native", ["none", "bf16"])
def test_the_newton_schulz_runs_in_bf16_only_where_the_cpu_does_bf16_natively(monkeypatch, native):
    """Emulated bf16 costs ~30x fp32 on an AVX2 or AMD EPYC CPU (issue 45 item 0): there the iteration
    runs in fp32; where bf16 is native, in torch's bf16. The run's optimizer takes the device's
    choice, the step iterates in it, and the estimator counts its stack at that width."""
    from engine.train import build, memory
    from engine.train import muon as muon_mod
    from engine.train.model import GPT
    from harness import force_cpu_native

    force_cpu_native(monkeypatch, native)
    want = torch.bfloat16 if native == "bf16" else torch.float32
    seen: list[torch.dtype] = []
    real = muon_mod.orthogonalize
    monkeypatch.setattr(muon_mod, "orthogonalize", lambda G, *a: seen.append(a[3]) or real(G, *a))  # a[3]: dtype
    cfg = resolve("micro", None, {"speed.device": "cpu", "optim.optimizer": "muon", "model.vocab_size": 64})
    model = GPT(cfg.model)
    opt = build.optimizer(model, cfg.optim, torch.device("cpu"))
    assert opt.muon.ns_dtype == want
    x = torch.randint(0, 64, (2, 16))
    model(x, x)[1].backward()
    opt.step()
    assert seen and set(seen) == {want}
    bf16 = memory._optimizer_transient(cfg, memory._shape(cfg), "cpu", 0)
    force_cpu_native(monkeypatch, "bf16" if native == "none" else "none")
    other = memory._optimizer_transient(cfg, memory._shape(cfg), "cpu", 0)
    stack = 2 * cfg.model.n_layer * 4 * cfg.model.n_embd**2  # the MLP's stack: 12 bytes an element in fp32, 6 in bf16
    assert other - bf16 == (6 * stack if native == "bf16" else -6 * stack)


def test_the_largest_stack_goes_first(monkeypatch):
    """A model's stacks in its parameter order are c_attn, attn.c_proj, then the MLP's (8 C^2 a
    layer, the largest); they step largest first, so under DDP the result held while a gather is in
    flight is the MLP's beside the smaller stacks' work, never a small one's beside the MLP's peak
    (engine.train.memory._optimizer_transient counts that peak alone)."""
    from engine.train import build
    from engine.train import muon as muon_mod
    from engine.train.model import GPT

    widths: list[int] = []
    real = muon_mod.orthogonalize
    monkeypatch.setattr(muon_mod, "orthogonalize", lambda G, *a: widths.append(G.size(-1)) or real(G, *a))
    cfg = resolve("micro", None, {"speed.device": "cpu", "optim.optimizer": "muon", "model.vocab_size": 64})
    model = GPT(cfg.model)
    opt = build.optimizer(model, cfg.optim, torch.device("cpu"))
    x = torch.randint(0, 64, (2, 16))
    model(x, x)[1].backward()
    opt.step()
    C = cfg.model.n_embd
    assert widths == [4 * C, 3 * C, C]


@pytest.mark.slow
def test_where_the_run_compiles_the_newton_schulz_runs_compiled_and_steps_as_eager(tmp_path, tiny_dataset):
    """speed.compile on: build.finish sets the run's Muon to compile its Newton-Schulz (off: eager),
    and compiled steps move the weights as eager ones do, the skip verdict honoured the same. Not
    bit for bit: Inductor keeps the bf16 iteration's fused intermediates in fp32, and five quintic
    iterations carry that ~2% apart; both land in Newton-Schulz's singular-value band."""
    from torch._dynamo.utils import counters

    from harness import built_parts

    for compile_on in (False, True):
        parts = built_parts(tiny_dataset, tmp_path / f"run-{compile_on}",
                            {"optim.optimizer": "muon", "speed.compile": compile_on, "speed.precision": "fp32"})  # fmt: skip
        assert parts.optimizer.muon.compiled is compile_on
    eager, compiled, skipped = _params(), _params(), _params()
    opt_eager, opt_compiled, opt_skipped = Muon(eager, lr=0.02), Muon(compiled, lr=0.02), Muon(skipped, lr=0.02)
    opt_compiled.compiled = opt_skipped.compiled = True
    graphs = counters["stats"]["unique_graphs"]
    _stepped(opt_eager, eager, 3)
    _stepped(opt_compiled, compiled, 3)
    assert counters["stats"]["unique_graphs"] > graphs  # torch.compile traced the Newton-Schulz
    for p0, a, b in zip(_params(), eager, compiled):
        moved = (a - p0).norm()
        assert moved > 0 and (b - a).norm() / moved < 0.05  # the same step, to the iteration's rounding
    stack = torch.randn(3, 8, 24, generator=torch.Generator().manual_seed(0))
    singular = torch.linalg.svdvals(compiled_orthogonalize()(stack, COEFFICIENTS, NS_STEPS, EPS).float())
    assert 0.6 < singular.min() and singular.max() < 1.2  # orthogonalized: the quintic's band, ~0.68-1.13
    _stepped(opt_skipped, skipped, 2, skip=torch.ones(()))
    assert all(torch.equal(a, b) for a, b in zip(_params(), skipped))  # a skipped step changes nothing
    for i, momentum in enumerate((0.85, 0.9, 0.93, 0.95)):  # the warm-up's ramp: a new momentum each step
        opt_compiled.param_groups[0]["momentum"] = momentum
        _stepped(opt_compiled, compiled, 1, skip=torch.zeros(()))
        graphs = counters["stats"]["unique_graphs"] if i == 0 else graphs
    assert counters["stats"]["unique_graphs"] == graphs  # ... and no new graph


def test_a_step_with_an_inf_grad_leaves_weights_and_momentum_as_they_were(tiny_dataset):
    """Through the real guard and build.step_unless: a step whose gradient holds inf is judged bad
    on the device and changes neither the Muon matrices nor their momentum (nor AdamW's half)."""
    from engine.train import build
    from engine.train.guard import StepGuard
    from engine.train.model import GPT
    from harness import micro_config

    cfg = micro_config(tiny_dataset, **{"optim.optimizer": "muon", "model.vocab_size": 64})
    model = GPT(cfg.model)
    opt = build.optimizer(model, cfg.optim, torch.device("cpu"))
    guard = StepGuard(cfg.train.max_bad_steps, torch.device("cpu"))
    x = torch.randint(0, cfg.model.vocab_size, (2, cfg.seq_len))

    def step(poison: bool) -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        _, loss = model(x, x)
        loss.backward()
        if poison:
            next(p for g in opt.muon.param_groups for p in g["params"]).grad[0, 0] = float("inf")
        norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
        skip = guard.judge(loss, norm, scaled=False)
        build.step_unless(opt, skip)
        return skip

    assert step(poison=False).item() == 0  # a good step first: the momentum is no longer zero
    weights = [p.detach().clone() for p in model.parameters()]
    state = {id(p): {k: v.clone() for k, v in s.items()} for p, s in opt.state.items()}
    assert any(s["momentum_buffer"].any() for s in opt.muon.state.values())
    assert step(poison=True).item() == 1
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters()))
    assert all(torch.equal(v, state[id(p)][k]) for p, s in opt.state.items() for k, v in s.items())
    step(poison=False)
    assert not all(torch.equal(a, b) for a, b in zip(weights, model.parameters()))  # the next good step trains


def test_momentum_warmup_ramps_from_0_85_by_the_step():
    o = resolve("micro", None, {"optim.optimizer": "muon", "optim.muon_momentum": 0.95,
                                "optim.muon_momentum_warmup": 10}).optim  # fmt: skip
    assert [momentum_at(s, o) for s in (0, 5, 10, 11)] == pytest.approx([0.85, 0.90, 0.95, 0.95])
    assert momentum_at(0, o.model_copy(update={"muon_momentum_warmup": 0})) == 0.95  # off: the setting


@pytest.mark.slow
def test_momentum_warmup_changes_the_run_and_resumes_bit_exact(tmp_path, tiny_dataset):
    """With the warm-up on (12 steps), 8 steps, stop, resume to 16 == 16 straight (every loss and
    val loss equal), and the curve differs from the same run without the warm-up."""
    from harness import losses, stopped_at, trained

    common = {"optim.optimizer": "muon", "optim.muon_momentum_warmup": 12, "train.max_steps": 16,
              "train.eval_interval": 4, "train.ckpt_interval": 100, "model.dropout": 0.1}  # fmt: skip
    straight = trained(tmp_path / "straight", tiny_dataset, **common)
    off = trained(tmp_path / "off", tiny_dataset, **(common | {"optim.muon_momentum_warmup": 0}))
    assert losses(straight)[:1] == losses(off)[:1] and losses(straight)[2:] != losses(off)[2:]
    run_dir = tmp_path / "split"
    first = stopped_at(run_dir, tiny_dataset, 8, **common)
    assert first[-1].reason == "stopped" and first[-1].step == 8
    both = trained(run_dir, resume=True)
    assert losses(both) == losses(straight)
    val = lambda evs: [(e.step, e.val_loss) for e in evs if e.event == "eval"]  # noqa: E731
    assert val(both) == val(straight)


def _ddp_worker(out: Path) -> None:
    """One rank: the same params and grads on every rank, 2 steps of our Muon, world 2 (gloo).
    Rank 0 saves the params and the order in which Newton-Schulz ran and the gathers were
    started and waited for (the real functions, each call noted on its way through)."""
    import json

    import torch.distributed as dist

    from engine.train import distributed, muon

    order: list[list[Any]] = []
    real_ns, real_gather = muon.orthogonalize, dist.all_gather_into_tensor

    def noted_ns(G, *args, **kw):
        order.append(["ns", G.size(-1)])  # a stack by its width: 24, 8 and 16 here
        return real_ns(G, *args, **kw)

    class NotedWork:
        def __init__(self, work, width: int) -> None:
            self.work, self.width = work, width

        def wait(self) -> bool:
            order.append(["wait", self.width])
            return self.work.wait()

    def noted_gather(out, mine, async_op=False, **kw):
        order.append(["gather", out.size(-1), async_op])
        work = real_gather(out, mine, async_op=async_op, **kw)
        return NotedWork(work, out.size(-1)) if async_op else work

    muon.orthogonalize, dist.all_gather_into_tensor = noted_ns, noted_gather
    dist.init_process_group("gloo")
    params = _params()
    opt = Muon(params, lr=0.02, weight_decay=0.1)
    _stepped(opt, params, 2)
    if dist.get_rank() == 0:
        torch.save([p.detach() for p in params], out)
        out.with_suffix(".json").write_text(json.dumps(order))
    distributed.shutdown()
    distributed.leave(0)  # as the CLI's workers leave: a normal exit's teardown aborted 1 in 5 here


if __name__ == "__main__" and sys.argv[1:2] == ["ddp"]:
    _ddp_worker(Path(sys.argv[2]))


@pytest.mark.slow
def test_under_ddp_each_rank_orthogonalizes_its_share_and_gathers_it_while_the_next_stack_computes(tmp_path):
    """torchrun, gloo, 2 CPU processes: each rank orthogonalizes its share of each stack (3, 2 and 1
    matrices: shares padded) and all-gathers without waiting: each stack's gather is waited for
    only after the next stack's Newton-Schulz ran, so on a GPU the two overlap. The params after 2
    steps equal one process's."""
    import json

    out = tmp_path / "ddp.pt"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "--max-restarts=0", __file__, "ddp", str(out)],
                          env=env, capture_output=True, text=True, timeout=240)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    params = _params()
    _stepped(Muon(params, lr=0.02, weight_decay=0.1), params, 2)
    got = torch.load(out, weights_only=True)
    assert all(torch.equal(a, b) for a, b in zip(got, params))
    step = [["ns", 24], ["gather", 24, True], ["ns", 8], ["gather", 8, True], ["wait", 24],
            ["ns", 16], ["gather", 16, True], ["wait", 8], ["wait", 16]]  # fmt: skip
    assert json.loads(out.with_suffix(".json").read_text()) == step * 2


def test_momentum_warmup_with_adamw_warns_it_does_nothing():
    from engine.run import preflight

    given = {"optim.muon_momentum_warmup": 10}
    v = preflight.preflight(resolve("micro", overrides=given), explicit=given, dataset=False, memory=False)
    assert [w.problem for w in v.warnings] == ["muon momentum warmup 10 has no effect with the AdamW optimizer "
                                               "(it is Muon's)"]  # fmt: skip


class _Ops(TorchDispatchMode):
    """Every aten op a block of code runs, with what it made: (name, elements, dtype, fresh), fresh
    = a new tensor (neither a view nor written in place)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, int, torch.dtype, bool]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        fresh = not func.is_view and not func._schema.name.endswith("_") and not func._schema.is_mutable
        for o in out if isinstance(out, (list, tuple)) else [out]:
            if isinstance(o, torch.Tensor):
                self.ops.append((str(func), o.numel(), o.dtype, fresh))
        return out


def test_a_muon_step_copies_the_gradients_once_a_stack_and_folds_the_skip_in():
    """Issue 45 item 5: a step (the guard's skip given, as the trainer always gives it) makes one
    fp32 tensor the size of a gradient or more per stack, the gradients' stack: no where-copy of
    each gradient for the skip, no Nesterov copy, no fp32 copy of Newton-Schulz's result (the
    update adds its bf16 result, as torch's add_ does). The second step: the first makes the
    momentum bank."""
    from engine.train import build
    from engine.train.model import GPT

    cfg = resolve("micro", None, {"speed.device": "cpu", "optim.optimizer": "muon", "model.vocab_size": 64})
    model = GPT(cfg.model)
    opt = build.optimizer(model, cfg.optim, torch.device("cpu")).muon
    opt.ns_dtype = torch.bfloat16  # its temporaries then tell apart from the step's fp32 copies on any CPU
    x = torch.randint(0, 64, (2, 16))
    model(x, x)[1].backward()
    opt.step(skip=torch.zeros(()))
    smallest = min(p.numel() for g in opt.param_groups for p in g["params"])
    stacks = len({(min(p.shape), max(p.shape)) for g in opt.param_groups for p in g["params"]})
    seen = _Ops()
    with seen:
        opt.step(skip=torch.zeros(()))
    big = [(name, dtype) for name, n, dtype, fresh in seen.ops if n >= smallest and fresh]
    assert [name for name, dtype in big if dtype == torch.float32] == ["aten.stack.default"] * stacks
    assert not [op for op in seen.ops if op[0].startswith("aten.where") and op[1] > 1]
