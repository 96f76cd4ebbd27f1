"""The `gpu` event and the dashboard's GPU tab: recorded readings in a run's events.jsonl
reach the GpuPanel of an attached dashboard; a run without any, on a machine without NVML,
shows the one "not available" line. The event is silent in the log and on the console.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from textual.widgets import Static

from engine import events as ev
from engine.gpu_monitor import GpuEvent, available
from engine.text import describe
from tui.app import GPT2App
from tui.models.runstate import RunState
from tui.screens.dashboard import DashboardScreen
from tui.widgets.gpu_panel import GpuPanel
from harness import gpu_rounds, until, write_gpu_run

SIZE = (120, 40)


def test_gpu_event_parses_and_is_silent() -> None:
    line = GpuEvent(gpus=gpu_rounds(1)[0]).model_dump_json()
    e = ev.parse_event(line)
    assert isinstance(e, ev.Gpu) and e.gpus[0].util_pct == 90.0
    assert describe(e) == ""
    state = RunState()
    v = state.version
    for r in gpu_rounds(3):
        state.feed(ev.Gpu(gpus=r))
    assert state.version == v and state.log_count == 0  # no chart redraw, no log line
    assert [r[0].util_pct for r in state.gpu_since(1)] == [91.0, 92.0]


def gpu_status(app) -> str:
    return str(app.screen.query_one("#gpu", GpuPanel).query_one("#gpu-status", Static).render())


def test_attached_run_shows_its_recorded_gpu_readings(tmp_path: Path) -> None:
    run = write_gpu_run(tmp_path, gpus=True)

    async def go() -> None:
        app = GPT2App(attach_dir=run)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: isinstance(app.screen, DashboardScreen) and app.session.state.finished, "read")
            app.screen.query_one("#tabs").active = "tab-gpu"
            panel = app.screen.query_one("#gpu", GpuPanel)
            await until(pilot, lambda: panel.version >= 4, "the readings handed to the panel")
            assert panel.unavailable is None
            await until(pilot, lambda: "util 93%" in gpu_status(app), "the panel drawn")
            assert "GPU0 NVIDIA H100  util 93%  mem 43.0/80.0 GiB" in gpu_status(app)

    asyncio.run(go())


def test_cpu_run_gpu_tab_says_not_available(tmp_path: Path) -> None:
    run = write_gpu_run(tmp_path, gpus=False)
    ok, why = available()

    async def go() -> None:
        app = GPT2App(attach_dir=run)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: isinstance(app.screen, DashboardScreen) and app.session.state.finished, "read")
            app.screen.query_one("#tabs").active = "tab-gpu"
            await pilot.pause()
            if ok:  # a GPU box: the panel waits for readings instead
                assert "waiting for the first reading" in gpu_status(app)
            else:
                assert gpu_status(app) == f"GPU panel: not available here — {why}"

    asyncio.run(go())
