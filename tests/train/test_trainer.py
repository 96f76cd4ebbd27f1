"""The training loop on the real engine: micro preset, tiny dataset, CPU fp32."""

import json
import math
import threading

import pytest
import torch

from engine.train.checkpoint import CheckpointDir
from engine.config import resolve
from engine.run.requests import Control
from engine.run.owner import start
from engine.train.trainer import lr_at
from harness import losses, stopped_at, train, trained


def test_lr_schedule_warms_up_then_decays_to_min():
    cfg = resolve("micro", None, {"optim.lr": 1.0, "optim.min_lr": 0.1, "optim.warmup_steps": 10}).optim
    assert lr_at(0, cfg, 100) == pytest.approx(0.1)
    assert lr_at(9, cfg, 100) == pytest.approx(1.0)
    assert lr_at(10, cfg, 100) == pytest.approx(1.0)
    assert lr_at(55, cfg, 100) == pytest.approx(0.55)
    assert lr_at(100, cfg, 100) == pytest.approx(0.1)
    assert lr_at(500, cfg, 100) == pytest.approx(0.1)
    lrs = [lr_at(s, cfg, 100) for s in range(10, 101)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))


@pytest.mark.slow
def test_events_schema_and_run_directory(tmp_path, tiny_dataset):
    run_dir = tmp_path / "run"
    events = trained(run_dir, tiny_dataset, **{"train.max_steps": 12, "train.grad_accum": 2})
    kinds = [e.event for e in events]
    assert kinds[0] == "run_started" and kinds[-1] == "run_finished"
    started = events[0]
    assert started.n_params > 0 and started.device == "cpu" and started.peak_flops is None
    assert started.precision == "fp32"
    assert started.config["model"]["vocab_size"] == 64  # bound from the dataset
    steps = [e for e in events if e.event == "step"]
    assert [s.step for s in steps] == list(range(1, 13))
    for s in steps:
        assert math.isfinite(s.loss) and s.lr > 0 and s.grad_norm > 0 and s.step_time_s > 0
        assert s.tokens_per_s == pytest.approx(4 * 2 * 32 / s.step_time_s)
        assert s.mfu is None and s.mem_bytes is None  # CPU: unknown, never invented
        assert s.tokens == s.step * 4 * 2 * 32
    evals = [e for e in events if e.event == "eval"]
    assert [e.step for e in evals] == [10, 12]  # none at step 0: the first step is not kept waiting
    assert kinds[1:3] == ["segment", "step"], kinds[:4]
    ckpts = [e for e in events if e.event == "checkpoint"]
    assert [c.step for c in ckpts] == [10, 12]
    assert (run_dir / "config.toml").is_file()
    files = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert files == ["best.pt", "latest", "step_000010.pt", "step_000012.pt"]
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step_000012.pt"
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        assert "event" in json.loads(line)


@pytest.mark.slow
def test_same_seed_same_loss_curve(tmp_path, tiny_dataset):
    a = trained(tmp_path / "a", tiny_dataset, **{"train.max_steps": 8, "model.dropout": 0.1})
    b = trained(tmp_path / "b", tiny_dataset, **{"train.max_steps": 8, "model.dropout": 0.1})
    c = trained(tmp_path / "c", tiny_dataset, **{"train.max_steps": 8, "model.dropout": 0.1, "train.seed": 7})
    assert losses(a) == losses(b)
    assert losses(a) != losses(c)


@pytest.mark.slow
def test_stop_resume_equals_straight_run(tmp_path, tiny_dataset):
    """N steps, stop, resume, N steps == 2N straight: exact, with dropout and prefetch on."""
    common = {"train.max_steps": 16, "model.dropout": 0.1, "train.eval_interval": 4,
              "train.ckpt_interval": 100, "data.prefetch": True}
    straight = trained(tmp_path / "straight", tiny_dataset, **common)

    run_dir = tmp_path / "split"
    first = stopped_at(run_dir, tiny_dataset, 8, **common)
    assert first[-1].event == "run_finished" and first[-1].reason == "stopped" and first[-1].step == 8
    both = trained(run_dir, resume=True)
    assert losses(both) == losses(straight)
    val = lambda evs: {(e.step, e.val_loss) for e in evs if e.event == "eval"}
    assert val(both) == val(straight)


@pytest.mark.slow
def test_control_pause_save_and_stop_from_another_thread(tmp_path, tiny_dataset):
    control = Control()
    seen, paused_at_save = [], []

    def watch(e):
        seen.append(e)
        if e.event == "step" and e.step == 3:
            control.pause()
            threading.Timer(0.3, control.save_now).start()
            threading.Timer(5.0, control.resume).start()  # a trainer that only saves after a resume gets one
        if e.event == "checkpoint" and e.step == 3:  # then resume and stop
            paused_at_save.append(control.paused)
            threading.Timer(0.1, lambda: (control.resume(), threading.Timer(0.1, control.stop).start())).start()

    run_dir = tmp_path / "run"
    events = trained(run_dir, tiny_dataset, control=control, on_event=watch,
                     **{"train.max_steps": 10**6, "train.ckpt_interval": 10**6})
    ckpt_steps = [e.step for e in events if e.event == "checkpoint"]
    assert ckpt_steps[0] == 3 and paused_at_save == [True]  # save-now saves at once, while paused
    assert events[-1].event == "run_finished" and events[-1].reason == "stopped"
    assert ckpt_steps[-1] == events[-1].step  # stop saves at the step it stops at
    latest = CheckpointDir(run_dir / "checkpoints").latest()
    assert latest is not None and latest.name == f"step_{events[-1].step:06d}.pt"


@pytest.mark.slow
def test_keep_last_k_plus_best(tmp_path, make_dataset):
    data = make_dataset("gpt2-tui")
    run_dir = tmp_path / "run"
    events = trained(run_dir, data, **{"train.max_steps": 12, "train.ckpt_interval": 2,
                                       "train.keep_last": 2, "train.eval_interval": 2})
    names = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    best = [e for e in events if e.event == "checkpoint" and e.best][-1]
    assert "step_000010.pt" in names and "step_000012.pt" in names and "best.pt" in names
    assert len([n for n in names if n.startswith("step_")]) == 2
    state = torch.load(run_dir / "checkpoints" / "best.pt", weights_only=True)
    assert state["step"] == best.step and state["val_loss"] == pytest.approx(best.val_loss)


@pytest.mark.slow
def test_checkpoint_holds_everything_a_resume_needs(tmp_path, tiny_dataset):
    run_dir = tmp_path / "run"
    train(run_dir, tiny_dataset, **{"train.max_steps": 4, "train.ckpt_interval": 4})
    state = torch.load(run_dir / "checkpoints" / "step_000004.pt", weights_only=True)
    assert {"model", "optimizer", "scaler", "step", "best_val_loss", "config", "rng", "data"} <= set(state)
    assert set(state["rng"]) == {"python", "numpy", "torch", "cuda"}
    assert state["step"] == 4 and state["config"]["model"]["vocab_size"] == 64
    n_tensors = len(state["model"]) - 1  # lm_head.weight is wte.weight
    assert len(state["optimizer"]["state"]) == n_tensors  # AdamW moments for every parameter
    assert all("exp_avg_sq" in s for s in state["optimizer"]["state"].values())


def test_gradient_accumulation_matches_one_big_batch(tmp_path, tiny_dataset):
    """B=4 x accum 2 and B=8 x accum 1 see different batches, so compare the math directly."""
    from engine.train.model import GPT

    cfg = resolve("micro", None, {"model.vocab_size": 64}).model
    torch.manual_seed(0)
    a = GPT(cfg)
    b = GPT(cfg)
    b.load_state_dict(a.state_dict())
    x = torch.randint(0, 64, (8, 32))
    y = torch.roll(x, -1, 1)
    a(x, y)[1].backward()
    for xs, ys in ((x[:4], y[:4]), (x[4:], y[4:])):
        (b(xs, ys)[1] / 2).backward()
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_paths_train_on_cpu(tmp_path, tiny_dataset, precision):
    """bf16 autocast (no scaler) and fp16 with its GradScaler, through the real loop;
    clipping off exercises the plain pre-clip norm."""
    ref = trained(tmp_path / "fp32", tiny_dataset, **{"train.max_steps": 3, "optim.grad_clip": 0.0})
    got = trained(tmp_path / precision, tiny_dataset, **{"train.max_steps": 3, "optim.grad_clip": 0.0,
                                                       "speed.precision": precision})
    ref_steps = [e for e in ref if e.event == "step"]
    got_steps = [e for e in got if e.event == "step"]
    assert got[0].precision == precision
    assert got_steps[0].loss == pytest.approx(ref_steps[0].loss, rel=0.02)
    assert got_steps[0].grad_norm == pytest.approx(ref_steps[0].grad_norm, rel=0.1)
    if precision == "fp16":
        state = torch.load(tmp_path / precision / "checkpoints" / "step_000003.pt", weights_only=True)
        assert state["scaler"]["scale"] > 0


@pytest.mark.slow
def test_queue_sink_gets_what_the_jsonl_gets(tmp_path, tiny_dataset):
    from engine.events import QueueSink

    sink = QueueSink()
    events = trained(tmp_path / "run", tiny_dataset, sinks=[sink], **{"train.max_steps": 3})
    queued = []
    while not sink.queue.empty():
        queued.append(sink.queue.get_nowait())
    assert [e.model_dump() for e in queued] == [e.model_dump() for e in events]


def test_on_cpu_the_batch_is_built_inline_and_the_estimate_says_so(tmp_path, tiny_dataset):
    """prefetch=True (the default) starts no thread when the host is the device: on 2 cores the
    thread took a core from the math (docs/benchmarks.md); the estimator counts one batch, not two."""
    from engine.train import memory

    config = resolve("micro", None, {"data.path": str(tiny_dataset), "speed.device": "cpu"})
    assert config.data.prefetch and config.data.pin_memory
    trainer = start(config, tmp_path / "inline").segment
    trainer.setup()  # what run() does before step 1
    try:
        assert trainer.parts.loader.prefetch is False and trainer.parts.loader.pin is False
        assert not [t for t in threading.enumerate() if t.name == "batch-prefetch"]
    finally:
        trainer.parts.loader.close()
    off = config.model_copy(update={"data": config.data.model_copy(update={"prefetch": False})})
    assert memory.estimate(config).peak_bytes == memory.estimate(off).peak_bytes


@pytest.mark.slow  # trains a step, twice
def test_the_clip_folds_into_fused_adamw_with_no_pass_of_its_own(tmp_path, tiny_dataset, monkeypatch):
    """Issue 45 item 9: the clip scaled every gradient in a pass of its own before fused AdamW read
    them again (~1.5 GB a step at gpt2). Folded, fused AdamW divides them by its grad_scale as it
    reads them: the same step (clip_grad_norm_'s factor), and no multiply over the gradients."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from engine.run.preflight import open_data
    from engine.train import build
    from engine.train.trainer import Trainer

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            self.seen.append(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    def stepped(name: str, fold: bool) -> tuple[dict[str, torch.Tensor], float, list[str]]:
        over = {"data.path": str(tiny_dataset), "speed.device": "cpu", "optim.fused": True, "optim.grad_clip": 0.01,
                "data.prefetch": False}  # fmt: skip
        config, ds = open_data(resolve("micro", overrides=over))
        trainer = Trainer(config, tmp_path / name, ds)
        trainer.setup()
        with monkeypatch.context() as m:
            if not fold:
                m.setattr(build, "folds_clip", lambda *a: False)
            with Ops() as ops:
                _, norm = trainer.train_step(1e-3)
        trainer.parts.loader.close()
        opt = trainer.parts.optimizer  # Adam's step hardly moves with the gradients' scale; its moments do
        moments = {f"{n} exp_avg": opt.state[q]["exp_avg"].clone() for n, q in trainer.parts.model.named_parameters()}
        return {n: q.detach().clone() for n, q in trainer.parts.model.named_parameters()} | moments, float(norm), ops.seen

    folded, norm, ops = stepped("folded", True)
    apart, norm_apart, ops_apart = stepped("apart", False)
    assert norm == norm_apart and norm > 0.01  # the pre-clip norm, over the clip: the clip acts
    assert "aten._foreach_mul_" in ops_apart and "aten._foreach_mul_" not in ops, sorted(set(ops))
    for n, w in apart.items():
        torch.testing.assert_close(folded[n], w, rtol=1e-5, atol=1e-7, msg=n)
