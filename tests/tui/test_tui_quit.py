"""Quitting the app while a run trains on its thread (issue 13, item 1): ctrl+q shows
STOPPING, the trainer saves a checkpoint at the step boundary and writes run_finished, and
the app exits only once the training thread has ended, however long the save takes. Only a
second ctrl+q quits without waiting.

Waits are bounded polls on the app's own state (never timed assertions): the CPU is shared.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import pytest

import tui.app
from engine.config import resolve
from engine.train.trainer import Trainer
from tui.app import GPT2App
from harness import WAIT_S, launch_in_app, until  # noqa: F401

SIZE = (120, 40)
SLOW_SAVE_S = 3.0  # the stop's checkpoint takes this long (a busy machine, a big model)




def _events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]


def _slow_saves(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Every checkpoint save sleeps first; the returned event is set when one begins."""
    began = threading.Event()
    save = Trainer.save_checkpoint

    def slow(self: Trainer, final: bool = False) -> None:
        began.set()
        time.sleep(SLOW_SAVE_S)
        save(self, final)

    monkeypatch.setattr(Trainer, "save_checkpoint", slow)
    # the old code gave the run a fixed wait, then left under the training thread
    monkeypatch.setattr(tui.app, "QUIT_WAIT_S", 0.5, raising=False)
    return began


@pytest.mark.slow
def test_quit_waits_for_the_stop_checkpoint_however_long(
    tiny_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "slow-stop"
    began = _slow_saves(monkeypatch)
    config = resolve("micro", overrides={"data.path": str(tiny_dataset), "train.max_steps": 100000,
                                         "train.ckpt_interval": 100000})  # fmt: skip
    alive_at_exit: list[bool] = []

    async def go() -> None:
        app = GPT2App(config)
        async with app.run_test(size=SIZE) as pilot:
            await launch_in_app(pilot, app, run_dir, steps=2)
            session = app.session
            real_exit = app.exit

            def exit_(*a, **k) -> None:
                alive_at_exit.append(session.thread.is_alive())
                real_exit(*a, **k)

            app.exit = exit_  # type: ignore[method-assign]
            await pilot.press("ctrl+q")
            assert session.control.stop_requested
            await until(pilot, lambda: began.is_set() or app.return_code is not None, "the stop's save begun")
            status = app.screen.query_one("#status")
            await until(pilot, lambda: "STOPPING" in str(status.render()) or app.return_code is not None, "STOPPING")
            assert app.return_code is None, "the app left while the run was still saving"
            assert "STOPPING" in str(status.render())
            await until(pilot, lambda: app.return_code is not None, "the app exits once the run has ended")
            assert app.return_code == 0
        assert alive_at_exit == [False]  # the app exited only after the training thread ended
        last = _events(run_dir)[-1]
        assert last["event"] == "run_finished" and last["reason"] == "stopped"
        ckpts = sorted((run_dir / "checkpoints").glob("step_*.pt"))
        assert ckpts and ckpts[-1].name == f"step_{last['step']:06d}.pt"
        assert not (run_dir / "writer.pid").exists()

    asyncio.run(go())


@pytest.mark.slow
def test_second_ctrl_q_quits_without_waiting(tiny_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = tmp_path / "quit-now"
    began = _slow_saves(monkeypatch)
    config = resolve("micro", overrides={"data.path": str(tiny_dataset), "train.max_steps": 100000,
                                         "train.ckpt_interval": 100000})  # fmt: skip

    async def go() -> None:
        app = GPT2App(config)
        async with app.run_test(size=SIZE) as pilot:
            await launch_in_app(pilot, app, run_dir, steps=2)
            await pilot.press("ctrl+q")
            await until(pilot, lambda: began.is_set(), "the stop's save begun")
            assert app.return_code is None
            await pilot.press("ctrl+q")  # the explicit second choice
            await until(pilot, lambda: app.return_code is not None, "the app exits at once")
            assert app.return_code == tui.app.QUIT_NOW_STATUS
            assert app.running_in_process()  # it did not wait (run_app then leaves by os._exit)
        app.session.thread.join(WAIT_S)  # let the test's own thread finish cleanly

    asyncio.run(go())
