"""Snapshot tests (pytest-textual-snapshot): the setup screen, and the dashboard fed a
recorded run directory (tests/data/tui-run: a 30-step nano run on the default dataset).

Update after an intended UI change with `pytest tests/tui/test_tui_snapshots.py --snapshot-update`
and look at the SVGs in tests/tui/__snapshots__/.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from engine.config import resolve
from tui.app import GPT2App
from tui.widgets.charts import MetricChart
from pilot_wait import until

DATA = Path(__file__).parents[1] / "data"

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


def test_dashboard_of_a_recorded_run(snap_compare, monkeypatch: pytest.MonkeyPatch, utc) -> None:
    monkeypatch.chdir(DATA)

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
        app = pilot.app
        await until(pilot, lambda: drawn(app), "the dashboard drawn", timeout=60)
        # the end's toast fades after 10 s: said, then cleared, so a slow machine draws the same frame
        assert any("q for what next" in n.message for n in app._notifications)
        app.clear_notifications()
        await pilot.pause()
        await until(pilot, lambda: drawn(app), "the dashboard drawn again", timeout=60)

    assert snap_compare(GPT2App(attach_dir=Path("tui-run")), terminal_size=(120, 40), run_before=settle)
