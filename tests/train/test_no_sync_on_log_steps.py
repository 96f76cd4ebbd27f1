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
