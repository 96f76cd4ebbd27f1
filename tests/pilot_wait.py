"""Shared by the Pilot tests: poll until a condition holds, or fail naming what never came;
launch a run on the app's thread from the setup form."""

import asyncio
from pathlib import Path

from tui.screens.dashboard import DashboardScreen

WAIT_S = 180.0  # generous bound for a loaded 2-core machine; the poll ends as soon as it holds


async def until(pilot, predicate, what: str, timeout: float = WAIT_S) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not predicate():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for: {what}")
        await pilot.pause(0.05)


async def launch_in_app(pilot, app, run_dir: Path, steps: int) -> DashboardScreen:
    """Name the run directory on the setup form, F6 (the run on the app's thread), and wait for
    the dashboard and `steps` trained steps."""
    await pilot.pause()
    app.screen.query_one("#run-dir").value = str(run_dir)
    await pilot.pause()
    await pilot.press("f6")
    await until(pilot, lambda: isinstance(app.screen, DashboardScreen), "the dashboard")
    await until(pilot, lambda: app.session.state.step >= steps, "a few steps")
    return app.screen
