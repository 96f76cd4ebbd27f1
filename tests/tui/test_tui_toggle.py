"""Live toggles from the dashboard (issue 14), the real app driving real micro runs on CPU:
`o` opens the live run's switches; turning RAM preload off (the same token bytes, read
through np.memmap instead; it costs nothing, unlike compile) continues the run from the same step as a new segment, for
a run in this app and for a detached one watched from an attached dashboard alike; the
dashboard then shows the segment table's second row, a marker on the speed charts and a
toast. A set that does not fit the memory budget, or no change at all, is refused on the
screen and nothing is written. Waits are bounded polls (tests/harness.py).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from textual.widgets import Select, Switch

from engine import device

from engine.train import memory
from engine import rundir
from engine.config import resolve
from engine.run.preflight import open_data
from tui.app import GPT2App
from tui.screens.dashboard import DashboardScreen
from tui.screens.toggle import ToggleScreen
from tui.widgets.charts import MetricChart
from tui.widgets.segments import SegmentTable
from harness import WAIT_S, launch_in_app, until

pytestmark = pytest.mark.slow  # see pyproject.toml's markers: not in the fast inner loop

SIZE = (120, 40)
LONG = {"train.max_steps": 100000, "train.ckpt_interval": 100000, "train.eval_interval": 100000,
        "train.sample_tokens": 0, "train.log_interval": 1}  # fmt: skip


def micro(dataset: Path, **over):
    return resolve("micro", overrides={"data.path": str(dataset), "speed.device": "cpu", **LONG, **over})


def record_notes(app: GPT2App) -> list[str]:
    """Every notification the app shows from now on (screens notify through the app)."""
    notes: list[str] = []
    original = app.notify

    def notify(message, *args, **kwargs):
        notes.append(str(message))
        return original(message, *args, **kwargs)

    app.notify = notify  # type: ignore[method-assign]
    return notes


def events(run_dir: Path) -> list[dict]:
    return [json.loads(ln) for ln in (run_dir / rundir.EVENTS).read_text().splitlines() if ln.strip()]


def text(widget) -> str:
    return str(widget.render())


def stop_in_app(app: GPT2App) -> None:
    """However the test went, the run on the app's thread ends (never left training on the shared CPU)."""
    session = app.session
    if session is not None and session.thread is not None:
        session.control.stop()
        session.thread.join(WAIT_S)
        assert not session.thread.is_alive()


async def open_switches(pilot, app: GPT2App) -> ToggleScreen:
    await pilot.press("o")
    await until(pilot, lambda: isinstance(app.screen, ToggleScreen), "the switches screen")
    await pilot.pause()
    return app.screen


async def turn_preload_off(pilot, app: GPT2App) -> None:
    screen = await open_switches(pilot, app)
    assert screen.query_one("#sw-data-prefetch", Switch).disabled  # on CPU the batch is built inline
    preload = screen.query_one("#sw-data-preload", Switch)
    assert preload.value is True and not preload.disabled
    preload.value = False
    await pilot.pause()
    said = text(screen.query_one("#toggle-verdict")).splitlines()
    assert said[0].startswith("memory: fits: peak") and said[1] == "Apply: preload on -> off"
    await pilot.click("#apply")
    await until(pilot, lambda: not isinstance(app.screen, ToggleScreen), "the screen dismissed")


async def check_toggled(pilot, app: GPT2App, dash: DashboardScreen, notes: list[str]) -> int:
    """The toggle took: a segment from step N, the table's second row, the markers, the toasts."""
    state = app.session.state
    await until(pilot, lambda: any(e.reason == "toggle" for e in state.segment_events), "the toggle's segment event")
    (seg,) = [e for e in state.segment_events if e.reason == "toggle"]
    assert seg.changed == {"data.preload": [True, False]}
    await until(pilot, lambda: state.step > seg.step + 2, "steps of the new segment")
    assert "applies at the next step boundary: preload on -> off" in notes
    await until(pilot, lambda: f"segment from step {seg.step}: preload on -> off (toggle)" in notes, "the toast")

    dash.query_one("#tabs").active = "tab-segments"
    table = dash.query_one("#segments", SegmentTable)
    await until(pilot, lambda: len(table.rows_shown) == 2, "two segment rows")
    assert [(r.segment.from_step, r.segment.reason) for r in table.rows_shown] == [(0, "start"), (seg.step, "toggle")]
    assert table.row_count == 2

    dash.query_one("#tabs").active = "tab-charts"
    for chart_id in ("#chart-steptime", "#chart-toks"):
        chart = dash.query_one(chart_id, MetricChart)
        await until(pilot, lambda c=chart: bool(c.markers_drawn), f"the marker on {chart_id}")
        assert chart.markers_drawn == [(float(seg.step), "preload on -> off")]
    return seg.step


def check_continued(run_dir: Path, at: int) -> None:
    """One run in the file: steps 1, 2, ... each once, the new segment starting where the old stopped."""
    evs = events(run_dir)
    steps = [e["step"] for e in evs if e["event"] == "step"]
    assert steps == list(range(1, len(steps) + 1)) and steps[-1] > at
    starts = [e["start_step"] for e in evs if e["event"] == "run_started"]
    assert starts == [0, at]
    segs = [(e["step"], e["reason"]) for e in evs if e["event"] == "segment"]
    assert segs == [(0, "start"), (at, "toggle")]
    assert rundir.load_config(run_dir).data.preload is False
    assert not (run_dir / rundir.MAILBOX).exists()


def test_toggle_an_in_app_run(tiny_dataset: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "in-app"

    app = GPT2App(micro(tiny_dataset))

    async def go() -> int:
        async with app.run_test(size=SIZE) as pilot:
            notes = record_notes(app)
            dash = await launch_in_app(pilot, app, run_dir, steps=3)
            assert app.session.mode == "in-process"
            await turn_preload_off(pilot, app)
            return await check_toggled(pilot, app, dash, notes)

    try:
        at = asyncio.run(go())
    finally:
        stop_in_app(app)
    check_continued(run_dir, at)


def test_toggle_a_detached_run_from_an_attached_dashboard(tiny_dataset: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "detached"
    flags = [f"--{k.split('.')[1].replace('_', '-')}={v}" for k, v in LONG.items()]
    cmd = [sys.executable, "-m", "engine.cli", "train", "--preset", "micro", "--data", str(tiny_dataset),
           "--device", "cpu", "--out", str(run_dir), *flags]  # fmt: skip
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip

    async def go() -> int:
        app = GPT2App(attach_dir=run_dir)
        async with app.run_test(size=SIZE) as pilot:
            notes = record_notes(app)
            dash = app.screen
            await until(pilot, lambda: app.session.state.step >= 3, "steps tailed")
            await until(pilot, lambda: f"steering pid {proc.pid}" in text(dash.query_one("#status")), "steerable")
            await turn_preload_off(pilot, app)
            at = await check_toggled(pilot, app, dash, notes)
            await pilot.press("q", "y")
            await until(pilot, lambda: app.session.state.state == "stopped", "stopped by SIGTERM")
        return at

    try:
        end = time.monotonic() + WAIT_S
        while not (run_dir / rundir.EVENTS).exists() and time.monotonic() < end and proc.poll() is None:
            time.sleep(0.1)
        at = asyncio.run(go())
        assert proc.wait(timeout=WAIT_S) == 0
    finally:  # never leave our child training on the shared CPU
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    check_continued(run_dir, at)


def test_a_set_that_does_not_fit_or_changes_nothing_is_refused_and_nothing_written(
    tiny_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The budget lies between the run's micro-batch 2 x 2 and 4 x 1 (same tokens per step):
    4 x 1 is refused on screen with the fix in words, and no request reaches the run."""
    run_dir = tmp_path / "refused"
    config = micro(tiny_dataset, **{"train.batch_size": 2, "train.grad_accum": 2})
    bound, _ = open_data(config)
    now = memory.estimate(bound).peak_bytes
    bigger = memory.estimate(memory.with_batch(bound, 4, 1)).peak_bytes
    assert bigger > now
    monkeypatch.setattr(device, "budget", lambda kind, held=None: ((now + bigger) // 2, "RAM available"))

    app = GPT2App(config)

    async def go() -> None:
        async with app.run_test(size=SIZE) as pilot:
            notes = record_notes(app)
            await launch_in_app(pilot, app, run_dir, steps=3)
            screen = await open_switches(pilot, app)
            verdict = screen.query_one("#toggle-verdict")
            await pilot.click("#apply")  # nothing changed yet
            await pilot.pause()
            assert isinstance(app.screen, ToggleScreen) and notes[-1].startswith("not applied: nothing changed")

            pair = screen.query_one("#sw-train-batch-size", Select)
            assert pair.value == "2 x 2" and ("4 x 1", "4 x 1") in [(str(p), v) for p, v in pair._options]
            pair.value = "4 x 1"
            await pilot.pause()
            assert "does not fit" in text(screen.query_one("#toggle-memory"))
            said = text(verdict).splitlines()[-1]
            assert said.startswith("cannot apply: the new set needs") and "micro-batch 2 x grad accum 2" in said
            assert "--" not in said  # words, not flags
            await pilot.click("#apply")
            await pilot.pause()
            assert isinstance(app.screen, ToggleScreen) and notes[-1] == f"not applied: {said.removeprefix('cannot apply: ')}"
            assert not (run_dir / rundir.MAILBOX).exists()

            await pilot.press("escape")
            state = app.session.state
            seen = state.step
            await until(pilot, lambda: state.step > seen + 3, "training on")
            assert [e.reason for e in state.segment_events] == ["start"]

    try:
        asyncio.run(go())
    finally:
        stop_in_app(app)
    assert not (run_dir / rundir.MAILBOX).exists()
    assert [e["reason"] for e in events(run_dir) if e["event"] == "segment"] == ["start"]
    assert rundir.load_config(run_dir).train.batch_size == 2
