"""A toggle acknowledged as applied is never dropped afterwards (issue 38). The toggle's hand-over
checkpoint names it (pending) until the new segment saves its own; a kill in that window (after
the acknowledgement, before the next checkpoint) left the resume to guess from the switches alone,
and where they differ from what the toggle asked (a resume given a flag that sets the switch back,
two toggles of one switch taken at one boundary) it reported the applied toggle as dropped, "killed
before it applied": two acknowledgements that contradict each other. The log is the record.

By class: each way the switches at resume can differ from an applied toggle's, killed right after
its acknowledgement, leaves one acknowledgement per toggle, the applied one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.run import toggle
from harness import QUIET, open_run, run_events


class Killed(BaseException):
    """Stands for a kill -9 right after the toggles were acknowledged (nothing after runs)."""


def _killed_after_ack(run_dir: Path, data: Path, asks: list[dict[str, Any]]) -> list[str]:
    """A run that asks for `asks` at step 2 (taken at one boundary) and dies as soon as the new
    segment acknowledged them: the hand-over checkpoint still names them. Their request ids."""
    ids: list[str] = []

    def on(e: Any) -> None:
        if e.event == "step" and e.step == 2 and not ids:
            ids.extend(toggle.request(run_dir, ask).id for ask in asks)
        if e.event == "request" and e.status == "applied" and e.id == ids[-1]:
            raise Killed

    run = open_run(run_dir, data, on_event=on, **(QUIET | {"train.max_steps": 6}))
    with pytest.raises(Killed):
        run.run()
    return ids


CASES = {  # how the switches at resume differ from what an applied toggle asked
    "a flag at resume sets it back": ([{"data.prefetch": False}], {"data.prefetch": True}),
    "two toggles of one switch at one boundary": ([{"data.prefetch": False}, {"data.prefetch": True}], {}),
    "as asked": ([{"data.prefetch": False}], {}),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_an_acknowledged_toggle_is_not_dropped_by_a_resume(tmp_path, tiny_dataset, case) -> None:
    asks, flags = CASES[case]
    run_dir = tmp_path / "run"
    ids = _killed_after_ack(run_dir, tiny_dataset, asks)
    assert open_run(run_dir, resume=True, **flags).run() == "completed"
    events = run_events(run_dir)
    acks = {i: [e.status for e in events if e.event == "request" and e.id == i] for i in ids}
    assert acks == {i: ["applied"] for i in ids}, acks
    lost = [e.message for e in events if e.event == "warning" and "killed before it applied" in e.message]
    assert lost == [], lost


@pytest.mark.slow
def test_a_toggle_taken_then_killed_before_its_save_is_dropped_with_a_word(tmp_path, tiny_dataset, monkeypatch) -> None:
    """The window before the hand-over checkpoint: the toggle was taken from the mailbox and
    was being checked when the kill came. It stayed in the mailbox (held until settled), so
    the resume finds it and drops it with a line: one acknowledgement, never silence."""
    run_dir = tmp_path / "run"
    asked: list[str] = []

    def on(e: Any) -> None:
        if e.event == "step" and e.step == 2 and not asked:
            asked.append(toggle.request(run_dir, {"data.prefetch": False}).id)

    def killed_while_checking(*args: Any, **kwargs: Any) -> Any:
        raise Killed

    run = open_run(run_dir, tiny_dataset, on_event=on, **(QUIET | {"train.max_steps": 6}))
    with monkeypatch.context() as m:
        m.setattr(toggle, "check", killed_while_checking)
        with pytest.raises(Killed):
            run.run()
    assert open_run(run_dir, resume=True).run() == "completed"
    events = run_events(run_dir)
    acks = [(e.status, e.reason) for e in events if e.event == "request" and e.id == asked[0]]
    assert len(acks) == 1 and acks[0][0] == "dropped" and "stale" in acks[0][1], acks
    assert any(e.event == "warning" and asked[0] in e.message for e in events)
