"""One way to steer a run (issue 19 item 4, issue 21 items 3 and 19): requests with an id and
a time, taken at the step boundary from the run directory's mailbox and acknowledged in the
events; two toggles in one step both apply; a request left by a dead run is discarded at
resume with a line; a mailbox that is no small regular file is refused once and the run goes on."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from engine.run import requests as control, toggle
from engine.run.requests import Request
from harness import QUIET, run_events, train

def _train(run_dir: Path, data: Path, steps: int, at_step=None, resume: bool = False) -> list:
    hook = lambda e: at_step is not None and e.event == "step" and at_step(e.step)  # noqa: E731
    flags = {"train.max_steps": steps} if resume else QUIET | {"train.max_steps": steps}
    assert train(run_dir, data, resume=resume, on_event=hook, **flags) == "completed"
    return run_events(run_dir)


@pytest.mark.slow
def test_two_toggles_in_one_step_both_apply_and_are_acknowledged(tmp_path, tiny_dataset):
    run_dir, asked = tmp_path / "run", []

    def ask(step):
        if step == 3:  # both land before the next step boundary
            asked.append(toggle.request(run_dir, {"data.prefetch": False}))
            asked.append(toggle.request(run_dir, {"optim.fused": False}))

    events = _train(run_dir, tiny_dataset, 6, ask)
    acks = [e for e in events if e.event == "request"]
    assert [(a.id, a.kind, a.status, a.step) for a in acks] == [(r.id, "toggle", "applied", 3) for r in asked]
    segments = [e for e in events if e.event == "segment"]
    assert [(s.step, s.reason) for s in segments] == [(0, "start"), (3, "toggle")]
    assert set(segments[1].changed) == {"data.prefetch", "optim.fused"}
    assert not (run_dir / control.MAILBOX).exists()


@pytest.mark.slow
def test_a_request_left_by_a_dead_run_is_discarded_at_resume(tmp_path, tiny_dataset):
    run_dir = tmp_path / "run"
    _train(run_dir, tiny_dataset, 3)
    left = Request("pause", time=time.time() - 60)  # asked of a writer that is gone
    control.post(run_dir, left)
    events = _train(run_dir, tiny_dataset, 5, resume=True)  # completes: the stale pause is not applied
    assert not [e for e in events if e.event == "paused"]
    (ack,) = [e for e in events if e.event == "request"]
    assert (ack.id, ack.status, ack.step) == (left.id, "dropped", 3) and ack.reason.startswith("stale")
    assert any(e.event == "warning" and f"discarded a pause request ({left.id})" in e.message for e in events)


@pytest.mark.slow
def test_a_fifo_mailbox_is_refused_once_and_the_run_goes_on(tmp_path, tiny_dataset):
    run_dir = tmp_path / "run"

    def plant(step):
        if step == 2:
            os.mkfifo(run_dir / control.MAILBOX)

    events = _train(run_dir, tiny_dataset, 6, plant)
    warnings = [e.message for e in events if e.event == "warning"]
    assert len(warnings) == 1 and "not a regular file" in warnings[0]
    assert [e.step for e in events if e.event == "step"][-1] == 6 and events[-1].event == "run_finished"


@pytest.mark.slow
def test_save_and_bad_lines_are_acknowledged_and_deep_nesting_is_not_parsed(tmp_path, tiny_dataset):
    run_dir, asked = tmp_path / "run", []

    def ask(step):
        if step == 2:
            asked.append(Request("save"))
            control.post(run_dir, asked[0])
            with open(run_dir / control.MAILBOX, "a") as f:
                f.write("[" * 10_000 + "\n" + '{"id": "x1", "time": 1, "kind": "launch"}\n')

    events = _train(run_dir, tiny_dataset, 4, ask)
    acks = [(e.id, e.kind, e.status) for e in events if e.event == "request"]
    assert acks == [(asked[0].id, "save", "applied"), ("?", "?", "dropped"), ("x1", "?", "dropped")]
    assert [e.step for e in events if e.event == "checkpoint"][0] == 2
    assert control.parse("[" * 100_000).problem == "nested too deeply to be a request"
