"""A run the dashboard shows: trained in this process, in a detached process, or attached.

In-process: set-up, compile and training all happen on one daemon thread (torch.compile
is not thread-safe; a Textual thread worker lives in asyncio's default executor, which
the loop joins at exit, so a long step would make quitting hang). Events reach the UI by
a callback that only posts a message (thread-safe, never blocks the trainer).

Detached: the headless CLI in its own session (`start_new_session`), writing the run
directory; the dashboard tails its events.jsonl like any `attach`, and the run survives
the terminal going away.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from engine import events as ev
from engine import rundir
from engine.config import RunConfig
from engine.errors import UserError
from tui.runstate import RunState
from tui.tail import EventTail

CONSOLE_LOG = rundir.LAUNCH_LOG


@dataclass
class RunSession:
    run_dir: Path
    mode: str  # "in-process" | "detached" | "attached"
    state: RunState = field(default_factory=RunState)
    control: Any = None  # engine.control.Control for in-process runs
    thread: threading.Thread | None = None
    process: subprocess.Popen | None = None
    tail: EventTail | None = None
    stopping: bool = False  # a stop was asked for from here: the run saves, then ends
    _config_file: Path | None = None

    @property
    def steerable(self) -> bool:
        """Pause and save-now reach a trainer in this process, or the process we spawned
        (by signals); a run attached from elsewhere is only watched."""
        return self.control is not None or (self.process is not None and self.process.poll() is None)

    def toggle_pause(self) -> bool:
        """Pause or resume; True if a pause was asked for."""
        if self.control is not None:
            if self.control.paused:
                self.control.resume()
                return False
            self.control.pause()
            return True
        from engine.control import PAUSE_SIGNAL

        pausing = not self.state.paused
        os.kill(self.process.pid, PAUSE_SIGNAL)
        return pausing

    def save_now(self) -> None:
        if self.control is not None:
            self.control.save_now()
        else:
            from engine.control import SAVE_SIGNAL

            os.kill(self.process.pid, SAVE_SIGNAL)

    def alive(self) -> bool:
        if self.thread is not None:
            return self.thread.is_alive()
        if self.process is not None:
            return self.process.poll() is None
        return self.state.live

    def poll(self) -> list[Any]:
        """New events from a tailed run (detached or attached); [] for in-process runs."""
        if self.tail is None:
            return []
        events = self.tail.read_new()
        if self.process is not None and self.process.poll() is not None and not self.state.started and not events:
            # the child quit before writing any event: bad input; its one line is in the log
            if not (self.run_dir / rundir.EVENTS).exists() and self.state.failed is None:
                events.append(ev.RunFailed(step=None, error=self.console_tail() or f"exit status {self.process.returncode}"))
        if self._config_file is not None and self.state.started:
            self._config_file.unlink(missing_ok=True)
            self._config_file = None
        return events

    def console_tail(self) -> str:
        log = self.run_dir / CONSOLE_LOG
        try:
            lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return ""
        return lines[-1] if lines else ""

    def request_stop(self) -> None:
        """Graceful: the trainer saves a checkpoint at the next step boundary and ends."""
        self.stopping = True
        if self.control is not None:
            self.control.stop()
        elif self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)

    def shutdown(self, timeout: float = 5.0) -> bool:
        """For quitting the app: stop an in-process run and wait at most `timeout`.
        A detached run is left running (that is what detached is for). True if done."""
        if self.thread is not None and self.thread.is_alive():
            self.control.stop()
            self.thread.join(timeout)
            return not self.thread.is_alive()
        return True


def start_in_process(
    config: RunConfig, run_dir: Path, on_event: Callable[[RunSession, Any], None], threads: int | None = None
) -> RunSession:
    """`threads`: torch intra-op threads set on the trainer thread (a thread's OpenMP team
    is its own; the overhead benchmark pins it so both of its modes run alike)."""
    from engine.control import Control
    from engine.start import start

    rundir.check_new(run_dir)
    session = RunSession(run_dir=run_dir, mode="in-process", control=Control())

    def work() -> None:
        try:
            if threads:
                import torch

                torch.set_num_threads(threads)
            sink = ev.CallbackSink(lambda e: on_event(session, e))
            cfg = config.model_copy(update={"out_dir": str(run_dir)})
            start(cfg, run_dir, sinks=[sink], control=session.control).run()
        except UserError as err:  # bad input found at set-up: one line, nothing written
            on_event(session, ev.RunFailed(step=None, error=str(err)))
        except BaseException:  # the trainer has already emitted run_failed
            pass

    session.thread = threading.Thread(target=work, name="gpt2-tui-trainer", daemon=True)
    session.thread.start()
    return session


def headless_command(config_file: Path, run_dir: Path, nproc: int = 1) -> list[str]:
    """The headless CLI; with nproc > 1 it relaunches itself under torchrun (one rank per GPU)."""
    cmd = [sys.executable, "-m", "engine.cli", "train", "--headless", "--config", str(config_file), "--out", str(run_dir)]
    return cmd + (["--nproc", str(nproc)] if nproc > 1 else [])


def start_detached(config: RunConfig, run_dir: Path, nproc: int = 1) -> RunSession:
    """Spawn the headless CLI on this config in its own session; tail what it writes."""
    rundir.check_new(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix="gpt2-tui-launch-", suffix=".toml")
    with os.fdopen(fd, "w") as f:
        f.write(config.model_copy(update={"out_dir": str(run_dir)}).to_toml())
    log = open(run_dir / CONSOLE_LOG, "ab")
    try:
        proc = subprocess.Popen(
            headless_command(Path(name), run_dir, nproc),
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, cwd=os.getcwd(),
        )  # fmt: skip
    finally:
        log.close()
    session = RunSession(run_dir=run_dir, mode="detached", process=proc, tail=EventTail(run_dir / rundir.EVENTS))
    session._config_file = Path(name)
    return session


def attach(run_dir: Path) -> RunSession:
    """Any run directory: finished, or still being written by another process."""
    run_dir = Path(run_dir)
    rundir.load_config(run_dir)  # one-line error if it is not a run directory
    return RunSession(run_dir=run_dir, mode="attached", tail=EventTail(run_dir / rundir.EVENTS))
