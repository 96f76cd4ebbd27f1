"""A logged step makes the device wait for nothing: its numbers (loss, grad norm, the guard's
counters) travel to the host behind the work and are read when they arrive, usually a step
later; the loop syncs only at evals, checkpoints and the last step. Shown on CPU with a
stand-in for the CUDA event that is done only once the next step has been recorded."""

from __future__ import annotations

import pytest
import torch

from engine.config import resolve
from engine.events import CallbackSink
from engine.run.owner import start
from engine.train import readings, trainer

STEPS = 12


class LateEvent(readings.HostEvent):
    """Done only after another event was recorded (a copy still in flight until then)."""

    recorded: list[LateEvent] = []

    def record(self) -> None:
        super().record()
        LateEvent.recorded.append(self)

    def query(self) -> bool:
        return LateEvent.recorded[-1] is not self


@pytest.mark.slow
def test_log_steps_read_their_numbers_a_step_later_without_a_sync(tmp_path, tiny_dataset, monkeypatch):
    syncs: list[int] = []
    reads: list[int] = []
    monkeypatch.setattr(readings, "event_for", lambda device: LateEvent())
    real_sync, real_read = trainer.Trainer._sync, trainer.guard.StepGuard.read

    def sync(self):
        syncs.append(self.step)
        real_sync(self)

    def read(self):
        reads.append(1)
        return real_read(self)

    monkeypatch.setattr(trainer.Trainer, "_sync", sync)
    monkeypatch.setattr(trainer.guard.StepGuard, "read", read)
    steps = []
    config = resolve("micro", None, {"data.path": str(tiny_dataset), "speed.device": "cpu", "train.max_steps": STEPS,
                                     "train.log_interval": 1, "train.eval_interval": 6, "train.ckpt_interval": 6,
                                     "train.sample_tokens": 0})  # fmt: skip
    run = start(config, tmp_path / "run", sinks=[CallbackSink(lambda e: e.event == "step" and steps.append(e))])
    assert run.run() == "completed"
    assert syncs == [6, 12]  # the eval and checkpoint steps only: never a plain logged step
    assert reads == []  # no per-step host read of the guard either
    assert [s.step for s in steps] == list(range(1, STEPS + 1))  # every step reported, in order
    assert all(s.step_time_s > 0 and s.loss == pytest.approx(s.loss) for s in steps)
    assert all(torch.isfinite(torch.tensor(s.loss)) for s in steps)


def _micro(tiny_dataset, **flags):
    return resolve("micro", None, {"data.path": str(tiny_dataset), "speed.device": "cpu", "train.sample_tokens": 0,
                                   "train.log_interval": 1, **flags})  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("how", ["stop", "toggle"])
def test_a_stop_or_toggle_reports_every_step_and_counts_its_time(tmp_path, tiny_dataset, monkeypatch, how):
    """The steps still in flight at a stop or a toggle (their copies not yet arrived: the
    late-event stand-in) get their Step events before the segment ends, and their time is in
    train_time_s, which the checkpoint taken there carries (time-to-loss sums it)."""
    from engine.run import requests, toggle
    from engine.train import checkpoint as ckpt

    monkeypatch.setattr(readings, "event_for", lambda device: LateEvent())
    control, events = requests.Control(), []

    def ask(e):
        events.append(e)
        if e.event == "step" and e.step == 5:
            control.stop() if how == "stop" else toggle.request(tmp_path / "run", {"data.prefetch": False})
        if how == "toggle" and e.event == "segment" and e.reason == "toggle":
            control.stop()

    config = _micro(tiny_dataset, **{"train.max_steps": 40, "train.eval_interval": 100, "train.ckpt_interval": 100})
    run = start(config, tmp_path / "run", sinks=[CallbackSink(ask)], control=control)
    assert run.run() == "stopped"
    stop = events[-1].step
    assert events[-1].event == "run_finished" and stop > 5
    steps = [e for e in events if e.event == "step"]
    assert [s.step for s in steps] == list(range(1, stop + 1))  # the steps in flight at the boundary too
    if how == "toggle":  # the first segment's steps all reported before the next one opened
        opened = next(i for i, e in enumerate(events) if e.event == "segment" and e.reason == "toggle")
        assert max(e.step for e in events[:opened] if e.event == "step") == events[opened].step
    saved = ckpt.load(ckpt.find(tmp_path / "run"))
    assert saved["step"] == stop
    assert saved["train_time_s"] == pytest.approx(sum(s.step_time_s for s in steps), rel=1e-6)


class SteadyEvent(LateEvent):
    """The late-event stand-in on a steady device: each event recorded is stamped STEP seconds
    after the one before it (the device's clock, virtual: the same whatever the host's load)."""

    STEP = 10.0

    def record(self) -> None:
        super().record()
        self.t = len(LateEvent.recorded) * self.STEP


@pytest.mark.slow
def test_an_eval_or_checkpoint_step_is_timed_between_end_events(tmp_path, tiny_dataset, monkeypatch):
    """A step the host syncs at (eval, checkpoint, the last) is timed on the device's clock from
    the previous step's end, as every other step: not from when the host enqueued that step, which
    counted what the device still had to do twice (a sync step read up to 2x on a GPU)."""
    monkeypatch.setattr(readings, "event_for", lambda device: SteadyEvent())
    events: list = []
    config = _micro(tiny_dataset, **{"train.max_steps": 8, "train.eval_interval": 4, "train.ckpt_interval": 4})
    run = start(config, tmp_path / "run", sinks=[CallbackSink(events.append)])
    assert run.run() == "completed"
    steps = {e.step: e.step_time_s for e in events if e.event == "step"}
    assert steps == {s: pytest.approx(SteadyEvent.STEP) for s in range(1, 9)}  # the sync steps 4 and 8 too
    evals = [(e.step, e.train_time_s) for e in events if e.event == "eval"]
    assert evals == [(4, pytest.approx(4 * SteadyEvent.STEP)), (8, pytest.approx(8 * SteadyEvent.STEP))]
