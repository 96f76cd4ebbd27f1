"""The headline scene (issue 15): toggle a live run and watch the compile warm-up settle.

- both the loss and the s/step chart are on the dashboard's first screen at 120x40 and at
  80x24, and thinning a series for a chart keeps each bucket's envelope (min and max), so
  the compile step's spike never vanishes; values a zoom cuts off get an off-scale mark;
- a run that died (kill -9) says WRITER GONE within seconds on the dashboard that launched it;
- a toggle posted but not yet taken shows as pending on the Switches screen, and the same
  change again is refused there;
- keys typed into the setup form from its first paint all reach their field, in order.

The apps run for real (Pilot); waits are bounded polls (tests/harness.py).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tui.app import GPT2App
from tui.screens.dashboard import DashboardScreen
from tui.widgets.charts import MetricChart, off_scale, thin
from harness import until

DATA = Path(__file__).parents[1] / "data"


# ------------------------------------------------------------------ item 2: the charts that matter


@pytest.mark.parametrize("size", [(120, 40), (80, 24)])
def test_loss_and_step_time_charts_are_on_the_first_screen(size: tuple[int, int], monkeypatch: pytest.MonkeyPatch) -> None:
    """Without scrolling, both charts lie wholly inside the charts' view, and are tall enough
    to read (the recorded 30-step nano run, tests/data/tui-run)."""
    monkeypatch.chdir(DATA)

    async def go() -> None:
        app = GPT2App(attach_dir=Path("tui-run"))
        async with app.run_test(size=size) as pilot:
            await until(pilot, lambda: isinstance(app.screen, DashboardScreen) and app.session.state.finished, "the run read")
            await pilot.pause(0.6)
            view = app.screen.query_one("#charts-scroll").region
            assert view.bottom <= size[1] and view.height > 0
            for chart_id in ("#chart-loss", "#chart-steptime"):
                chart = app.screen.query_one(chart_id, MetricChart)
                r = chart.region
                assert r.height >= 10, (chart_id, r)
                assert view.y <= r.y and r.bottom <= view.bottom and r.x >= 0 and r.right <= size[0], (chart_id, r, view)
                assert chart._drawn is not None, f"{chart_id} not drawn"

    asyncio.run(go())


def test_thinning_keeps_the_compile_spike_at_every_length() -> None:
    """One 18.7 s step among 2 s ones, anywhere in a series of any length, survives thinning to
    any budget; so does the dip of the lowest value; at most about n points remain."""
    for length in range(1, 400):
        for pos in {0, length // 3, length - 1}:
            ys = [2.0 + 0.01 * (i % 7) for i in range(length)]
            ys[pos] = 18.7
            if length > 2:
                ys[(pos + length // 2) % length] = 0.5
            xs = list(range(length))
            for n in (2, 3, 10, 50, 240):
                tx, ty = thin(xs, ys, n)
                assert 18.7 in ty, (length, pos, n)
                assert min(ty) == min(ys) and tx[-1] == xs[-1] and tx[0] == 0, (length, pos, n)
                assert len(tx) <= max(n, 2) + 2, (length, n, len(tx))
                assert all(ys[x] == y for x, y in zip(tx, ty)) and tx == sorted(tx)


def test_values_cut_off_by_a_zoom_get_an_off_scale_mark() -> None:
    xs = list(range(100))
    ys = [2.0] * 100
    ys[3], ys[4], ys[50] = 18.7, 12.0, 0.1
    clamped, marks = off_scale(xs, ys, 1.0, 3.0)
    assert max(clamped) == 3.0 and min(clamped) == 1.0
    assert marks == [(3, 3.0, "▲18.7"), (50, 1.0, "▼0.1")]


# ------------------------------------------------------------------ item 3: a dead writer, seen


LONG = {"train.max_steps": 100000, "train.ckpt_interval": 100000, "train.eval_interval": 100000,
        "train.sample_tokens": 0, "train.log_interval": 1}  # fmt: skip
GONE_WITHIN_S = 5.0


@pytest.mark.slow
def test_the_dashboard_that_launched_a_run_says_writer_gone_after_kill_9(tiny_dataset: Path, tmp_path: Path) -> None:
    """F5's kind of run (its own process, launched by this app): kill -9 of that process turns
    the dashboard's state from RUNNING to WRITER GONE within a few seconds, with the elapsed
    time stopped at the last event and no ETA."""
    from harness import micro_config

    run_dir = tmp_path / "own"
    config = micro_config(tiny_dataset, **LONG)

    async def go() -> None:
        app = GPT2App()
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            app.launch(config, run_dir, detached=True)
            await until(pilot, lambda: isinstance(app.screen, DashboardScreen), "the dashboard")
            session = app.session
            state = session.state
            try:
                await until(pilot, lambda: state.step >= 2 and state.state == "running", "steps tailed")
                status = app.screen.query_one("#status")
                assert "RUNNING" in str(status.render())
                os.kill(session.process.pid, signal.SIGKILL)
                killed = time.monotonic()
                await until(pilot, lambda: session.state.state == "writer gone", "the writer seen gone", timeout=30)
                took = time.monotonic() - killed
                await until(pilot, lambda: "WRITER GONE" in str(status.render()), "the status line", timeout=5)
                assert took <= GONE_WITHIN_S, f"WRITER GONE after {took:.1f} s"
                assert session.state.eta() is None
                assert session.state.elapsed() == session.state.elapsed(time.time() + 100)  # stopped
            finally:
                if session.process.poll() is None:
                    session.process.kill()
                    session.process.wait()

    asyncio.run(go())


@pytest.mark.slow
def test_an_attached_dashboard_says_writer_gone_after_kill_9(tiny_dataset: Path, tmp_path: Path) -> None:
    """The same rule for a run attached to (started from a shell): its lock's holder."""
    run_dir = tmp_path / "theirs"
    cmd = [sys.executable, "-m", "engine.cli", "train", "--preset", "micro", "--data", str(tiny_dataset),
           "--out", str(run_dir), "--max-steps", "100000", "--ckpt-interval", "100000", "--eval-interval", "100000"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip

    async def go() -> None:
        app = GPT2App(attach_dir=run_dir)
        async with app.run_test(size=(120, 40)) as pilot:
            state = app.session.state
            await until(pilot, lambda: state.step >= 2, "steps tailed")
            assert app.session.state.state == "running"
            proc.kill()
            proc.wait()
            killed = time.monotonic()
            await until(pilot, lambda: app.session.state.state == "writer gone", "the writer seen gone", timeout=30)
            assert time.monotonic() - killed <= GONE_WITHIN_S

    try:
        deadline = time.monotonic() + 180
        while not (run_dir / "writer.pid").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the headless run did not start"
            time.sleep(0.1)
        asyncio.run(go())
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# ------------------------------------------------------------------ item 1: a pending toggle, seen


@pytest.mark.slow
def test_a_toggle_posted_but_not_yet_applied_shows_as_pending_and_is_not_asked_twice(tmp_path: Path) -> None:
    """A run of ours (this process holds its lock, so `o` posts to its mailbox) that has not
    reached its next step boundary yet: after Apply, `o` again shows the change as pending, and
    the same change again is refused on screen, no second request posted; once the run
    acknowledges the request in its events, it is no longer pending."""
    import json
    import shutil

    from textual.widgets import Switch

    from engine import events as ev
    from engine import rundir
    from tui.screens.toggle import ToggleScreen

    run_dir = tmp_path / "ours"
    shutil.copytree(DATA / "tui-run", run_dir)
    lines = (run_dir / rundir.EVENTS).read_text().splitlines(keepends=True)
    (run_dir / rundir.EVENTS).write_text("".join(ln for ln in lines if '"run_finished"' not in ln))
    mailbox = run_dir / rundir.MAILBOX

    def asked() -> list[dict]:
        return [json.loads(ln) for ln in mailbox.read_text().splitlines()] if mailbox.exists() else []

    notes: list[str] = []

    async def open_switches(pilot, app) -> ToggleScreen:
        await pilot.press("o")
        await until(pilot, lambda: isinstance(app.screen, ToggleScreen), "the switches screen")
        await pilot.pause()
        return app.screen

    async def go() -> None:
        app = GPT2App(attach_dir=run_dir)
        original = app.notify
        app.notify = lambda message, *a, **k: (notes.append(str(message)), original(message, *a, **k))[1]  # type: ignore[method-assign]
        async with app.run_test(size=(120, 40)) as pilot:
            state = app.session.state
            await until(pilot, lambda: state.step >= 30 and "steering pid" in str(app.screen.query_one("#status").render()),
                        "the run read, steerable")  # fmt: skip
            screen = await open_switches(pilot, app)
            assert not screen.query("#toggle-pending")
            screen.query_one("#sw-data-preload", Switch).value = False
            await pilot.pause()
            await pilot.press("a")
            await until(pilot, lambda: not isinstance(app.screen, ToggleScreen), "applied")
            assert [r["switches"] for r in asked()] == [{"data.preload": False}]

            screen = await open_switches(pilot, app)  # before the run's next step boundary
            pending = str(screen.query_one("#toggle-pending").render())
            assert "preload on -> off (pending)" in pending, pending
            screen.query_one("#sw-data-preload", Switch).value = False
            await pilot.pause()
            verdict = str(screen.query_one("#toggle-verdict").render())
            assert "already pending: preload on -> off (pending)" in verdict, verdict
            await pilot.press("a")
            await pilot.pause()
            assert isinstance(app.screen, ToggleScreen) and any("already pending" in n for n in notes), notes
            assert len(asked()) == 1  # no second request
            await pilot.press("escape")

            rid = asked()[0]["id"]  # the run takes it: its acknowledgement ends the pending state
            ack = ev.RequestAck(step=30, id=rid, kind="toggle", status="dropped", reason="test")
            with open(run_dir / rundir.EVENTS, "a") as f:
                f.write(ack.model_dump_json() + "\n")
            await until(pilot, lambda: not state.pending_toggles, "the acknowledgement read")
            screen = await open_switches(pilot, app)
            assert not screen.query("#toggle-pending")

    rundir.claim_writer(run_dir)  # this process writes the run: its mailbox is read (by nobody, here)
    try:
        asyncio.run(go())
    finally:
        rundir.release_writer(run_dir)


# ------------------------------------------------------------------ item 4: keys typed early


def burst(app, keys: list[str]) -> None:
    """Keys as a terminal delivers a fast burst: all read at once, none waiting for the one
    before to be handled (Pilot's press waits for each; a typist does not)."""
    from textual import events

    for k in keys:
        app.post_message(events.Key(k, {"tab": "\t", "backspace": "\x7f"}.get(k, k)))


@pytest.mark.parametrize("split", [False, True], ids=["complete-form", "first-paint-split"])
def test_keys_typed_from_the_first_paint_reach_their_field_in_order(split: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tab Tab Z right at startup, then 8 backspaces and "65536" in one burst: every key lands
    in the field the Tabs reached (the dataset), in order: "65536". Also with the form's first
    paint split as a real terminal gets it (stand-in selects, rows mounted after the frame)."""
    import tui.screens.setup as setup
    from engine.config import resolve

    monkeypatch.setattr(setup, "paint_first", lambda headless: split)

    async def go() -> None:
        app = GPT2App(resolve("nano"))
        async with app.run_test(size=(120, 40)) as pilot:
            burst(app, ["tab", "tab", "Z"])
            burst(app, ["backspace"] * 8 + list("65536"))
            await until(pilot, lambda: app.screen.query("#dataset") and app.screen.query_one("#dataset").value == "65536",
                        "the burst typed into the dataset field", timeout=10)  # fmt: skip
            await pilot.pause(0.5)
            assert app.screen.focused is app.screen.query_one("#dataset")
            assert app.screen.query_one("#dataset").value == "65536"

    asyncio.run(go())


# ------------------------------------------------------------------ item 5: the data-stall advice


@pytest.mark.parametrize("preload,device,want,never", [
    (True, "cpu", "preload is on; prefetch does nothing on CPU", "--prefetch"),
    (False, "cpu", "try --preload)", "--prefetch"),
    (True, "cuda:0", "preload is on", "--preload"),
])  # fmt: skip
def test_the_data_stall_alert_advises_only_what_can_help(preload: bool, device: str, want: str, never: str) -> None:
    from engine import events as ev
    from tui.models.runstate import RunState

    s = RunState()
    cfg = {"train": {"max_steps": 100, "batch_size": 1, "grad_accum": 1}, "data": {"preload": preload, "prefetch": True,
           "pin_memory": True}}  # fmt: skip
    s.feed(ev.RunStarted(config=cfg, n_params=1, device=device, device_name="X", precision="fp32", flops_per_token=1))
    s.feed(ev.Step(step=1, loss=5.0, lr=1e-3, grad_norm=0.5, step_time_s=1.0, data_time_s=0.5, tokens_per_s=1.0,
                   mfu=None, mem_bytes=None, tokens=1))  # fmt: skip
    (alert,) = [ln.text for ln in s.log if "data loading" in ln.text]
    assert want in alert and never not in alert, alert
