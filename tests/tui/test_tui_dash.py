"""The dashboard as a user drives it (issue 13, items 2, 5, 6, 7, 11 and the live tail):
steering an own run from a re-attached dashboard and watching others', no false clip
alert on a default nano run, a state and a spinner for each long phase, somewhere to go
once a run ends, charts that hide nothing, and a tail that survives a truncated log.

The apps run for real: real tiny runs (micro on the tiny dataset; the default dataset
built in a fresh cache) and real recorded events (tests/data/nano-150: the first 150
steps of a default nano run on the embedded corpus, CPU). Waits are bounded polls.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from textual.widgets import Input, RichLog

from engine import events as ev
from engine import rundir
from engine.config import resolve
from tui.app import GPT2App
from tui.models.runstate import RunState
from tui.screens.dashboard import DashboardScreen, status_text
from tui.screens.run_end import ResumeScreen, RunEndScreen
from tui.screens.runs import RunsScreen
from tui.screens.setup import SetupScreen
from tui.models.tail import EventTail
from tui.widgets.charts import MetricChart
from harness import WAIT_S, until

SIZE = (120, 40)
DATA = Path(__file__).parents[1] / "data"
NANO = DATA / "nano-150"  # default nano settings (warmup 50, clip 1.0, lr 2e-3), 150 steps


def status(app) -> str:
    return str(app.screen.query_one("#status").render())


def footer(app) -> dict[str, str]:
    """key -> action of what the footer offers now."""
    return {k: b.binding.action for k, b in app.screen.active_bindings.items() if b.binding.show}


def headless(run_dir: Path, dataset: Path, *extra: str) -> subprocess.Popen:
    """A detached run, as F5 starts it or a user does from a shell: the headless CLI in its own session."""
    cmd = [sys.executable, "-m", "engine.cli", "train", "--preset", "micro", "--data", str(dataset),
           "--out", str(run_dir), *extra]  # fmt: skip
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip


def kill(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()


def copy_run(src: Path, dst: Path, *, finished: bool = True) -> Path:
    shutil.copytree(src, dst)
    if not finished:
        lines = (dst / rundir.EVENTS).read_text().splitlines(keepends=True)
        (dst / rundir.EVENTS).write_text("".join(ln for ln in lines if '"run_finished"' not in ln))
    return dst


# ------------------------------------------------------------------------------ item 2: steering


@pytest.mark.slow
def test_reattached_dashboard_steers_an_own_detached_run(tiny_dataset: Path, tmp_path: Path) -> None:
    """The run goes on in its own process after the app that launched it quit; `attach`
    reaches it through its mailbox, the writer pid it recorded holding its lock: pause, save
    (while paused), stop."""
    run_dir = tmp_path / "own"
    proc = headless(run_dir, tiny_dataset, "--max-steps", "100000", "--ckpt-interval", "100000")

    async def go() -> None:
        app = GPT2App(attach_dir=run_dir)
        async with app.run_test(size=SIZE) as pilot:
            state = app.session.state
            await until(pilot, lambda: state.step >= 2, "steps tailed")
            await until(pilot, lambda: f"steering pid {proc.pid}" in status(app), "the writer named")
            assert {"p": "pause", "s": "save", "q": "stop"}.items() <= footer(app).items()
            app.screen.query_one("#tabs").active = "tab-ckpt"
            due = app.screen.query_one("#ckpt-due")
            await until(pilot, lambda: "first checkpoint due at step 100000" in str(due.render()), "when it is due")
            await pilot.press("p")
            await until(pilot, lambda: state.paused, "paused by a mailbox request")
            await pilot.press("s")
            await until(pilot, lambda: len(state.checkpoints) == 1, "saved by a mailbox request, while paused")
            await pilot.press("p")
            await until(pilot, lambda: not state.paused, "resumed")
            await pilot.press("q", "y")
            if state.live:  # until run_finished comes: STOPPING (eval + sample + checkpoint)
                assert "STOPPING" in status_text(state, app.session)
            await until(pilot, lambda: state.state == "stopped", "stopped by a mailbox request, with a checkpoint")
            assert footer(app)["q"] == "next" and "p" not in footer(app)

    try:
        deadline = time.monotonic() + WAIT_S
        while not (run_dir / rundir.WRITER).exists():  # the run has started (a later attach, as a user would)
            assert proc.poll() is None and time.monotonic() < deadline, "the headless run did not start"
            time.sleep(0.1)
        asyncio.run(go())
        assert proc.wait(timeout=WAIT_S) == 0
    finally:
        kill(proc)
    assert json.loads((run_dir / rundir.EVENTS).read_text().splitlines()[-1])["reason"] == "stopped"


@pytest.mark.slow
def test_others_runs_are_watch_only_and_the_footer_says_why(tmp_path: Path) -> None:
    """Another host's writer, or a live process that does not hold the run's lock (so reads
    no mailbox), leave the run watch-only: no p/s/q in the footer, the reason and pid shown."""
    run_dir = copy_run(DATA / "tui-run", tmp_path / "theirs", finished=False)

    def attach_with_writer(record: str) -> tuple[str, dict[str, str]]:
        (run_dir / rundir.WRITER).write_text(record + "\n")

        async def go() -> tuple[str, dict[str, str]]:
            app = GPT2App(attach_dir=run_dir)
            async with app.run_test(size=SIZE) as pilot:
                await until(pilot, lambda: "watch only" in status(app), "the steering verdict")
                await pilot.press("p", "s", "q")  # nothing happens, nothing breaks
                return status(app), footer(app)

        return asyncio.run(go())

    text, keys = attach_with_writer("elsewhere.example 4242")
    assert "watch only: written by pid 4242 on elsewhere.example, another host" in text
    assert not {"p", "s", "q"} & keys.keys()
    # a live process of ours that is not the run's writer (a recycled pid, a stale record)
    deaf = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        text, keys = attach_with_writer(f"{socket.gethostname()} {deaf.pid}")
    finally:
        deaf.kill()
        deaf.wait()
    # nobody holds the lock, so the run is not running whatever pid writer.pid names (issue 21 item 8)
    assert f"watch only: pid {deaf.pid} does not hold the run's lock" in text and "WRITER GONE" in text
    assert not {"p", "s", "q"} & keys.keys()


# ------------------------------------------------------------------------------ items 5 and 11


def test_default_nano_run_no_false_clip_alert_and_charts_hide_nothing(tmp_path: Path) -> None:
    """A default nano run's grad norm sits at or above the clip through warmup and just
    after; that is healthy and must raise no alert. The loss legend keeps its rows free of
    data (the curve starts at the top left, with the step-0 val point); MFU and memory,
    not measured on a CPU, give way to one line saying so."""
    run_dir = copy_run(NANO, tmp_path / "nano")

    async def go() -> None:
        app = GPT2App(attach_dir=run_dir)
        async with app.run_test(size=SIZE) as pilot:
            state = app.session.state
            await until(pilot, lambda: state.finished is not None, "the run read")
            assert state.step == 150 and not [ln.text for ln in state.log if "ALERT" in ln.text]
            log = app.screen.query_one("#log", RichLog)
            await until(pilot, lambda: len(log.lines) > 0, "the log drawn")
            assert not any("at the clip" in line.text for line in log.lines)

            chart = app.screen.query_one("#chart-loss", MetricChart)
            await until(pilot, lambda: chart._drawn is not None and chart._drawn[0] == state.version, "loss drawn")
            rows = re.sub(r"\x1b\[[0-9;]*m", "", chart.plt.build()).splitlines()
            legend = [r for r in rows if re.search(r" (raw|EMA|val)\b", r)]
            assert len(legend) == 3
            for r in legend:  # right of the legend entry: no data on its row
                rest = re.split(r" (?:raw|EMA|val)", r, maxsplit=1)[1]
                assert not re.search("[\u2801-\u28ff•]", rest), r
            dots = sum(r.count("•") for r in rows) - 2  # the legend's own sample is two dots
            assert dots >= len(state.val) == 4  # every val point visible, step 0's included

            line = str(app.screen.query_one("#unmeasured").render())
            assert "MFU %: not measured on this device" in line and "memory GiB: not measured on this device" in line
            assert not app.screen.query_one("#chart-mfu").display and not app.screen.query_one("#chart-mem").display

    asyncio.run(go())


def test_clip_alert_still_fires_when_pinned_past_warmup() -> None:
    events, _ = ev.read_events(NANO / rundir.EVENTS)
    started = next(e for e in events if isinstance(e, ev.RunStarted))
    s = RunState()
    s.feed(started)
    for i in range(1, 200):  # warmup 50 at norm 3, then 50 reports pinned at 3: the lr is too high
        s.feed(ev.Step(step=i, loss=5.0, lr=2e-3, grad_norm=3.0, step_time_s=0.1, tokens_per_s=1.0, mfu=None,
                       mem_bytes=None, tokens=i))  # fmt: skip
        if i == 99:
            assert not [ln for ln in s.log if "at the clip" in ln.text]
    assert [ln.text for ln in s.log if "at the clip" in ln.text] == [
        "ALERT step 100: grad norm at the clip (1.0) for 50 reports after warmup: lr may be too high"
    ]


# ------------------------------------------------------------------------------ item 6: phases


def test_compile_warmup_shows_compiling_until_the_first_step(tmp_path: Path) -> None:
    run_dir = tmp_path / "compiling"
    run_dir.mkdir()
    shutil.copy(DATA / "tui-run" / rundir.CONFIG, run_dir)
    lines = (DATA / "tui-run" / rundir.EVENTS).read_text().splitlines(keepends=True)
    started = json.loads(lines[0])
    started["config"]["speed"]["compile"] = True
    (run_dir / rundir.EVENTS).write_text(json.dumps(started) + "\n")
    rundir.claim_writer(run_dir)  # alive: this process holds the run's lock (the one liveness rule)
    step = next(ln for ln in lines if '"event":"step"' in ln)

    async def go() -> None:
        app = GPT2App(attach_dir=run_dir)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: "COMPILING" in status(app), "the compile warm-up shown")
            assert "torch.compile warm-up" in status(app)
            with open(run_dir / rundir.EVENTS, "a") as f:
                f.write(step)
            await until(pilot, lambda: status(app).startswith("RUNNING"), "running once a step is logged")

    try:
        asyncio.run(go())
    finally:
        rundir.release_writer(run_dir)


@pytest.mark.slow
def test_first_run_builds_the_dataset_visibly_then_the_end_offers_the_form(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first run on the embedded corpus builds it (seconds): BUILDING DATASET with a
    spinner, not `WAITING step 0/?`. Once the run is over, q offers what next; f goes back
    to the form, filled in with the run's config."""
    monkeypatch.setenv("GPT2_TUI_CACHE", str(tmp_path / "fresh-cache"))  # nothing built yet
    run_dir = tmp_path / "first"
    config = resolve("micro", overrides={"train.max_steps": 3, "train.eval_interval": 3, "train.ckpt_interval": 3})

    async def go() -> None:
        app = GPT2App(config)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: isinstance(app.screen, SetupScreen), "the form")
            app.screen.query_one("#run-dir", Input).value = str(run_dir)
            await until(pilot, lambda: not app.screen.query_one("#launch").disabled, "the form checked")
            await pilot.press("f6")
            await until(pilot, lambda: isinstance(app.screen, DashboardScreen), "the dashboard")
            await until(pilot, lambda: "BUILDING DATASET" in status(app), "the build shown")
            assert "WAITING" not in status(app) and "step 0/?" not in status(app)
            state = app.session.state
            seen: set[str] = set()  # every status line drawn meanwhile: the build says what it does, how far
            await until(pilot, lambda: seen.add(status(app)) or state.state == "completed", "the run over")
            building = [s for s in seen if "BUILDING DATASET" in s]
            assert any("8192-token BPE" in s for s in building), building
            assert any(re.search(r"encoding \d+%", s) for s in building), building
            await pilot.press("q")
            await until(pilot, lambda: isinstance(app.screen, RunEndScreen), "what next")
            await pilot.press("f")
            await until(pilot, lambda: isinstance(app.screen, SetupScreen), "back to the form")
            form = app.screen
            await until(pilot, lambda: form.config is not None, "the form validated")
            assert form.config.preset == "micro" and form.config.train.max_steps == 3
            assert form.query_one("#run-dir", Input).value != str(run_dir)  # a new directory

    asyncio.run(go())


# ------------------------------------------------------------------------------ item 7 and F7: resume


@pytest.mark.slow
def test_resume_from_the_runs_screen_and_from_the_end_menu(
    tiny_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    run_dir = Path("runs") / "done"
    assert headless(run_dir, tiny_dataset).wait(timeout=WAIT_S) == 0  # micro: 20 steps

    async def resume_to(pilot, app, steps: int) -> None:
        await until(pilot, lambda: isinstance(app.screen, ResumeScreen), "how far?")
        app.screen.query_one(Input).value = str(steps)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, DashboardScreen), "the resumed run's dashboard")
        state = app.session.state
        await until(pilot, lambda: state.state == "completed" and state.step == steps, f"trained on to {steps}")
        assert app.session.process.wait(timeout=WAIT_S) == 0

    async def go() -> None:
        app = GPT2App()
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            await pilot.press("f7")
            await until(pilot, lambda: isinstance(app.screen, RunsScreen) and app.screen.loaded, "the runs listed")
            await pilot.press("r")
            await resume_to(pilot, app, 25)
            assert len(app.session.state.series["loss"]) == 25  # the history, then the new steps
            await pilot.press("q")
            await until(pilot, lambda: isinstance(app.screen, RunEndScreen), "what next")
            await pilot.press("r")
            await resume_to(pilot, app, 30)
            await pilot.press("q")
            await until(pilot, lambda: isinstance(app.screen, RunEndScreen), "what next")
            await pilot.press("o")
            await until(pilot, lambda: isinstance(app.screen, RunsScreen), "another run to open")

    asyncio.run(go())
    steps = [json.loads(ln) for ln in (tmp_path / run_dir / rundir.EVENTS).read_text().splitlines()]
    assert [e["reason"] for e in steps if e["event"] == "run_finished"] == ["completed"] * 3


# ------------------------------------------------------------------------------ the live tail


def test_tail_starts_over_when_the_file_shrinks(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    lines = [ev.Eval(step=i, val_loss=2.0).model_dump_json() + "\n" for i in range(5)]
    path.write_text("".join(lines))
    tail = EventTail(path)
    assert [e.step for e in tail.read_new()] == [0, 1, 2, 3, 4]
    path.write_text(ev.Eval(step=7, val_loss=1.0).model_dump_json() + "\n")  # truncated, a new first line
    assert [e.step for e in tail.read_new()] == [7] and tail.resets == 1
    assert tail.read_new() == []


def test_attached_dashboard_follows_a_truncated_log(tmp_path: Path) -> None:
    run_dir = copy_run(NANO, tmp_path / "run")

    async def go() -> None:
        app = GPT2App(attach_dir=run_dir)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.session.state.step == 150, "the long log read")
            shutil.copy(DATA / "tui-run" / rundir.EVENTS, run_dir / rundir.EVENTS)  # shorter: 30 steps
            await until(pilot, lambda: "step 30/30" in status(app), "the new log shown from its start")
            assert len(app.session.state.series["loss"]) == 30

    asyncio.run(go())
