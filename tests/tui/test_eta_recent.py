"""The dashboard's ETA follows the run's recent speed (issue 39): a run that slows down (a busy
machine, a throttled GPU) gets a later ETA within a few step reports, not once the slow steps
are half the segment. The console's step lines use the same rule (engine.events.eta_seconds)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import events as ev
from engine.config import resolve
from tui.models.runstate import RunState


def _started(max_steps: int) -> ev.RunStarted:
    cfg = resolve("micro", overrides={"train.max_steps": max_steps}).model_dump(mode="json")
    return ev.RunStarted(config=cfg, n_params=1, device="cpu", device_name="CPU", precision="fp32", flops_per_token=1,
                         time=1000.0)  # fmt: skip


def _step(i: int, t: float) -> ev.Step:
    return ev.Step(step=i, loss=2.0, lr=1e-3, grad_norm=0.5, step_time_s=t, tokens_per_s=100.0, mfu=None,
                   mem_bytes=None, tokens=100 * i, time=1000.0 + i)  # fmt: skip


def test_the_eta_follows_a_run_that_slows_down() -> None:
    s = RunState()
    s.feed(_started(max_steps=1000))
    for i in range(1, 201):
        s.feed(_step(i, 0.1))
    assert s.eta() == pytest.approx(800 * 0.1)
    for i in range(201, 221):  # the machine gets busy: 10x slower steps
        s.feed(_step(i, 1.0))
    assert s.eta() == pytest.approx(780 * 1.0)  # at the recent speed, not the median of the segment's second half
    assert s.settled_step_time() == pytest.approx(0.1)  # the segment's settled speed is another figure


def test_the_console_eta_is_the_same_rule() -> None:
    times = [0.1] * 200 + [1.0] * 20
    assert ev.eta_seconds(times, 220, 1000) == pytest.approx(780 * 1.0)


def test_the_status_line_has_no_settled_speed_where_segments_says_too_short_to_settle() -> None:
    """Issue 47: a toggled-on compile segment of one or two step reports showed `vs settled` (its
    compile step as the settled speed) while the Segments tab said "too short to settle"."""
    from tui.session import RunSession
    from tui.screens.dashboard import status_text

    s = RunState()
    session = RunSession(run_dir=Path("run"), mode="attached", state=s)
    s.feed(_started(max_steps=100))
    for i in range(1, ev.SETTLE_MIN_REPORTS):
        s.feed(_step(i, 5.0 if i == 1 else 0.1))
        assert s.settled_step_time() is None and "vs settled" not in status_text(s, session), i
    s.feed(_step(ev.SETTLE_MIN_REPORTS, 0.1))
    assert s.settled_step_time() == pytest.approx(0.1) and "vs settled 100.0 ms" in status_text(s, session)
