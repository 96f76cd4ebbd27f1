"""A repeated toggle (issue: `toggle RUN --compile` twice) starts no segment and saves no step
twice: the run drops it as "already on"; the CLI refuses to ask what is already pending;
and a segment too short for the settle window says so instead of a speed and a ratio."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import events as ev
from engine import rundir
from engine.config import resolve
from engine.events import CallbackSink
from engine.inspect import compare
from engine.run import requests, toggle
from engine.run.owner import start
from engine.run.segments import segments_of

FLAGS = {"speed.device": "cpu", "speed.precision": "fp32", "train.max_steps": 10, "train.eval_interval": 100,
         "train.ckpt_interval": 100, "train.sample_tokens": 0}  # fmt: skip
OFF = {"data.prefetch": False}


@pytest.mark.slow
def test_a_repeated_toggle_is_dropped_as_already_on_and_opens_no_segment(tmp_path: Path, tiny_dataset: Path) -> None:
    run_dir = tmp_path / "run"

    def ask(e):
        if e.event == "step" and e.step == 4:  # twice in one boundary: the second asks what the first gives
            toggle.request(run_dir, OFF)
            toggle.request(run_dir, OFF)
        if e.event == "step" and e.step == 5:  # again once the new segment runs with it
            toggle.request(run_dir, OFF)

    run = start(resolve("micro", None, FLAGS | {"data.path": str(tiny_dataset)}), run_dir, sinks=[CallbackSink(ask)])
    assert run.run() == "completed"
    events, problems = ev.read_events(run_dir / rundir.EVENTS)
    assert problems == []
    assert [(e.step, e.reason) for e in events if e.event == "segment"] == [(0, "start"), (4, "toggle")]
    acks = [(e.status, e.step, e.reason.split(":")[0]) for e in events if e.event == "request"]
    assert acks == [("dropped", 4, "already on"), ("applied", 4, ""), ("dropped", 5, "already on")]
    assert [e.step for e in events if e.event == "checkpoint"].count(4) == 1  # step 4 saved once
    assert [s.reason for s in segments_of(events)] == ["start", "toggle"]


@pytest.mark.slow
def test_toggle_refuses_to_ask_again_what_is_pending(tmp_path: Path, tiny_dataset: Path, capsys, monkeypatch) -> None:
    from harness import cli_fails
    from gpt2_tui import main

    run_dir = tmp_path / "run"
    start(resolve("micro", None, FLAGS | {"data.path": str(tiny_dataset), "train.max_steps": 2}), run_dir).run()
    monkeypatch.setattr(rundir, "writer_alive", lambda path: True)  # as if it trained on: the mailbox waits
    assert requests.pending(run_dir) == []
    assert main(["toggle", str(run_dir), "--no-prefetch"]) == 0
    capsys.readouterr()
    assert requests.pending(run_dir) == [OFF]
    err = cli_fails(capsys, ["toggle", str(run_dir), "--no-prefetch"], "already pending", "prefetch -> off")
    assert err.startswith("error: already pending")
    assert requests.pending(run_dir) == [OFF]  # nothing posted
    assert main(["toggle", str(run_dir), "--no-pin-memory"]) == 0  # another switch is asked
    assert requests.pending(run_dir) == [OFF, {"data.pin_memory": False}]


@pytest.mark.slow
def test_a_segment_shorter_than_the_settle_window_says_too_short(tmp_path: Path, tiny_dataset: Path) -> None:
    run_dir = tmp_path / "run"

    def ask(e):
        if e.event == "step" and e.step == 8:  # steps 9-10: two reports, fewer than the settle window
            toggle.request(run_dir, OFF)

    start(resolve("micro", None, FLAGS | {"data.path": str(tiny_dataset)}), run_dir, sinks=[CallbackSink(ask)]).run()
    first, last = compare.summarize(run_dir).segments
    assert (last.from_step, last.to_step) == (8, 10) and ev.SETTLE_MIN_REPORTS > 2
    assert last.too_short_to_settle and last.settled_step_time_s is None and last.tokens_per_s is None
    assert not first.too_short_to_settle and first.settled_step_time_s is not None
    table = compare.format_table(compare.compare([run_dir]))
    header = next(line for line in table.splitlines() if line.startswith("run "))
    (row,) = [line for line in table.splitlines() if " 8-10 " in line]
    ends = [header.index(c) + len(c) for c in ("vs prev", "vs first")]  # right-aligned: no speed-up for it
    assert "too short to settle" in row and [row[:end].split()[-1] for end in ends] == ["-", "-"]


@pytest.mark.parametrize("runs, asked, same", [
    ("auto", "fp32", True),   # auto is fp32 on a CPU: nothing to change
    ("fp32", "auto", True),
    ("fp16", "auto", False),  # auto would switch an fp16 run back to fp32: a change
    ("auto", "bf16", False),
])  # fmt: skip
def test_a_toggle_is_judged_by_what_its_switches_resolve_to_not_by_their_words(runs, asked, same):
    """Issue 47 item 2: `toggle --precision auto` compared as a word went wrong both ways; the run
    and the CLI compare what each value resolves to on the run's device (toggle.effective)."""
    from engine.config import resolve
    from engine.run import toggle

    config = resolve("micro", None, {"speed.device": "cpu", "speed.precision": runs})
    said = toggle.already_on(config, {"speed.precision": asked})
    assert (said is not None) == same, said
    if same:
        assert "precision fp32" in said
