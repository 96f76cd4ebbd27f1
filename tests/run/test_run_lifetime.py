"""What a run holds over its life: each new run in a process that compiled before starts from
no compiled graphs (else an app's later runs of other shapes reach Dynamo's recompile limit
and run eager unnoticed), and a live toggle's hand-over leaves one model and one dataset
alive, however many toggles came before."""

from __future__ import annotations

import gc
import time
import weakref

import pytest

from engine.config import resolve
from engine.events import CallbackSink
from engine.run import toggle
from engine.run.owner import start
from engine.train import compiling
from engine.dataset import Dataset
from engine.train.model import GPT


@pytest.mark.slow
def test_a_new_compiled_run_forgets_the_graphs_of_the_runs_before(tmp_path, tiny_dataset, monkeypatch):
    resets = []
    monkeypatch.setattr(compiling, "reset", lambda: resets.append(1))
    flags = {"data.path": str(tiny_dataset), "speed.device": "cpu", "speed.compile": True}
    run = start(resolve("micro", None, flags), tmp_path / "compiled")
    run.release()
    assert resets == [1]
    run = start(resolve("micro", None, {**flags, "speed.compile": False}), tmp_path / "eager")
    run.release()
    assert resets == [1]  # nothing compiled to forget: no reset


def _track(monkeypatch, kind: type) -> weakref.WeakSet:
    """Every instance of `kind` made from now on, held weakly."""
    made: weakref.WeakSet = weakref.WeakSet()
    init = kind.__init__

    def tracked(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.add(self)

    monkeypatch.setattr(kind, "__init__", tracked)
    return made


@pytest.mark.slow
def test_toggles_hand_over_one_model_and_one_dataset(tmp_path, tiny_dataset, monkeypatch):
    """Ten toggles of a preloaded run: at each segment's start one GPT and one dataset are
    alive (the first segment's stayed alive in the caller's frame, with its dataset, and each
    hand-over opened and preloaded the dataset again)."""
    run_dir = tmp_path / "run"
    models, datasets = _track(monkeypatch, GPT), _track(monkeypatch, Dataset)
    counts: list[tuple[int, int]] = []
    fused = [True]

    def on_event(e):
        if e.event == "segment":
            gc.collect()
            counts.append((len(models), len(datasets)))
        if e.event == "step" and e.step % 2 == 0 and e.step < 22:
            fused[0] = not fused[0]
            toggle.request(run_dir, {"optim.fused": fused[0]})

    config = resolve("micro", None, {"data.path": str(tiny_dataset), "speed.device": "cpu", "data.preload": True,
                                     "train.max_steps": 24, "train.eval_interval": 100, "train.ckpt_interval": 100,
                                     "train.sample_tokens": 0})  # fmt: skip
    run = start(config, run_dir, sinks=[CallbackSink(on_event)])
    assert run.run() == "completed"
    assert len(counts) == 11  # the start and ten toggles
    assert set(counts) == {(1, 1)}, counts


@pytest.mark.slow  # trains
def test_max_time_saves_and_stops_at_the_first_boundary_past_it_and_resume_goes_on(tmp_path, tiny_dataset, capsys):
    """Issue 47: `train --max-time SECONDS`, a speedrun's wall-clock budget: the run stops at the first
    step boundary past it with a checkpoint of that step, says so, and `--resume` trains on from it."""
    from gpt2_tui import main
    from harness import MICRO, run_events

    run = tmp_path / "run"
    argv = ["train", *MICRO, "--data", str(tiny_dataset), "--out", str(run), "--max-steps", "100000", "--max-time", "2"]
    began = time.monotonic()
    assert main(argv) == 0
    assert time.monotonic() - began < 60
    events = run_events(run)
    (end,) = [e for e in events if e.event == "run_finished"]
    assert end.reason == "stopped" and 0 < end.step < 100_000
    assert any(e.event == "warning" and "--max-time 2 s reached" in e.message for e in events)
    assert (run / "checkpoints" / f"step_{end.step:06d}.pt").is_file()
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--max-steps", str(end.step + 2)]) == 0
    assert [e.step for e in run_events(run) if e.event == "run_finished"][-1] == end.step + 2
