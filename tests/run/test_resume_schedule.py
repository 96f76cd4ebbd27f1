"""A resume keeps the lr schedule (issue: a larger --max-steps re-stretched the cosine, moving
the lr of steps already planned): the decay ends where the run's plan put it, later steps train
at min_lr, the resume says so in one line; a finished run is not resumed into an empty segment."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import rundir
from engine.config import resolve
from engine.events import CallbackSink
from engine.run.requests import Control
from engine.run.owner import start
from gpt2_tui import main

FLAGS = {"speed.device": "cpu", "speed.precision": "fp32", "train.max_steps": 10, "optim.warmup_steps": 2,
         "train.eval_interval": 100, "train.ckpt_interval": 100, "train.sample_tokens": 0}  # fmt: skip


def _lrs(run_dir: Path) -> dict[int, float]:
    from harness import run_events

    return {e.step: e.lr for e in run_events(run_dir) if e.event == "step"}


@pytest.mark.slow
def test_a_resume_with_more_steps_keeps_the_planned_lr(tmp_path: Path, tiny_dataset: Path, capsys) -> None:
    flags = FLAGS | {"data.path": str(tiny_dataset)}
    plain = tmp_path / "plain"
    start(resolve("micro", None, flags), plain).run()  # the plan, uninterrupted: 10 steps
    planned = _lrs(plain)

    run_dir, control = tmp_path / "run", Control()

    def stop_at_6(e):
        if e.event == "step" and e.step == 6:
            control.stop()

    assert start(resolve("micro", None, flags), run_dir, sinks=[CallbackSink(stop_at_6)], control=control).run() == "stopped"
    capsys.readouterr()
    assert main(["train", "--resume", str(run_dir), "--max-steps", "14"]) == 0
    said = capsys.readouterr()
    lrs = _lrs(run_dir)
    assert sorted(lrs) == list(range(1, 15))
    assert [lrs[s] for s in range(1, 11)] == [planned[s] for s in range(1, 11)]  # before and after the resume
    assert [lrs[s] for s in range(11, 15)] == [3e-4] * 4  # past the decay end: min_lr
    line = "the schedule keeps its decay to step 10; steps after it train at min_lr 0.0003; pass --decay-steps 14 to re-plan"
    assert [x for x in (said.out + said.err).splitlines() if "schedule keeps" in x] == [f"warning: {line}"]
    assert rundir.load_config(run_dir).optim.decay_steps == 10  # a later resume keeps it too


@pytest.mark.slow
def test_decay_steps_at_resume_re_plans(tmp_path: Path, tiny_dataset: Path) -> None:
    run_dir = tmp_path / "run"
    start(resolve("micro", None, FLAGS | {"data.path": str(tiny_dataset), "train.max_steps": 4}), run_dir).run()
    assert main(["train", "--resume", str(run_dir), "--max-steps", "8", "--decay-steps", "8"]) == 0
    assert _lrs(run_dir)[8] > 3e-4  # the cosine now ends at 8: step 8 trains just above min_lr


@pytest.mark.slow
def test_resuming_a_finished_run_says_how_to_train_further(tmp_path: Path, tiny_dataset: Path, capsys, file_tree) -> None:
    from harness import cli_fails

    run_dir = tmp_path / "run"
    start(resolve("micro", None, FLAGS | {"data.path": str(tiny_dataset), "train.max_steps": 3}), run_dir).run()
    before = file_tree(run_dir)
    cli_fails(capsys, ["train", "--resume", str(run_dir)], "already trained to step 3", "--max-steps 6")
    assert file_tree(run_dir) == before  # no empty segment, nothing written
