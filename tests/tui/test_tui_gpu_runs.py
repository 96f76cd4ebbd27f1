"""GpuPanel and RunsScreen driven by Pilot in a minimal App: recorded GPU samples drawn,
the one-line "not available" state, and the runs table posting Open for attach/resume/compare.

Waits are bounded polls on the widgets' own state, never timed assertions (the CPU is shared).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from textual.app import App, ComposeResult
from textual.widgets import DataTable, Static

from engine.text import loss_text
from engine.gpu_monitor import GpuSample, GpuSampler
from tui.screens.runs import RunsScreen
from tui.widgets.gpu_panel import GpuChart, GpuPanel
from harness import release_claimed, runs_app, until, write_run

SIZE = (120, 40)


def recorded(rounds: int = 6, gpus: int = 2) -> list[list[GpuSample]]:
    return [
        [GpuSample(t=1000.0 + k, index=i, name=f"NVIDIA H100 #{i}", util_pct=90.0 + k + i, mem_used_bytes=(40 + k) * 2**30,
                   mem_total_bytes=80 * 2**30, power_w=600.0 + k, temp_c=60.0 + k, sm_clock_mhz=1980 - i)
         for i in range(gpus)]
        for k in range(rounds)
    ]  # fmt: skip


class PanelApp(App):
    def __init__(self, panel: GpuPanel):
        super().__init__()
        self.panel = panel

    def compose(self) -> ComposeResult:
        yield self.panel


def status(panel: GpuPanel) -> str:
    return str(panel.query_one("#gpu-status", Static).render())


@pytest.mark.slow
def test_gpu_panel_draws_recorded_samples_fed_from_the_sampler_thread() -> None:
    async def go() -> None:
        panel = GpuPanel()
        app = PanelApp(panel)
        async with app.run_test(size=SIZE) as pilot:
            assert "waiting for the first reading" in status(panel)
            rounds = recorded()
            sampler = GpuSampler(panel.add_samples, interval=0.01, read=iter(rounds + [[]] * 10**6).__next__)
            sampler.start()  # add_samples runs on the sampler thread: it must be safe there
            await until(pilot, lambda: panel.version >= len(rounds), "every recorded round stored")
            sampler.stop()
            await until(pilot, lambda: panel.redraws > 0 and "util 96%" in status(panel), "the panel redrawn")
            text = status(panel)
            assert "GPU0 NVIDIA H100 #0  util 95%  mem 45.0/80.0 GiB  power 605 W  temp 65 C  SM 1980 MHz" in text
            assert "GPU1 NVIDIA H100 #1  util 96%" in text and "SM 1979 MHz" in text
            charts = {c.id: c for c in panel.query(GpuChart)}
            assert len(charts) == 5 and all(c.display for c in charts.values())
            await pilot.pause()
            util = str(charts["gpu-chart-util"].render())
            assert "utilization %" in util and "95 96" in util  # the latest value of each GPU
            assert "SM clock MHz  1980 1979" in str(charts["gpu-chart-clock"].render())
            # nothing new: no redraw however often the timer fires
            n = panel.redraws
            await pilot.pause(2.5 * panel.min_interval)
            assert panel.redraws == n

    asyncio.run(go())


def test_gpu_panel_missing_fields_show_a_dash() -> None:
    async def go() -> None:
        panel = GpuPanel()
        async with PanelApp(panel).run_test(size=SIZE) as pilot:
            panel.add_samples([GpuSample(t=1.0, index=0, name="Old GPU", mem_used_bytes=2**30, temp_c=40.0)])
            assert panel.maybe_redraw(force=True)
            await pilot.pause()
            assert status(panel) == "GPU0 Old GPU  util -%  mem 1.0 GiB  power - W  temp 40 C  SM - MHz"
            panel.add_samples([GpuSample(t=2.0, index=0, name="Old GPU", temp_c=41.0)])
            assert not panel.maybe_redraw()  # new data, but within the interval: no second draw yet
            panel.display = False
            panel._last_draw = 0.0
            assert not panel.maybe_redraw()  # not on screen: no draw

    asyncio.run(go())


def test_gpu_panel_without_nvml_says_so_in_one_line() -> None:
    async def go() -> None:
        panel = GpuPanel(unavailable="nvidia-ml-py not installed")
        async with PanelApp(panel).run_test(size=SIZE) as pilot:
            await pilot.pause()
            assert status(panel) == "GPU panel: not available here — nvidia-ml-py not installed"
            assert not panel.query_one("#gpu-charts").display
            panel.set_unavailable(None)
            await pilot.pause()
            assert panel.query_one("#gpu-charts").display

    asyncio.run(go())


# ------------------------------------------------------------------------------ runs screen


@pytest.fixture(autouse=True)
def _release_claimed():
    yield
    release_claimed()


def test_runs_screen_lists_runs_and_posts_open(tmp_path: Path) -> None:
    old = write_run(tmp_path, "old", 1000.0, end="completed")
    mid = write_run(tmp_path, "mid", 2000.0, end="stopped")
    new = write_run(tmp_path, "new", 3000.0, alive=True)

    async def go() -> None:
        app = runs_app(tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: isinstance(app.screen, RunsScreen) and app.screen.loaded, "the runs listed")
            screen = app.screen
            table = screen.query_one("#runs", DataTable)
            assert table.row_count == 3
            rows = [[str(c) for c in table.get_row_at(i)] for i in range(3)]
            assert [r[1] for r in rows] == ["new", "mid", "old"]  # newest first
            assert [r[3] for r in rows] == ["running", "stopped", "completed"]
            assert rows[0][2] == "nano 1.9M v8192" and rows[2][4] == "10/10" and rows[2][5] == loss_text(5.5)  # the one loss format

            await pilot.press("enter")
            await until(pilot, lambda: len(app.opened) == 1, "Open posted by enter")
            assert (app.opened[0].path, app.opened[0].action) == (new, "attach")

            await pilot.press("r")  # the running run cannot be resumed: a warning, no message
            await pilot.pause()
            await pilot.press("down", "r")
            await until(pilot, lambda: len(app.opened) == 2, "Open posted by r")
            assert (app.opened[1].path, app.opened[1].action) == (mid, "resume")

            await pilot.press("a")
            await until(pilot, lambda: len(app.opened) == 3, "Open posted by a")
            assert (app.opened[2].path, app.opened[2].action) == (mid, "attach")

            await pilot.press("c")  # nothing marked: a hint, no message
            await pilot.press("space", "down", "space")
            assert str(table.get_row_at(1)[0]) == "*" and str(table.get_row_at(2)[0]) == "*"
            await pilot.press("c")
            await until(pilot, lambda: len(app.opened) == 4, "Open posted by c")
            assert app.opened[3].action == "compare" and app.opened[3].paths == [mid, old]

            await pilot.press("escape")
            await pilot.pause()
            assert not isinstance(app.screen, RunsScreen)

    asyncio.run(go())


def test_runs_screen_with_no_runs(tmp_path: Path) -> None:
    async def go() -> None:
        app = runs_app(tmp_path / "none")
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: isinstance(app.screen, RunsScreen) and app.screen.loaded, "the listing")
            assert "no runs under" in str(app.screen.query_one("#runs-info", Static).render())
            await pilot.press("enter", "r", "c")
            await pilot.pause()
            assert app.opened == []

    asyncio.run(go())


