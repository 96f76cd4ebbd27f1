"""What a user sees first, and the keys and defaults of the dialogs (issue 39, item 3 and minors):
the form's first screen holds every speed switch and the memory verdict at 120x40 and 80x24
(each help one line; a field's whole help on focus, every field's with ?); the start-from field's
placeholder stays in its field; the Switches dialog shows its own keys while it is up; the
resume dialog of a run stopped before its max steps offers them; ctrl+q on an in-app run says,
once the app has left the screen, the command that resumes it, and that command trains.

Pilot tests (App.run_test); what is on screen is read off the rendered lines.
"""

from __future__ import annotations

import asyncio
import shlex
import threading
from pathlib import Path
from typing import Any

import pytest
from textual.app import App

import tui.app
from engine import rundir
from engine.config import SWITCH, resolve
from engine.run.owner import Run
from engine.settings import form_sections
from engine.text import program
from gpt2_tui import main
from harness import DATA, launch_in_app, until
from tui.app import GPT2App
from tui.screens.dashboard import DashboardScreen
from tui.screens.modals import HELP
from tui.screens.run_end import ResumeScreen
from tui.screens.setup import SetupScreen, wid
from tui.screens.toggle import ToggleScreen


def screen_lines(app: App) -> list[str]:
    """The screen as drawn now, one string a row."""
    return [strip.text for strip in app.screen._compositor.render_strips()]


async def open_form(pilot, app: GPT2App) -> SetupScreen:
    await until(pilot, lambda: isinstance(app.screen, SetupScreen) and app.screen.caps is not None, "the form")
    await until(pilot, lambda: "memory: fits" in "".join(screen_lines(app)), "the memory verdict")
    return app.screen  # type: ignore[return-value]


SWITCHES = [s for title, ss in form_sections() if title == SWITCH for s in ss]


@pytest.mark.parametrize("size", [(120, 40), (80, 24)], ids=["120x40", "80x24"])
def test_the_first_screen_shows_every_speed_switch_and_the_memory_verdict(size: tuple[int, int]) -> None:
    assert {"speed.precision", "speed.compile", "model.attention"} <= {s.dotted for s in SWITCHES}

    async def go() -> None:
        app = GPT2App()
        async with app.run_test(size=size) as pilot:
            form = await open_form(pilot, app)
            lines = screen_lines(app)
            verdict = next(i for i, line in enumerate(lines) if line.lstrip().startswith("memory: fits"))
            assert verdict == size[1] - 2, lines  # the line above the footer, on the first screen
            shown = "\n".join(lines[:verdict])
            missing = [s.label for s in SWITCHES
                       if not any(line.startswith(f" {s.label} ") for line in lines[:verdict])]  # fmt: skip
            assert missing == [], shown
            assert "Speed switches" in shown and " compile " in shown
            for s in SWITCHES:  # one line each, not scrolled: the whole row on the first screen
                row = form.query_one("#row-" + wid(s.dotted))
                assert row.region.height == 1 and row.region.bottom <= verdict, (s.dotted, row.region)

    asyncio.run(go())


def test_a_fields_whole_help_shows_on_focus_and_every_fields_with_question_mark() -> None:
    async def go() -> None:
        app = GPT2App()
        async with app.run_test(size=(80, 24)) as pilot:
            form = await open_form(pilot, app)
            help_ = form.query_one("#help-" + wid("speed.compile"))
            assert help_.region.height == 1  # one line: the rest on focus
            form.query_one("#" + wid("speed.compile")).focus()
            await pilot.pause()
            await pilot.pause()
            whole = "\n".join(screen_lines(app))
            assert help_.region.height > 1 and "slow while it compiles" in whole, whole
            form.query_one("#form").focus()  # no field: its help is one line again
            await pilot.pause()
            assert help_.region.height == 1
            await pilot.press("question_mark")  # every help whole
            await pilot.pause()
            precision = form.query_one("#help-" + wid("speed.precision"))
            assert precision.region.height > 1 and help_.region.height > 1
            await pilot.press("question_mark")
            await pilot.pause()
            assert precision.region.height == 1
            assert "?   every field's whole help" in HELP

    asyncio.run(go())


def test_the_start_from_placeholder_stays_in_its_field() -> None:
    async def go() -> None:
        app = GPT2App()
        async with app.run_test(size=(80, 24)) as pilot:
            form = await open_form(pilot, app)
            field = form.query_one("#" + wid("model.init_from"))
            assert len(field.placeholder) < field.size.width, field.placeholder  # not cut off mid-phrase
            row = form.query_one("#row-" + wid("model.init_from"))
            row.scroll_visible(animate=False)
            await pilot.pause()
            assert row.region.height == 1, row.region  # it was 7 lines at 80x24

    asyncio.run(go())


def test_the_switches_dialog_shows_its_own_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(DATA)

    async def go() -> None:
        app = GPT2App(attach_dir=Path("tui-run"))
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: isinstance(app.screen, DashboardScreen) and app.session.state.finished,
                        "the dashboard")  # fmt: skip
            dashboard_footer = screen_lines(app)[-1]
            app.push_screen(ToggleScreen(Path("tui-run"), rundir.load_config(Path("tui-run")), held=0,
                                         send=lambda request: None))  # fmt: skip
            await until(pilot, lambda: isinstance(app.screen, ToggleScreen), "the Switches dialog")
            await pilot.pause()
            footer = screen_lines(app)[-1]
            assert footer != dashboard_footer
            assert "a Apply" in footer and "esc Cancel" in footer, footer
            assert "a applies" in HELP

    asyncio.run(go())


class Dialog(App):
    def __init__(self, screen: Any) -> None:
        super().__init__()
        self.dialog = screen

    def on_mount(self) -> None:
        self.push_screen(self.dialog)


@pytest.mark.parametrize(("step", "max_steps", "offered"), [(5, 20, 20), (20, 20, 40), (30, 20, 60)])
def test_the_resume_dialog_offers_a_stopped_runs_own_max_steps(step: int, max_steps: int, offered: int) -> None:
    async def go() -> None:
        app = Dialog(ResumeScreen("run", step, max_steps))
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            assert app.screen.query_one("#resume-steps").value == str(offered)

    asyncio.run(go())


@pytest.mark.slow  # a run in the app, then the printed resume trains it on to step 150 (10-50 s on 2 cores)
def test_ctrl_q_on_an_in_app_run_prints_the_command_that_resumes_it(
    tiny_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    config = resolve("micro", overrides={"data.path": str(tiny_dataset), "speed.device": "cpu",
                                         "speed.precision": "fp32", "train.max_steps": 150,
                                         "train.sample_tokens": 0})  # fmt: skip

    # 150 micro steps take about a second: the run holds at step 3's boundary until "p" is
    # pressed, so the pause lands before its end however slow the machine (the race CI lost)
    pressed = threading.Event()
    real_boundary = Run.at_boundary

    def boundary(self: Run, segment: Any) -> Any:
        if segment.step == 3:
            pressed.wait(timeout=120)
        return real_boundary(self, segment)

    monkeypatch.setattr(Run, "at_boundary", boundary)

    async def drive(pilot) -> None:
        app = pilot.app
        await launch_in_app(pilot, app, run_dir, steps=1)
        await pilot.press("p")  # paused at a step boundary: ctrl+q stops it before its end
        pressed.set()
        await until(pilot, lambda: app.session.state.paused, "paused")
        await pilot.press("ctrl+q")

    real_run = GPT2App.run

    def run_headless(self: GPT2App, *args: Any, **kwargs: Any) -> Any:
        return real_run(self, headless=True, size=(120, 40), auto_pilot=drive)

    monkeypatch.setattr(GPT2App, "run", run_headless)
    assert tui.app.run_app(config) == 0
    out = capsys.readouterr().out
    line = next((x for x in out.splitlines() if "continue it with:" in x), None)
    assert line is not None and "stopped at step" in line, out
    argv = shlex.split(line.split(program(), 1)[1])
    assert argv == ["train", "--resume", str(run_dir)], argv
    assert main(argv) == 0  # the printed command trains the run to its end
    assert (run_dir / rundir.CHECKPOINTS / "step_000150.pt").is_file()


@pytest.mark.slow  # trains: a live run's footer
def test_a_live_runs_footer_shows_every_key_at_80_columns(tmp_path: Path, tiny_dataset: Path) -> None:
    """p, s, q, l, o, t (the next tab: over SSH the only way to the Segments tab), ?, ^q, F7 and F8,
    each whole, on one 80-column footer while the run trains."""
    config = resolve("micro", None, {"data.path": str(tiny_dataset), "speed.device": "cpu", "speed.precision": "fp32",
                                     "train.max_steps": 100_000})  # fmt: skip

    async def go() -> None:
        app = GPT2App(config)
        async with app.run_test(size=(80, 24)) as pilot:
            await launch_in_app(pilot, app, tmp_path / "run", 2)
            await pilot.pause(0.5)
            footer = screen_lines(app)[-1]
            app.session.control.stop()
            await until(pilot, lambda: not app.session.state.live, "the run stopped")
        words = ["p Pause", "s Save", "q Stop", "l Log-y", "o Switches", "t Tab", "? Help", "^q Quit", "f7 Runs",
                 "f8 Ladder"]  # fmt: skip
        assert all(f" {w} " in f" {footer} " for w in words), footer

    asyncio.run(go())
