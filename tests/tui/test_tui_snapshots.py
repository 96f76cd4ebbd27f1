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

    async def settle(pilot) -> None:
        app = pilot.app
        for _ in range(200):
            state = app.session.state if app.session else None
            chart = app.screen.query(MetricChart).first() if state else None
            if state and state.finished and chart is not None and chart._drawn and chart._drawn[0] == state.version:
                break
            await pilot.pause(0.05)
        await pilot.pause()

    assert snap_compare(GPT2App(attach_dir=Path("tui-run")), terminal_size=(120, 40), run_before=settle)
