"""optim.optimizer = muon (Muon for the blocks' matrices, AdamW for the rest) and optim.schedule =
wsd (warmup, stable, linear decay over the last decay_fraction): a Muon run resumes bit-exact like
an AdamW one, its guard still skips bad steps, and a WSD run extended at resume keeps every
earlier step's lr, moving only a decay that had not begun."""

from __future__ import annotations

import pytest
import torch

from engine.config import resolve
from engine.errors import UserError
from engine.train.trainer import lr_at
from gpt2_tui import main
from harness import CPU, cli_fails, losses, run_events, stopped_at, train, trained



@pytest.mark.slow
def test_muon_stop_resume_equals_straight_run(tmp_path, tiny_dataset):
    """As tests/train/test_trainer.py's AdamW case: N steps, stop, resume, N steps == 2N straight."""
    common = {"optim.optimizer": "muon", "train.max_steps": 16, "model.dropout": 0.1, "train.eval_interval": 4,
              "train.ckpt_interval": 100, "data.prefetch": True}
    straight = trained(tmp_path / "straight", tiny_dataset, **common)
    adamw = trained(tmp_path / "adamw", tiny_dataset, **(common | {"optim.optimizer": "adamw"}))
    assert losses(straight)[3:] != losses(adamw)[3:]  # Muon trained the matrices, not AdamW

    run_dir = tmp_path / "split"
    first = stopped_at(run_dir, tiny_dataset, 8, **common)
    assert first[-1].event == "run_finished" and first[-1].reason == "stopped" and first[-1].step == 8
    state = torch.load(run_dir / "checkpoints" / "step_000008.pt", weights_only=True)
    kinds = {k for s in state["optimizer"]["state"].values() for k in s}
    assert {"momentum_buffer", "exp_avg", "exp_avg_sq"} <= kinds  # both optimizers' state saved
    both = trained(run_dir, resume=True)
    assert losses(both) == losses(straight)
    val = lambda evs: {(e.step, e.val_loss) for e in evs if e.event == "eval"}
    assert val(both) == val(straight)


def test_muon_takes_the_block_matrices_and_adamw_the_rest():
    from engine.train import build
    from engine.train.model import GPT

    cfg = resolve("micro", None, CPU | {"optim.optimizer": "muon", "model.vocab_size": 64})
    model = GPT(cfg.model)
    opt = build.optimizer(model, cfg.optim, torch.device("cpu"))
    names = {id(p): n for n, p in model.named_parameters()}
    muon = {names[id(p)] for g in opt.muon.param_groups for p in g["params"]}
    assert muon and all(".h." in n and n.endswith("weight") and "ln_" not in n for n in muon)
    adamw = {names[id(p)] for g in opt.adamw.param_groups for p in g["params"]}
    assert "transformer.wte.weight" in adamw and not muon & adamw  # the tied lm_head is wte
    build.set_lr(opt, cfg.optim.lr / 2)
    assert opt.muon.param_groups[0]["lr"] == pytest.approx(cfg.optim.muon_lr / 2)


@pytest.mark.slow
def test_a_muon_step_the_guard_skips_is_never_taken(tmp_path, tiny_dataset, monkeypatch):
    """The guard's verdict (a device flag; torch's Muon reads no found_inf) skips the whole
    Muon + AdamW step on the device (build.step_unless): the weights stay the initial ones and
    both optimizers' state stays as new (zero moments, momentum and step counts)."""
    from engine.run.preflight import open_data
    from engine.train import guard
    from engine.train.model import GPT
    from harness import micro_config

    monkeypatch.setattr(guard.StepGuard, "judge", lambda self, loss, norm, scaled, agree: torch.ones((), dtype=torch.bool))
    run_dir, flags = tmp_path / "run", {"optim.optimizer": "muon", "train.max_steps": 3, "train.max_bad_steps": 10}
    train(run_dir, tiny_dataset, **flags)
    state = torch.load(run_dir / "checkpoints" / "step_000003.pt", weights_only=True)
    assert state["optimizer"]["state"] and not any(v.any() for s in state["optimizer"]["state"].values()
                                                   for v in s.values())  # fmt: skip
    config, _ = open_data(micro_config(tiny_dataset, **flags))
    torch.manual_seed(config.train.seed)  # the run's initial weights (engine.train.build.parts)
    initial = GPT(config.model).state_dict()
    assert all(torch.equal(state["model"][k], v) for k, v in initial.items())


def test_fsdp_with_muon_is_refused_in_one_line():
    with pytest.raises(UserError, match="muon with parallel fsdp"):
        resolve("micro", None, CPU | {"optim.optimizer": "muon", "speed.parallel": "fsdp"})


def test_wsd_holds_the_peak_then_decays_linearly_over_the_last_fraction():
    o = resolve("micro", None, {"optim.schedule": "wsd", "optim.lr": 1.0, "optim.min_lr": 0.1,
                                "optim.warmup_steps": 10, "optim.decay_fraction": 0.2}).optim  # fmt: skip
    assert lr_at(9, o, 100) == pytest.approx(1.0)
    assert [lr_at(s, o, 100) for s in (10, 50, 79, 80)] == [1.0] * 4
    assert lr_at(90, o, 100) == pytest.approx(0.55)
    assert lr_at(100, o, 100) == pytest.approx(0.1)


FLAGS = CPU | {"train.max_steps": 10, "optim.warmup_steps": 2, "optim.schedule": "wsd", "optim.decay_fraction": 0.2,
               "train.eval_interval": 100, "train.ckpt_interval": 100, "train.sample_tokens": 0}  # fmt: skip


def _lrs(run_dir):
    events = run_events(run_dir)
    return {e.step: e.lr for e in events if e.event == "step"}


@pytest.mark.slow
def test_a_wsd_run_extended_before_its_decay_keeps_every_earlier_lr(tmp_path, tiny_dataset, capsys):
    planned = {s + 1: lr_at(s, resolve("micro", None, FLAGS).optim, 10) for s in range(10)}
    run_dir = tmp_path / "run"
    stopped_at(run_dir, tiny_dataset, 6, **FLAGS)  # the decay would begin at step 8 of 10
    capsys.readouterr()
    assert main(["train", "--resume", str(run_dir), "--max-steps", "20"]) == 0
    said = capsys.readouterr()
    lrs = _lrs(run_dir)
    assert sorted(lrs) == list(range(1, 21))
    assert [lrs[s] for s in range(1, 7)] == [planned[s] for s in range(1, 7)]  # every earlier step's lr
    peak = resolve("micro", None, FLAGS).optim.lr
    assert [lrs[s] for s in range(7, 18)] == [peak] * 11  # the stable phase runs on to the new decay
    assert peak > lrs[18] > lrs[19] > lrs[20]  # the decay: the last 20% of 20 steps
    notes = [x for x in (said.out + said.err).splitlines() if "wsd decay" in x]
    assert len(notes) == 1 and "had not begun at step 6" in notes[0] and "to min_lr" in notes[0]


@pytest.mark.slow
def test_a_wsd_run_extended_in_its_decay_keeps_the_decay_end(tmp_path, tiny_dataset, capsys):
    planned = {s + 1: lr_at(s, resolve("micro", None, FLAGS).optim, 10) for s in range(10)}
    run_dir = tmp_path / "run"
    stopped_at(run_dir, tiny_dataset, 9, **FLAGS)  # decaying since step 8
    capsys.readouterr()
    assert main(["train", "--resume", str(run_dir), "--max-steps", "12"]) == 0
    said = capsys.readouterr()
    lrs = _lrs(run_dir)
    assert [lrs[s] for s in range(1, 11)] == [planned[s] for s in range(1, 11)]
    assert [lrs[11], lrs[12]] == [resolve("micro", None, FLAGS).optim.min_lr] * 2
    assert any("the wsd decay had begun: the schedule keeps its decay to step 10" in x for x in (said.out + said.err).splitlines())


@pytest.mark.slow
def test_resume_with_another_optimizer_is_one_line(tmp_path, tiny_dataset, capsys):
    run_dir = tmp_path / "run"
    stopped_at(run_dir, tiny_dataset, 3, **FLAGS)
    cli_fails(capsys, ["train", "--resume", str(run_dir), "--optimizer", "muon"], "trains with optimizer adamw")
