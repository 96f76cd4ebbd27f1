"""The TUI driven by Pilot (App.run_test) with the real engine on the micro preset.

Waits are bounded polls on the app's own state (never timed assertions): the CPU is shared.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.train import memory
from engine.config import resolve
from tui.app import GPT2App
from tui.screens.dashboard import DashboardScreen
from tui.screens.setup import SetupScreen, wid
from tui.widgets.charts import MetricChart
from tui.widgets.memory import MemoryPanel
from harness import WAIT_S, until  # noqa: F401

SIZE = (120, 40)




def micro(dataset: Path, **over) -> object:
    return resolve("micro", overrides={"data.path": str(dataset), **over})


async def set_input(pilot, screen, selector: str, text: str) -> None:
    screen.query_one(selector).value = text
    await pilot.pause()


def err_text(screen, dotted: str) -> str:
    """The error line below a field ("" when it shows none; it is mounted when first needed)."""
    found = screen.query("#err-" + wid(dotted))
    return str(found.only_one().render()) if found and found.only_one().display else ""


@pytest.mark.slow
def test_setup_validates_budget_fix_then_launch_in_app_and_watch(tiny_dataset: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"

    async def go() -> None:
        app = GPT2App(micro(tiny_dataset))
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            setup = app.screen
            assert isinstance(setup, SetupScreen)
            await set_input(pilot, setup, "#run-dir", str(run_dir))
            assert "64" in str(setup.query_one("#dataset-info").render())  # tokens/dtype/vocab shown
            assert setup.query_one("#launch").disabled is False

            # refused at the field with pydantic's reason; Launch disabled; nothing written
            await set_input(pilot, setup, "#" + wid("train.batch_size"), "0")
            assert "greater than or equal to 1" in err_text(setup, "train.batch_size")
            assert setup.query_one("#launch").disabled is True
            await set_input(pilot, setup, "#" + wid("optim.lr"), "fast")
            assert "valid number" in err_text(setup, "optim.lr")
            await pilot.press("f5")
            assert not run_dir.exists()
            await set_input(pilot, setup, "#" + wid("optim.lr"), "0.003")
            await set_input(pilot, setup, "#" + wid("train.batch_size"), "4")
            assert err_text(setup, "train.batch_size") == ""
            assert "4 x 1 x 32 = 128 tokens" in str(setup.query_one("#tokens-per-step").render())

            # memory: a budget between batch 1 and batch 2 -> red, refused, F4 fixes it
            cfg = setup.config
            one = memory.estimate(memory.with_batch(cfg, 1, 4)).peak_bytes
            two = memory.estimate(memory.with_batch(cfg, 2, 2)).peak_bytes
            await set_input(pilot, setup, "#mem-budget", str((one + two) // 2))
            panel = setup.query_one(MemoryPanel)
            assert panel.fits is False and panel.has_class("over")
            assert setup.query_one("#launch").disabled is True
            await pilot.press("f4")
            await pilot.pause()
            assert setup.query_one("#" + wid("train.batch_size")).value == "1"
            assert setup.query_one("#" + wid("train.grad_accum")).value == "4"
            assert panel.fits is True and setup.query_one("#launch").disabled is False

            await pilot.press("f6")
            await until(pilot, lambda: isinstance(app.screen, DashboardScreen), "the dashboard")
            dash = app.screen
            state = app.session.state
            await until(pilot, lambda: not state.live, "the run to finish")
            await until(pilot, lambda: "COMPLETED" in str(dash.query_one("#status").render()), "status")
            status = str(dash.query_one("#status").render())
            assert "step 20/20" in status and "MFU unknown" in status  # CPU: no peak, no guess
            assert len(state.series["loss"]) == 20 and len(state.val) >= 2
            loss_chart = dash.query_one("#chart-loss", MetricChart)
            await until(pilot, lambda: loss_chart._drawn is not None and loss_chart._drawn[0] == state.version, "chart")
            await pilot.press("x")  # x-axis -> tokens, and log-y: both redraw without error
            await pilot.press("l")
            await until(pilot, lambda: loss_chart._drawn[1:3] == ("tokens", True), "re-plot")
            dash.query_one("#tabs").active = "tab-ckpt"
            table = dash.query_one("#ckpts")
            await until(pilot, lambda: table.row_count >= 1, "checkpoint rows")
            cells = [str(c) for c in table.get_row_at(0)]
            assert cells[0] == "20" and "latest" in cells[-1]
            assert (run_dir / "events.jsonl").exists() and (run_dir / "checkpoints" / "step_000020.pt").exists()
            cfg_written = (run_dir / "config.toml").read_text()
            assert "batch_size = 1" in cfg_written and "grad_accum = 4" in cfg_written

    asyncio.run(go())


@pytest.mark.slow
def test_pause_save_and_quit_while_running(tiny_dataset: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "long"

    async def go() -> None:
        app = GPT2App(micro(tiny_dataset, **{"train.max_steps": 100000, "train.ckpt_interval": 100000}))
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            await set_input(pilot, app.screen, "#run-dir", str(run_dir))
            await pilot.press("f6")  # in this app's process
            await until(pilot, lambda: isinstance(app.screen, DashboardScreen), "the dashboard")
            assert app.session.mode == "in-process"
            state = app.session.state
            await until(pilot, lambda: state.step >= 3, "a few steps")
            await pilot.press("p")
            await until(pilot, lambda: state.paused, "paused event")
            await until(pilot, lambda: "PAUSED" in str(app.screen.query_one("#status").render()), "PAUSED shown")
            paused_at = state.step
            await pilot.pause(0.5)
            assert state.step == paused_at  # no step while paused
            await pilot.press("p")
            await until(pilot, lambda: not state.paused and state.step > paused_at, "resumed and stepping")
            await pilot.press("s")
            await until(pilot, lambda: len(state.checkpoints) >= 1, "save-now checkpoint")
            await pilot.press("q")  # asks first; "n" leaves it running (q then y: the detached test)
            await pilot.press("n")
            assert state.live and not app.session.control.stop_requested
            # quitting while it runs: stop requested, a bounded wait, and the app is gone
            await pilot.press("ctrl+q")
        assert app.session.control.stop_requested
        app.session.thread.join(WAIT_S)
        assert not app.session.thread.is_alive()
        last = _events(run_dir)[-1]
        assert last["event"] == "run_finished" and last["reason"] == "stopped"
        ckpts = sorted((run_dir / "checkpoints").glob("step_*.pt"))
        assert ckpts[-1].name == f"step_{last['step']:06d}.pt"  # the stop saved the last step

    asyncio.run(go())


def _events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_attach_finished_run(tiny_dataset: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "done"
    cmd = [sys.executable, "-m", "engine.cli", "train", "--preset", "micro", "--data", str(tiny_dataset), "--out", str(run_dir)]
    subprocess.run(cmd, check=True, capture_output=True)

    async def go() -> None:
        app = GPT2App(attach_dir=run_dir)
        async with app.run_test(size=SIZE) as pilot:
            state = app.session.state
            await until(pilot, lambda: state.finished is not None, "the whole file read")
            dash = app.screen
            await until(pilot, lambda: "COMPLETED" in str(dash.query_one("#status").render()), "status")
            assert state.step == 20 and len(state.series["loss"]) == 20
            await pilot.press("p")  # another process's run: refused with a notice, no crash
            dash.query_one("#tabs").active = "tab-ckpt"
            table = dash.query_one("#ckpts")
            await until(pilot, lambda: table.row_count == 2, "both kept checkpoints")

    asyncio.run(go())


@pytest.mark.slow
def test_detached_launch_is_tailed_live_and_stopped(tiny_dataset: Path, tmp_path: Path) -> None:
    """F5 (the default): the headless CLI in its own session; the dashboard tails it while
    it runs, steers it by signals, and q stops it gracefully (SIGTERM: a checkpoint)."""
    run_dir = tmp_path / "detached"

    async def go(holder: list) -> None:
        app = GPT2App(micro(tiny_dataset, **{"train.max_steps": 100000, "train.ckpt_interval": 100000}))
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            await set_input(pilot, app.screen, "#run-dir", str(run_dir))
            await pilot.press("f5")  # the default launch: detached
            await until(pilot, lambda: isinstance(app.screen, DashboardScreen), "the dashboard")
            session = app.session
            holder.append(session)
            assert session.mode == "detached" and session.process is not None
            assert os.getsid(session.process.pid) != os.getsid(0)  # its own session: survives us
            state = session.state
            await until(pilot, lambda: state.step >= 2, "steps tailed from the live file")
            seen = state.step
            await until(pilot, lambda: state.step > seen, "more steps while it runs")
            await pilot.press("p")  # steered through the run's mailbox: pause, then save
            await until(pilot, lambda: state.paused, "paused event tailed")
            await pilot.press("p")
            await until(pilot, lambda: not state.paused, "resumed event tailed")
            await pilot.press("s")
            await until(pilot, lambda: len(state.checkpoints) >= 1, "save-now checkpoint tailed")
            await pilot.press("q")
            await pilot.press("y")
            await until(pilot, lambda: state.state == "stopped", "stopped event tailed")
            assert session.process.wait(timeout=60) == 0

    holder: list = []
    try:
        asyncio.run(go(holder))
    finally:  # never leave our child training on the shared CPU
        proc = holder[0].process if holder else None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
    assert _events(run_dir)[-1]["event"] == "run_finished"


@pytest.mark.slow
def test_bad_attach_and_config_are_one_line(tmp_path: Path) -> None:
    gpt2 = Path(sys.executable).with_name("gpt2-tui")
    for args, needle in (
        (["attach", str(tmp_path / "nope")], "does not exist"),
        (["attach", str(tmp_path)], "not a run directory"),
        (["--config", str(tmp_path / "missing.toml")], "does not exist"),
    ):
        out = subprocess.run([str(gpt2), *args], capture_output=True, text=True, timeout=120)
        assert out.returncode == 2, out.stderr
        assert needle in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_several_gpus_launch_torchrun_and_the_dashboard_names_the_slowest_rank(
    tiny_dataset: Path, tmp_path: Path, monkeypatch
) -> None:
    """With more than one GPU visible the form offers a GPU count; N > 1 launches the
    headless CLI with --nproc N (torchrun; gloo stands in for NCCL on this CPU machine)
    and the dashboard shows the per-rank step times."""
    import dataclasses

    from textual.widgets import Select

    from engine import device as capabilities
    from tui.screens.dashboard import status_text

    two = dataclasses.replace(capabilities.capabilities(), gpus=2)
    monkeypatch.setattr(capabilities, "capabilities", lambda: two)
    run_dir = tmp_path / "two-ranks"

    async def go(holder: list) -> None:
        app = GPT2App(micro(tiny_dataset, **{"train.max_steps": 6, "train.ckpt_interval": 100}))
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            assert app.screen.query_one("#nproc", Select).value == 2
            await set_input(pilot, app.screen, "#run-dir", str(run_dir))
            await pilot.press("f6")  # in-app is one process: refused with the reason
            assert isinstance(app.screen, SetupScreen)
            await pilot.press("f5")
            await until(pilot, lambda: isinstance(app.screen, DashboardScreen), "the dashboard")
            session = app.session
            holder.append(session)
            assert "--nproc" in session.process.args and "2" in session.process.args
            state = session.state
            await until(pilot, lambda: state.state in ("completed", "failed", "stopped"), "the run's end")
            assert state.state == "completed", state.failed
            assert state.started.world_size == 2
            assert "2 ranks: slowest rank" in status_text(state, session)

    holder: list = []
    try:
        asyncio.run(go(holder))
    finally:
        proc = holder[0].process if holder else None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_attach_tells_a_dead_writer_from_a_live_one(tmp_path: Path) -> None:
    """A run whose writer was kill -9'd (events end without run_finished, its writer.pid
    names a dead process) is shown as such, not as running forever."""
    import shutil
    import socket

    from engine import rundir

    run_dir = tmp_path / "orphan"
    shutil.copytree(Path(__file__).parents[1] / "data" / "tui-run", run_dir)
    lines = (run_dir / "events.jsonl").read_text().splitlines(keepends=True)
    (run_dir / "events.jsonl").write_text("".join(l for l in lines if '"run_finished"' not in l))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()

    def status_after_attach(pid: int) -> str:
        (run_dir / rundir.WRITER).write_text(f"{socket.gethostname()} {pid}\n")

        async def go() -> str:
            app = GPT2App(attach_dir=run_dir)
            async with app.run_test(size=SIZE) as pilot:
                state = app.session.state
                await until(pilot, lambda: state.step >= 30, "the file read")
                status = app.screen.query_one("#status")
                await until(pilot, lambda: "step 30" in str(status.render()), "status drawn")
                return str(status.render())

        return asyncio.run(go())

    assert "WRITER GONE" in status_after_attach(dead.pid)
    rundir.claim_writer(run_dir)  # alive: this process holds the run's lock (the one liveness rule)
    try:
        alive = status_after_attach(os.getpid())
    finally:
        rundir.release_writer(run_dir)
    assert "RUNNING" in alive and "WRITER GONE" not in alive
