"""`gpt2-tui runs [DIR]` and the app's Runs screen (F7): the table printed, a missing DIR
refused in one line (exit 2), and enter on a run opens its dashboard."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import gpt2_tui
from engine.inspect.runs import DEFAULT_ROOT
from tui.app import GPT2App
from tui.screens.dashboard import DashboardScreen
from tui.screens.runs import RunsScreen

from harness import until, write_gpu_run, write_run


def test_runs_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_run(tmp_path, "a", 1000.0, end="completed")
    assert gpt2_tui.main(["runs", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "a" in out.split() and "completed" in out and "10/10" in out
    assert gpt2_tui.main(["runs", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nope" in err[0]


def test_runs_screen_attach_opens_the_dashboard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    run = write_gpu_run(tmp_path / DEFAULT_ROOT, gpus=False)

    async def go() -> None:
        app = GPT2App()
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            await pilot.press("f7")
            await until(pilot, lambda: isinstance(app.screen, RunsScreen) and app.screen.loaded, "the runs listed")
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, DashboardScreen), "the dashboard")
            assert app.session.run_dir.resolve() == run.resolve() and app.session.mode == "attached"
            await until(pilot, lambda: app.session.state.finished is not None, "the run read")

    asyncio.run(go())
