"""Snapshot tests (pytest-textual-snapshot) of the screens that hold still: the setup screen;
the dashboard fed a recorded run directory (tests/data/tui-run: a 30-step nano run on the
default dataset) and, over it, the run-end choice (q), the help (?) and the Switches dialog;
the Runs screen (F7) and the Compare screen over the recorded runs (tui-run, nano-150).

Nothing trains: every picture is of recorded data, read from fixed relative paths (the test
changes into tests/data or into a tmp dir holding runs/), with times shown in UTC and the
machine's free memory fixed, so the same SVG comes out on any CPU machine.

Update after an intended UI change with `pytest tests/tui/test_tui_snapshots.py --snapshot-update`
and look at the SVGs in tests/tui/__snapshots__/.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from engine.config import resolve
from harness import DATA, until
from tui.app import GPT2App
from tui.screens.modals import HelpScreen
from tui.screens.run_end import RunEndScreen
from tui.screens.runs import RunsScreen
from tui.screens.toggle import ToggleScreen
from tui.widgets.charts import MetricChart

SIZE = (120, 40)

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(), reason="snapshots are of the CPU machine's form (GPU switches differ)"
)


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_setup_screen(snap_compare, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)

    async def fill(pilot) -> None:
        screen = pilot.app.screen
        screen.query_one("#run-dir").value = "runs/snapshot"
        screen.query_one("#mem-budget").value = "8GiB"
        await pilot.pause()

    assert snap_compare(GPT2App(resolve("nano")), terminal_size=(120, 40), run_before=fill)


def drawn(app) -> bool:
    """The run read to its end and every chart on screen drawn from it at its final size
    (the top charts grow once the layout is known: a draw at the first size is not the last)."""
    state = app.session.state if app.session else None
    charts = [c for c in app.screen.query(MetricChart) if c.display and c.region] if state else []
    return bool(state and state.finished and charts) and all(
        c._drawn is not None and c._drawn[0] == state.version and c._drawn[3:] == (c.size.width, c.size.height)
        for c in charts
    )


async def settle(pilot) -> None:
    """The attached dashboard of tui-run drawn, its end's toast said and cleared."""
    app = pilot.app
    await until(pilot, lambda: drawn(app), "the dashboard drawn", timeout=60)
    # the end's toast fades after 10 s: said, then cleared, so a slow machine draws the same frame
    assert any("q for what next" in m for m in app.said)  # said (it may have faded on a slow machine)
    await quiet(pilot)
    await pilot.pause()
    await until(pilot, lambda: drawn(app), "the dashboard drawn again", timeout=60)


def on_the_dashboard(key: str | None, screen: type) -> Callable:
    """run_before: settle the dashboard, then press `key` (or push nothing) and wait for `screen`."""

    async def run_before(pilot) -> None:
        await settle(pilot)
        if key is not None:
            await pilot.press(key)
        await until(pilot, lambda: isinstance(pilot.app.screen, screen), f"the {screen.__name__}")
        await quiet(pilot)

    return run_before


async def quiet(pilot) -> None:
    """No toast on screen. notify() only posts its toast: the app adds it when it handles that
    message, so a clear made before then clears nothing and the toast lands after it, over the
    frame a snapshot takes (two snapshots were flaky so). The pause lets the app take it first."""
    await pilot.pause()
    pilot.app.clear_notifications()
    await until(pilot, lambda: not pilot.app.screen.query("Toast"), "no toast on screen")
    await pilot.pause()


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch, utc) -> GPT2App:
    """The app attached to tests/data/tui-run (cwd tests/data: the path on screen is `tui-run`)."""
    monkeypatch.chdir(DATA)
    app = GPT2App(attach_dir=Path("tui-run"))
    app.said = []  # every toast's words, kept after the toast fades
    notify = app.notify

    def said(message, *args, **kwargs):
        app.said.append(str(message))
        return notify(message, *args, **kwargs)

    app.notify = said
    return app


def test_dashboard_of_a_recorded_run(snap_compare, recorded) -> None:
    assert snap_compare(recorded, terminal_size=SIZE, run_before=settle)


def test_run_end_screen(snap_compare, recorded) -> None:
    """q on the ended dashboard: form, resume or another run."""
    assert snap_compare(recorded, terminal_size=SIZE, run_before=on_the_dashboard("q", RunEndScreen))


def test_help_screen(snap_compare, recorded) -> None:
    assert snap_compare(recorded, terminal_size=SIZE, run_before=on_the_dashboard("question_mark", HelpScreen))


def test_switches_screen(snap_compare, recorded, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Switches dialog with the recorded run's switches, as the dashboard's `o` opens it for a
    live run (this run is over, so the test opens it: `o` would say there is nothing to toggle);
    the machine's free RAM fixed at 16 GiB, the budget the estimate is shown against."""
    from engine import device, rundir

    monkeypatch.setattr(device, "available_host_memory", lambda: 16 * 2**30)

    async def run_before(pilot) -> None:
        await settle(pilot)
        pilot.app.push_screen(ToggleScreen(Path("tui-run"), rundir.load_config(Path("tui-run")), held=0,
                                           send=lambda request: None))  # fmt: skip
        await until(pilot, lambda: isinstance(pilot.app.screen, ToggleScreen), "the Switches dialog")
        await pilot.pause()

    assert snap_compare(recorded, terminal_size=SIZE, run_before=run_before)


def test_runs_screen(snap_compare, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, utc) -> None:
    """F7 from the form: the recorded runs under runs/, newest first."""
    for name in ("tui-run", "nano-150"):
        shutil.copytree(DATA / name, tmp_path / "runs" / name)
    monkeypatch.chdir(tmp_path)

    async def run_before(pilot) -> None:
        await pilot.pause()
        await pilot.press("f7")
        await until(pilot, lambda: isinstance(pilot.app.screen, RunsScreen) and pilot.app.screen.loaded, "the runs")
        await pilot.pause()

    assert snap_compare(GPT2App(resolve("nano")), terminal_size=SIZE, run_before=run_before)


def test_compare_screen(snap_compare, monkeypatch: pytest.MonkeyPatch, utc) -> None:
    """`gpt2-tui compare --tui tui-run nano-150`: the curves overlaid, the segments listed."""
    from tui.screens.compare import CompareApp, CompareScreen

    monkeypatch.chdir(DATA)

    async def run_before(pilot) -> None:
        app = pilot.app
        await until(pilot, lambda: isinstance(app.screen, CompareScreen) and app.screen.loaded, "runs loaded")
        await pilot.pause()
        app.screen.redraw()  # at the charts' final size (the first draw may come before the layout)
        await pilot.pause()

    assert snap_compare(CompareApp([Path("tui-run"), Path("nano-150")]), terminal_size=SIZE, run_before=run_before)


@pytest.mark.slow  # measured 4.7-5.8 s: the dashboard drawn, then every tab
@pytest.mark.parametrize("size", [SIZE, (80, 24)], ids=["120x40", "80x24"])
def test_every_dashboard_tab_is_reached_by_keyboard(recorded, size) -> None:
    """Issue 47 item 3: over SSH there is no mouse. `t` steps through the tabs and 1-5 jump to one,
    wherever the focus is (here on the log, where the arrows do nothing for the tab bar); the
    footer shows `t`."""
    import asyncio

    from textual.widgets import Footer, TabbedContent

    from tui.screens.dashboard import TABS

    async def go() -> None:
        async with recorded.run_test(size=size) as pilot:
            await settle(pilot)
            pilot.app.screen.query_one("#log").focus()
            tabs = pilot.app.screen.query_one("#tabs", TabbedContent)
            seen = [tabs.active]
            for _ in TABS:
                await pilot.press("t")
                await pilot.pause()
                seen.append(tabs.active)
            assert seen == [*TABS, "tab-charts"]
            for i, tab in enumerate(TABS, 1):
                await pilot.press(str(i))
                await pilot.pause()
                assert tabs.active == tab
            shown = [key for key, active in pilot.app.screen.active_bindings.items() if active.binding.show]
            assert "t" in shown and pilot.app.screen.query(Footer)  # the footer names it

    asyncio.run(go())


def on_the_segments_tab(pilot_key: str = "4") -> Callable:
    """run_before: settle the dashboard, then reach the Segments tab by keyboard."""

    async def run_before(pilot) -> None:
        from tui.widgets.segments import SegmentTable

        await settle(pilot)
        await pilot.press(pilot_key)
        table = pilot.app.screen.query_one("#segments", SegmentTable)
        await until(pilot, lambda: table.row_count > 0 and table._width == table.size.width > 0, "the rows, folded")
        await pilot.pause()

    return run_before


@pytest.mark.parametrize("size", [SIZE, (80, 24)], ids=["120x40", "80x24"])
def test_segments_tab_by_keyboard(snap_compare, recorded, size) -> None:
    """Issue 47 item 3: the Segments tab, reached with `4`, fits the screen: the columns that do
    not fit fold into blocks under the first, as `compare` prints them; none cut, none off screen."""
    assert snap_compare(recorded, terminal_size=size, run_before=on_the_segments_tab())


@pytest.mark.parametrize("size", [SIZE, (80, 24)], ids=["120x40", "80x24"])
def test_the_segments_table_fits_its_width_with_every_column(recorded, size) -> None:
    """At 120x40 warm-up showed `10.` and the compile column was off screen."""
    import asyncio

    from engine.api import COMPARE_COLUMNS
    from tui.plain import PlainTable
    from tui.widgets.segments import SegmentTable

    async def go() -> None:
        async with recorded.run_test(size=size) as pilot:
            await on_the_segments_tab()(pilot)
            table = pilot.app.screen.query_one("#segments", SegmentTable)
            blocks = list(table.query_children(PlainTable))
            assert len(blocks) == len(table.blocks) >= (2 if size == (80, 24) else 1)
            for block in blocks:
                assert block.virtual_size.width <= block.size.width, (block.virtual_size, block.size)
                assert block.region.right <= pilot.app.size.width and block.size.height > block.row_count
            shown = [str(c.label) for block in blocks for c in block.ordered_columns]
            assert set(shown) == set(COMPARE_COLUMNS[1:]) and shown[0] == "steps", shown  # none dropped
            assert shown.count("steps") == len(blocks)  # each block keyed by its steps
            reach = str(table.get_row_at(0)[table.names.index("to target")])  # the time to its latest val loss,
            assert reach.endswith(" tok"), reach  # as `compare` says it (the dashboard's table left it blank)

    asyncio.run(go())
