"""The F8 speed-ladder screen (issue 13, item 12): an ETA while it runs, a warning when the
machine is already busy, "stopped" (not "done") after a stop, notes readable at 120
columns, and a ladder.md whose header names the device and the model size even when no
rung finished. The ladder runs for real: micro on the tiny dataset, compile left out.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from textual.app import App
from textual.widgets import Static

from bench import ladder as bench
from tui.screens.benchmark import BenchmarkScreen
from harness import until

SIZE = (120, 40)


class LadderApp(App):
    def __init__(self, screen: BenchmarkScreen):
        super().__init__()
        self.bench_screen = screen

    def on_mount(self) -> None:
        self.push_screen(self.bench_screen)


def text(screen: BenchmarkScreen, wid: str) -> str:
    return str(screen.query_one(wid, Static).render())


@pytest.mark.slow
def test_ladder_eta_stop_and_notes(tiny_dataset: Path, tmp_path: Path) -> None:
    config = bench.BenchConfig(preset="micro", data=str(tiny_dataset), vocab_size=None, steps=200000, warmup=1,
                               skip=["compile"])  # fmt: skip
    out = tmp_path / "ladder"
    screen = BenchmarkScreen(config, out=out)

    async def go() -> None:
        app = LadderApp(screen)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: screen.is_mounted, "the screen")
            await pilot.press("r")
            await until(pilot, lambda: "ETA" in text(screen, "#bench-status"), "an ETA while the first rung runs")
            await pilot.press("s")
            await until(pilot, lambda: not screen.running, "the ladder stopped")
            await until(pilot, lambda: text(screen, "#bench-status").startswith("stopped"), "said so")
            assert "done" not in text(screen, "#bench-status")
            assert "nothing measured" in text(screen, "#bench-status")  # every cell is '-'
            assert "baseline: skipped: stopped during this rung" in text(screen, "#bench-notes")

    asyncio.run(go())
    md = (out / "ladder.md").read_text()  # written with no rung measured: the header still whole
    assert "device ()" not in md and "device CPU" in md and "? params" not in md


@pytest.mark.slow
def test_ladder_notes_are_whole_at_120_columns(tiny_dataset: Path, tmp_path: Path) -> None:
    config = bench.BenchConfig(preset="micro", data=str(tiny_dataset), vocab_size=None, steps=2, warmup=1,
                               skip=["compile"])  # fmt: skip
    screen = BenchmarkScreen(config, out=tmp_path / "ladder")

    async def go() -> None:
        async with LadderApp(screen).run_test(size=SIZE) as pilot:
            await until(pilot, lambda: screen.is_mounted, "the screen")
            await pilot.press("r")
            await until(pilot, lambda: screen.result is not None and not screen.running, "the whole ladder")
            await until(pilot, lambda: text(screen, "#bench-status").startswith("done"), "done")
            notes = screen.query_one("#bench-notes", Static)
            assert "+ TF32: skipped: TF32 needs a CUDA GPU (Ampere or newer)" in str(notes.render())
            assert notes.region.width <= SIZE[0] and screen.query_one("#bench-table").virtual_size.width <= SIZE[0]

    asyncio.run(go())


def test_ladder_warns_when_the_machine_is_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    cores = os.cpu_count() or 1
    monkeypatch.setattr(os, "getloadavg", lambda: (2.0 * cores, 2.0 * cores, 1.0 * cores))
    screen = BenchmarkScreen(bench.BenchConfig(preset="micro"))

    async def go() -> None:
        async with LadderApp(screen).run_test(size=SIZE) as pilot:
            await until(pilot, lambda: "another run shares this machine" in text(screen, "#bench-status"), "the warning")

    asyncio.run(go())
