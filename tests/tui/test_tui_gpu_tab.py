"""The `gpu` event and the dashboard's GPU tab: recorded readings in a run's events.jsonl
reach the GpuPanel of an attached dashboard; a run without any, on a machine without NVML,
shows the one "not available" line. The event is silent in the log and on the console.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from textual.widgets import Static

from engine import events as ev
from engine import rundir
from engine.gpu_monitor import GpuEvent, GpuSample, available
from engine.text import describe
from tui.app import GPT2App
from tui.models.runstate import RunState
from tui.screens.dashboard import DashboardScreen
from tui.widgets.gpu_panel import GpuPanel
from pilot_wait import WAIT_S, until  # noqa: F401

SIZE = (120, 40)




def rounds(n: int = 4) -> list[list[GpuSample]]:
    return [[GpuSample(t=1000.0 + k, index=0, name="NVIDIA H100", util_pct=90.0 + k, mem_used_bytes=(40 + k) * 2**30,
                       mem_total_bytes=80 * 2**30, power_w=600.0, temp_c=60.0, sm_clock_mhz=1980)]
            for k in range(n)]  # fmt: skip


def write_run(root: Path, gpus: bool) -> Path:
    d = root / ("gpu-run" if gpus else "cpu-run")
    d.mkdir(parents=True)
    (d / rundir.CONFIG).write_text('preset = "nano"\n')
    cfg = {"preset": "nano", "model": {"vocab_size": 8192}, "train": {"max_steps": 10, "batch_size": 1, "grad_accum": 1,
           "block_size": 8}, "optim": {"grad_clip": 1.0}}  # fmt: skip
    lines = [ev.RunStarted(time=1000.0, config=cfg, n_params=1, device="cuda" if gpus else "cpu",
                           device_name="GPU" if gpus else "CPU", precision="bf16", flops_per_token=1).model_dump_json()]
    if gpus:
        lines += [GpuEvent(time=1000.0 + k, gpus=r).model_dump_json() for k, r in enumerate(rounds())]
    lines.append(ev.RunFinished(time=1010.0, step=10).model_dump_json())
    (d / rundir.EVENTS).write_text("\n".join(lines) + "\n")
    return d


def test_gpu_event_parses_and_is_silent() -> None:
    line = GpuEvent(gpus=rounds(1)[0]).model_dump_json()
    e = ev.parse_event(line)
    assert isinstance(e, ev.Gpu) and e.gpus[0].util_pct == 90.0
    assert describe(e) == ""
    state = RunState()
    v = state.version
    for r in rounds(3):
        state.feed(ev.Gpu(gpus=r))
    assert state.version == v and state.log_count == 0  # no chart redraw, no log line
    assert [r[0].util_pct for r in state.gpu_since(1)] == [91.0, 92.0]


def gpu_status(app) -> str:
    return str(app.screen.query_one("#gpu", GpuPanel).query_one("#gpu-status", Static).render())


def test_attached_run_shows_its_recorded_gpu_readings(tmp_path: Path) -> None:
    run = write_run(tmp_path, gpus=True)

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
    run = write_run(tmp_path, gpus=False)
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
