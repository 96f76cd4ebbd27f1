"""Issue 22, the first hour (round two), in the real app (Textual Pilot): a key pressed while
torch loads, the speed columns at 80 columns, the keyboard in dialogs, one settled speed,
elapsed while paused, where F2 writes, the form's warmup rule, the F8 screen at 80x24. Runs are
real micro runs on CPU (the CLI writes them; the app attaches or trains one on its thread)."""

from __future__ import annotations

import asyncio
import html
import json
import re
import threading
from pathlib import Path
from typing import Any

import pytest

from engine.config import resolve
from gpt2_tui import main
from tui.app import GPT2App
from harness import WAIT_S, launch_in_app, until

MICRO = ["--preset", "micro", "--device", "cpu", "--precision", "fp32"]
LONG = {"train.max_steps": 100000, "train.ckpt_interval": 100000, "train.eval_interval": 100000,
        "train.sample_tokens": 0, "train.log_interval": 1}  # fmt: skip


def micro(dataset: Path, **over: Any):
    return resolve("micro", overrides={"data.path": str(dataset), "speed.device": "cpu", **over})


def screen_text(app: GPT2App) -> str:
    """What the terminal shows, as plain text lines (the screenshot's characters, grouped by
    row; what is scrolled off-screen is absent)."""
    svg = app.export_screenshot()
    rows: dict[float, list[tuple[float, str]]] = {}
    for attrs, body in re.findall(r"<text([^>]*)>(.*?)</text>", svg, re.S):
        x, y = re.search(r'\bx="([\d.]+)"', attrs), re.search(r'\by="([\d.]+)"', attrs)
        if x and y:
            rows.setdefault(float(y.group(1)), []).append((float(x.group(1)), re.sub(r"<[^>]+>", "", body)))
    lines = ("".join(t for _, t in sorted(parts)) for _, parts in sorted(rows.items()))
    return "\n".join(html.unescape(line).replace("\xa0", " ") for line in lines)


def status(app: GPT2App) -> str:
    return str(app.screen.query_one("#status").render())


def two_segment_run(tmp_path: Path, dataset: Path, capsys) -> Path:
    """A real run of two segments: 24 steps in fp32, then resumed to 30 with bf16 (a new segment)."""
    run = tmp_path / "run"
    assert main(["train", *MICRO, "--data", str(dataset), "--out", str(run), "--max-steps", "24",
                 "--log-interval", "1", "--ckpt-interval", "24"]) == 0  # fmt: skip
    assert main(["train", "--resume", str(run), "--max-steps", "30", "--precision", "bf16"]) == 0
    capsys.readouterr()
    return run


def stop_in_app(app: GPT2App) -> None:
    session = app.session
    if session is not None and getattr(session, "thread", None) is not None:
        session.control.stop()
        session.thread.join(WAIT_S)


# ---------------------------------------------------------------- 1. the Segments tab shows the speed at 80 columns


@pytest.mark.slow
def test_segments_tab_at_80_columns_shows_the_speed_once_a_second_segment_lands(tmp_path, tiny_dataset, capsys):
    """The dashboard drew the first segment's row, then a second segment arrived (as a toggle
    adds one on a live run): ms/step and tok/s must still be on screen at 80 columns."""
    done = two_segment_run(tmp_path, tiny_dataset, capsys)
    lines = (done / "events.jsonl").read_text().splitlines(keepends=True)
    second = [i for i, ln in enumerate(lines) if json.loads(ln)["event"] == "run_started"][1]
    live = tmp_path / "live"
    live.mkdir()
    (live / "config.toml").write_text((done / "config.toml").read_text())
    (live / "events.jsonl").write_text("".join(lines[:second]))

    async def go() -> str:
        app = GPT2App(attach_dir=live)
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: app.session.state.step == 24, "the first segment read")
            app.screen.query_one("#tabs").active = "tab-segments"
            await pilot.pause(1.5)  # the table redraws on its own slow timer
            with open(live / "events.jsonl", "a") as f:
                f.write("".join(lines[second:]))
            await until(pilot, lambda: app.session.state.step == 30, "the second segment read")
            await pilot.pause(2.5)
            return screen_text(app)

    shown = asyncio.run(go())
    header = [line for line in shown.splitlines() if re.search(r"\bsteps\b", line) and re.search(r"\bwhy\b", line)]
    assert header, shown  # the segment table's header row is on screen
    assert "ms/step" in header[0] and "tok/s" in header[0], shown
    second = [line for line in shown.splitlines() if "24-30" in line]
    assert second and "resume precision=bf16" in second[0], shown  # the change, named in the row


# ---------------------------------------------------------------- 6. a key pressed while torch loads


@pytest.mark.slow
def test_launch_pressed_while_torch_loads_is_kept_and_launches_once_loaded(tiny_dataset, tmp_path, monkeypatch):
    from engine import device
    from tui.screens import setup

    monkeypatch.setattr(setup, "paint_first", lambda headless: True)  # as in a terminal: paint, then load torch
    release = threading.Event()
    real = device.capabilities

    def slow_capabilities(*args, **kwargs):  # a cold `import torch` on a 2-core machine
        release.wait(60)
        return real(*args, **kwargs)

    monkeypatch.setattr(device, "capabilities", slow_capabilities)
    run_dir = tmp_path / "run"
    app = GPT2App(micro(tiny_dataset, **LONG))
    seen: list[str] = []

    async def go() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            original = app.notify
            app.notify = lambda message, *a, **k: (seen.append(str(message)), original(message, *a, **k))[1]
            await until(pilot, lambda: bool(app.screen.query("#run-dir")), "the form")
            app.screen.query_one("#run-dir").value = str(run_dir)
            await pilot.pause()
            await pilot.press("f6")  # in-app launch, pressed before torch is known
            await pilot.pause(0.5)
            assert any("as soon as" in n for n in seen), seen
            release.set()
            await until(pilot, lambda: (run_dir / "events.jsonl").exists(), "the launch, once torch loaded")
            from tui.screens.dashboard import DashboardScreen  # and its dashboard, mounted before the app closes

            await until(pilot, lambda: isinstance(app.screen, DashboardScreen), "the dashboard")
            await pilot.pause()

    try:
        asyncio.run(go())
    finally:
        release.set()
        stop_in_app(app)


# ---------------------------------------------------------------- 7. keyboard in dialogs


@pytest.mark.slow
def test_what_next_arrow_keys_move_between_its_buttons(tmp_path, tiny_dataset, capsys):
    run = tmp_path / "run"
    assert main(["train", *MICRO, "--data", str(tiny_dataset), "--out", str(run), "--max-steps", "4"]) == 0
    capsys.readouterr()

    async def go() -> None:
        app = GPT2App(attach_dir=run)
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.session.state.step == 4, "the finished run read")
            dashboard = app.screen
            await pilot.press("q")
            await until(pilot, lambda: app.screen is not dashboard, "What next?")
            first = app.focused
            await pilot.press("down")
            await pilot.pause()
            assert app.focused is not first, "Down did not move off the first button"

    asyncio.run(go())


@pytest.mark.slow
def test_switches_screen_has_an_apply_key(tiny_dataset, tmp_path):
    """On the Switches screen Apply is a key away (its footer names it), not ~12 Tabs."""
    app = GPT2App(micro(tiny_dataset, **LONG))

    async def go() -> None:
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: bool(app.screen.query("#run-dir")), "the form")
            await launch_in_app(pilot, app, tmp_path / "run", 2)
            dash = app.screen
            await pilot.press("o")
            await until(pilot, lambda: app.screen is not dash, "the switches screen")
            await pilot.pause(0.5)
            keys = {b.description.lower() for b in (x.binding for x in app.screen.active_bindings.values())}
            assert any("apply" in k for k in keys), keys

    try:
        asyncio.run(go())
    finally:
        stop_in_app(app)


# ---------------------------------------------------------------- 11. one settled speed


@pytest.mark.slow
def test_status_line_settled_speed_is_the_current_segments(tmp_path, tiny_dataset, capsys):
    run = two_segment_run(tmp_path, tiny_dataset, capsys)
    assert main(["compare", str(run), "--json"]) == 0
    segments = json.loads(capsys.readouterr().out)["runs"][0]["segments"]
    assert len(segments) == 2

    async def go() -> str:
        app = GPT2App(attach_dir=run)
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.session.state.step == 30, "the run read")
            await until(pilot, lambda: "vs settled" in status(app), "the settled speed")
            return status(app)

    line = asyncio.run(go())
    shown = float(re.search(r"vs settled ([\d.]+) ms", line).group(1))
    last = segments[-1]
    assert shown == pytest.approx(1000 * last["settled_step_time_s"], abs=0.051), (line, last)


# ---------------------------------------------------------------- 12. small ones in the app


@pytest.mark.slow
def test_elapsed_does_not_count_while_paused(tiny_dataset, tmp_path):
    app = GPT2App(micro(tiny_dataset, **LONG))

    def elapsed() -> str:
        return re.search(r"elapsed (\S+)", status(app)).group(1)

    async def go() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: bool(app.screen.query("#run-dir")), "the form")
            await launch_in_app(pilot, app, tmp_path / "run", 2)
            await pilot.press("p")
            await until(pilot, lambda: "PAUSED" in status(app), "paused")
            await pilot.pause(1.5)
            before = elapsed()
            await pilot.pause(2.5)
            assert elapsed() == before, status(app)

    try:
        asyncio.run(go())
    finally:
        stop_in_app(app)


@pytest.mark.slow
def test_f2_does_not_write_into_the_current_directory_unasked(tiny_dataset, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    app = GPT2App(micro(tiny_dataset))

    async def go() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: bool(app.screen.query("#launch")) and not app.screen.query_one("#launch").disabled,
                        "the form, ready")  # fmt: skip
            await pilot.pause(0.5)
            await pilot.press("f2")
            await pilot.pause(1.0)

    asyncio.run(go())
    assert not (tmp_path / "run.toml").exists(), "F2 wrote run.toml into the current directory"


# ---------------------------------------------------------------- 4. the form: one warmup rule with the CLI


def test_form_scales_the_presets_warmup_to_a_short_run(tiny_dataset, tmp_path):
    """nano's warmup 50 from the preset, max steps 20 typed in the form: launchable, as on the CLI."""
    from tui.screens.setup import wid  # the form's own field ids

    app = GPT2App(resolve("nano", overrides={"data.path": str(tiny_dataset), "speed.device": "cpu"}))

    async def go() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: bool(app.screen.query("#launch")) and not app.screen.query_one("#launch").disabled,
                        "the form, ready")  # fmt: skip
            app.screen.query_one("#" + wid("train.max_steps")).value = "20"
            await pilot.pause(1.0)
            assert not app.screen.query_one("#launch").disabled, screen_text(app)

    asyncio.run(go())


# ---------------------------------------------------------------- 10. the F8 screen at 80x24


def test_ladder_screen_run_button_is_on_screen_at_80x24():
    app = GPT2App()

    async def go() -> None:
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: bool(app.screen.query("#launch")), "the form")
            form = app.screen
            await pilot.press("f8")
            await until(pilot, lambda: app.screen is not form and bool(app.screen.query("#bench-run")), "the ladder")
            await pilot.pause(0.5)
            button = app.screen.query_one("#bench-run").region  # the Run button, whole, on the 80x24 screen
            assert button.width > 0 and button.right <= 80 and button.bottom <= 24, (button, screen_text(app))

    asyncio.run(go())


def test_ladder_warning_names_a_run_in_its_own_process_as_such():
    """An attached (or F5) run trains in its own process: not "in this app"."""
    from tui.screens.benchmark import sharing_warning

    assert "in this app" in sharing_warning(app_runs=1)
    own = sharing_warning(app_runs=0, process_runs=1)
    assert own is not None and "own process" in own and "in this app" not in own
