"""The step guard decides on the device (issue 11) and catches finite divergence (issue 12):
no host read on a non-logging step, a NaN step still skipped, a loss spike stops the run
before a blown-up state is saved, `--resume --from` continues from any kept checkpoint, and
a run whose directory vanishes stops. Real engine, micro preset, CPU."""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from engine.train import checkpoint as ckpt
from engine.train import guard
from engine import rundir
from engine.events import CallbackSink, read_events
from engine.train.model import GPT
from gpt2_tui import main
from harness import MICRO, cli_fails, open_run

READS = ("item", "tolist", "__bool__", "__float__", "__int__", "numpy")  # a device tensor reaching the host


def count_reads(monkeypatch, of: Callable[[torch.Tensor], bool] = lambda t: True) -> Counter:
    """Counts every Python-level read to the host of a tensor's value (of the tensors `of` picks)."""
    count: Counter = Counter()
    for name in READS:
        original = getattr(torch.Tensor, name)

        def counted(self, *a, _original=original, _name=name, **kw):
            if of(self):
                count[_name] += 1
            return _original(self, *a, **kw)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return count


@pytest.fixture
def host_reads(monkeypatch) -> Counter:
    """Counts every Python-level read of a tensor's value to the host."""
    return count_reads(monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["adamw", "muon"])  # Muon's skip is the device's too (build.step_unless)
def test_a_non_logging_step_reads_nothing_from_the_device(tmp_path, tiny_dataset, host_reads, optimizer):
    flags = {"train.max_steps": 12, "train.log_interval": 4, "train.eval_interval": 100, "train.ckpt_interval": 100,
             "optim.optimizer": optimizer}  # fmt: skip
    t = open_run(tmp_path / "run", tiny_dataset, **flags)
    per_step: dict[int, int] = {}
    segment = t.segment
    original = segment.train_step

    def train_step(lr):  # the reads from one step's start to the next one's start
        start = sum(host_reads.values())
        out = original(lr)
        per_step[segment.step + 1] = start
        return out

    segment.train_step = train_step
    assert t.run() == "completed"
    total_at = [per_step[s] for s in sorted(per_step)]
    reads = {s: b - a for s, a, b in zip(sorted(per_step), total_at, total_at[1:])}  # step s -> reads until s+1
    logging = {4, 8}
    assert all(reads[s] > 0 for s in logging)  # the report reads loss and norm: the counter sees reads
    assert {s: n for s, n in reads.items() if s not in logging} == {s: 0 for s in reads if s not in logging}


def _scale_loss(monkeypatch, factor: Callable[[int], float]) -> None:
    """Multiply the training loss of the n-th training forward (1-based) by factor(n)."""
    original = GPT.forward
    calls = [0]

    def forward(self, idx, targets=None, **kw):
        logits, loss = original(self, idx, targets, **kw)
        if self.training and loss is not None:
            calls[0] += 1
            loss = loss * factor(calls[0])
        return logits, loss

    monkeypatch.setattr(GPT, "forward", forward)


@pytest.mark.slow
def test_a_nan_step_between_reports_is_skipped_on_the_device(tmp_path, tiny_dataset, monkeypatch):
    _scale_loss(monkeypatch, lambda n: float("nan") if n in (2, 3) else 1.0)
    seen = []
    t = open_run(tmp_path / "run", tiny_dataset, sinks=[CallbackSink(seen.append)],
                 **{"train.max_steps": 8, "train.log_interval": 4, "train.max_bad_steps": 3,
                    "train.eval_interval": 100, "train.ckpt_interval": 100})  # fmt: skip
    weights: dict[int, list[torch.Tensor]] = {}
    step = t.segment.train_step

    def train_step(lr):
        out = step(lr)
        weights[t.segment.step + 1] = [p.detach().clone() for p in t.segment.parts.model.parameters()]
        return out

    t.segment.train_step = train_step
    assert t.run() == "completed"
    assert t.segment.parts.optimizer.defaults["fused"]  # the default on CPU: the skip is the kernel's found_inf
    assert all(torch.equal(a, b) for a, b in zip(weights[1], weights[3]))  # steps 2-3 never reached the weights
    assert not all(torch.equal(a, b) for a, b in zip(weights[3], weights[4]))
    warnings = [e.message for e in seen if e.event == "warning"]
    assert len(warnings) == 1 and warnings[0].startswith("step 4:") and "2 updates since the last report" in warnings[0]


@pytest.mark.slow
@pytest.mark.parametrize("flags", [{"optim.fused": False}, {"optim.optimizer": "muon"},
                                   {"optim.optimizer": "muon", "optim.fused": False}])  # fmt: skip
def test_without_found_inf_a_nan_step_is_skipped_and_its_verdict_never_read(tmp_path, tiny_dataset, monkeypatch,
                                                                            flags):  # fmt: skip
    """Unfused AdamW and Muon read no found_inf: their step is still skipped (Muon's on the device,
    its update zeroed), the verdict never read on the host, except by unfused AdamW on the CPU:
    there the verdict is already a number (no queue to drain), so it reads it once a step rather
    than pay 3x its step for the put-back (its device form: the next test); the steps around the
    bad ones train; a bad first step leaves the state as new (zeros, or none yet)."""
    _scale_loss(monkeypatch, lambda n: float("nan") if n in (1, 3, 4) else 1.0)
    verdicts: list[torch.Tensor] = []
    judge = guard.StepGuard.judge
    monkeypatch.setattr(guard.StepGuard, "judge", lambda self, *a, **kw: verdicts.append(judge(self, *a, **kw))
                        or verdicts[-1])  # fmt: skip
    read = count_reads(monkeypatch, lambda t: any(t is v for v in verdicts))
    t = open_run(tmp_path / "run", tiny_dataset, **{"train.max_steps": 6, "train.log_interval": 3,
                                                    "train.max_bad_steps": 3, "train.eval_interval": 100,
                                                    "train.ckpt_interval": 100}, **flags)  # fmt: skip
    weights: dict[int, list[torch.Tensor]] = {}
    states: dict[int, list[torch.Tensor]] = {}
    step = t.segment.train_step

    def train_step(lr):
        out = step(lr)
        p = t.segment.parts
        weights[t.segment.step + 1] = [q.detach().clone() for q in p.model.parameters()]
        states[t.segment.step + 1] = [v.clone() for s in p.optimizer.state.values() for v in s.values()
                                      if isinstance(v, torch.Tensor)]  # fmt: skip
        return out

    t.segment.train_step = train_step
    assert t.run() == "completed"
    assert not t.segment.parts.optimizer.defaults["fused"]
    host = flags.get("optim.fused") is False  # unfused AdamW on the CPU: one read a step, nothing to wait for
    assert read == Counter(item=6 if host else 0)  # Muon never reads the verdict (the old loop: .item() a step)
    assert (states[1] or host) and all(not v.any() for v in states[1])  # a skipped first step: the state as new
    assert all(torch.equal(a, b) for a, b in zip(weights[2], weights[4]))  # steps 3-4 never reached the weights
    assert not all(torch.equal(a, b) for a, b in zip(weights[4], weights[5]))  # step 5 trained
    assert all(torch.isfinite(w).all() for w in weights[6])


def test_unfused_adamw_skips_on_the_device_without_reading_the_verdict(monkeypatch):
    """Unfused AdamW's device form (build.step_unless on an accelerator; forced here on the CPU):
    a skipped step, first or later, puts back weights and moments (a first one's as new: zeros),
    and the verdict is never read on the host."""
    from engine.train import build

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, fused=False)
    x = torch.randn(4, 8)
    verdicts: list[torch.Tensor] = []
    read = count_reads(monkeypatch, lambda t: any(t is v for v in verdicts))

    def step(bad: bool) -> None:
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        verdicts.append(torch.ones(()) if bad else torch.zeros(()))
        build.step_unless(opt, verdicts[-1], on_device=True)

    weights = [p.detach().clone() for p in model.parameters()]
    step(bad=True)
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters()))
    assert all(not v.any() for s in opt.state.values() for k, v in s.items() if k != "step")
    step(bad=False)
    trained = [p.detach().clone() for p in model.parameters()]
    moments = [v.clone() for s in opt.state.values() for k, v in s.items() if k != "step"]
    assert not all(torch.equal(a, b) for a, b in zip(weights, trained)) and any(v.any() for v in moments)
    step(bad=True)
    assert all(torch.equal(a, b) for a, b in zip(trained, model.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(moments, [v for s in opt.state.values() for k, v in s.items()
                                                           if k != "step"]))  # fmt: skip
    assert read == Counter()


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A healthy 30-step micro run with checkpoints at 10, 20, 30."""
    from harness import random_tokens, write_gpt2tui

    root = tmp_path_factory.mktemp("trained")
    data = write_gpt2tui(root / "data", random_tokens(20_000, 64), random_tokens(4_000, 64, seed=1), 64)
    run = root / "run"
    assert main(["train", *MICRO, "--data", str(data), "--out", str(run), "--max-steps", "30",
                 "--ckpt-interval", "10", "--eval-interval", "10", "--log-interval", "5"]) == 0  # fmt: skip
    return run


def _copy(run: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(run, dst)
    return dst


@pytest.mark.slow
def test_a_finite_blow_up_stops_before_the_bad_state_is_saved(trained, tmp_path, capsys):
    run = _copy(trained, tmp_path)
    before = {p.name: p.stat().st_mtime_ns for p in (run / "checkpoints").glob("*.pt")}
    err = cli_fails(capsys, ["train", "--resume", str(run), "--lr", "1e6", "--min-lr", "0", "--max-steps", "60"],
                    "no checkpoint was written", "the last good one is", f"--resume {run} --lr")  # fmt: skip
    assert {p.name: p.stat().st_mtime_ns for p in (run / "checkpoints").glob("*.pt")} == before
    assert ckpt.CheckpointDir(run / "checkpoints").latest().name == "step_000030.pt"
    events, _ = read_events(run / rundir.EVENTS)
    assert events[-1].event == "run_failed"
    assert any("updates since the last report were skipped" in e.message for e in events if e.event == "warning")
    assert "Traceback" not in err


@pytest.mark.slow
def test_resume_from_an_earlier_checkpoint_sets_the_later_ones_aside(trained, tmp_path, capsys):
    run = _copy(trained, tmp_path)
    assert main(["train", "--resume", str(run), "--from", "10", "--max-steps", "20"]) == 0
    cks = ckpt.CheckpointDir(run / "checkpoints")
    assert [s for s, _ in cks.step_files()] == [10, 20] and cks.latest().name == "step_000020.pt"
    (aside,) = [p for p in cks.path.iterdir() if p.is_dir()]
    assert sorted(p.name for p in aside.iterdir()) == ["step_000020.pt", "step_000030.pt"]  # nothing lost
    assert ckpt.load(cks.latest())["step"] == 20
    assert main(["train", "--resume", str(run), "--from", "best", "--max-steps", "25"]) == 0
    assert ckpt.load(cks.latest())["step"] == 25
    capsys.readouterr()
    cli_fails(capsys, ["train", "--resume", str(run), "--from", "7"], "--from 7: no such checkpoint", "kept: ")
    cli_fails(capsys, ["train", *MICRO, "--from", "best"], "add --resume")


@pytest.mark.slow
def test_a_run_whose_directory_vanishes_stops_in_one_line(tmp_path, tiny_dataset):
    def vanish(e):
        if e.event == "step" and e.step == 3:
            shutil.rmtree(t.run_dir)

    t = open_run(tmp_path / "run", tiny_dataset, sinks=[CallbackSink(vanish)], **{"train.max_steps": 10})
    with pytest.raises(Exception, match="vanished at step 4") as err:
        t.run()
    assert "\n" not in str(err.value)


def test_healthy_is_the_spike_rule() -> None:
    assert guard.healthy(3.0, 2.9) and guard.healthy(3.0, None)
    assert not guard.healthy(float("nan"), None) and not guard.healthy(6.5e11, 4.2)
    assert not guard.healthy(9.0, 2.0) and guard.healthy(5.9, 2.0)  # 2.0 + 4 nats


@pytest.mark.slow
def test_a_finite_loss_spike_is_skipped_and_stops_the_run_in_a_row(tmp_path, tiny_dataset, monkeypatch):
    """Loss x1000 (finite) from the 6th step on: no NaN anywhere, still caught as divergence;
    the skipped updates left the weights healthy, so they are saved before the stop."""
    _scale_loss(monkeypatch, lambda n: 1000.0 if n >= 6 else 1.0)
    flags = {"train.max_steps": 30, "train.max_bad_steps": 3, "train.eval_interval": 100, "train.ckpt_interval": 100}
    t = open_run(tmp_path / "run", tiny_dataset, **flags)
    with pytest.raises(guard.Diverged, match="the loss spiked far above its recent level for 3 steps"):
        t.run()
    assert ckpt.load(t.segment.ckpts.latest())["step"] == 8  # steps 6-8 skipped: the weights of step 5, saved at the stop


def test_a_failed_save_says_what_is_there_now_not_what_was_written(tmp_path):
    """Issue 46, seen: after another user moved the checkpoints away, a failed save said "no
    checkpoint has been written yet" of a run that had written several."""
    import errno

    err = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "checkpoints" / "step_000030.pt"))
    said = guard.save_failed(err, 30, tmp_path / "checkpoints", "warn", tmp_path, None).message
    assert "has been written yet" not in said and f"no earlier checkpoint is in {tmp_path / 'checkpoints'}" in said
    kept = tmp_path / "checkpoints" / "step_000020.pt"
    assert f"the previous checkpoints are intact (newest: {kept})" in guard.save_failed(
        err, 30, tmp_path / "checkpoints", "warn", tmp_path, kept).message  # fmt: skip


@pytest.mark.slow  # resumes a trained run
@pytest.mark.parametrize("where", ["run", "checkpoints"])
def test_a_resume_says_when_others_can_replace_what_it_loads(trained_runs, tmp_path, capsys, where):
    """Issue 46, seen: a 0777 run directory resumed without a word. World-writable (or another
    user's) run directory or checkpoints/: the resume says so as it starts and trains on; the
    checkpoints are still read as data only (the one reading)."""
    run = trained_runs.copy("micro-2", tmp_path / "run")
    target = run if where == "run" else run / rundir.CHECKPOINTS
    target.chmod(0o777)
    assert rundir.open_to_others(run) is not None
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--max-steps", "3"]) == 0
    out = capsys.readouterr().out
    assert "is writable by others (mode 777)" in out and f"chmod go-w {target}" in out, out
    target.chmod(0o755)
    assert rundir.open_to_others(run) is None  # group and others may read: nothing to say
