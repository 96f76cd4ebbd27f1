"""A run the dashboard shows: trained in this process, in a detached process, or attached.

In-process: set-up, compile and training all happen on one daemon thread (torch.compile
is not thread-safe; a Textual thread worker lives in asyncio's default executor, which
the loop joins at exit, so a long step would make quitting hang). Events reach the UI by
a callback that only posts a message (thread-safe, never blocks the trainer).

Detached: the headless CLI in its own session (`start_new_session`), writing the run
directory; the dashboard tails its events.jsonl like any `attach`, and the run survives
the terminal going away.

Steering (pause, save now, stop, toggle) is one call, `steer(request)`: this app's own
trainer takes it from its Control, any other run from the mailbox in its run directory
(engine/run/requests.py), when that run's writer holds its lock, on this host, as this user.
A run acknowledges each request in its events. A process launched from here that does not
read its mailbox yet (or any more) is stopped by SIGTERM. Others' runs are watched.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from engine.api import events as ev
from engine.api import rundir
from engine.api import files
from engine.api import RunConfig
from engine.api import Control, Request, post
from engine.api import UserError
from engine.api import path_text
from engine.api import spawn_new, spawn_resume, train_in_thread
from tui.models.runstate import Building, RunState, Writer
from tui.models.tail import EventTail

CONSOLE_LOG = rundir.LAUNCH_LOG
CONSOLE_CAP = 8 << 20  # what the dashboard shows of a launch's console, at most
BUILD_LINE = "building the default dataset"  # what engine.prep.prepare prints while it builds (a child's console)


def _proc_status(pid: int) -> dict[str, str]:
    """Linux's /proc/PID/status fields ({} where there is no /proc)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def writer_target(run_dir: Path) -> tuple[int | None, str]:
    """The writer pid of a run this app may steer through its mailbox, or None and why not.
    The one liveness rule: the writer is the process holding the run's lock (on this host, as
    this user); writer.pid is only a label and may name a reused pid."""
    pid = rundir.lock_holder(run_dir)
    if pid is None:
        record = rundir.writer_of(run_dir)
        if record is not None and record[0] != socket.gethostname():
            return None, f"written by pid {record[1]} on {path_text(record[0])}, another host"
        if record is not None and _proc_status(record[1]):  # a live pid that is not the writer (reused, stale)
            return None, f"pid {record[1]} does not hold the run's lock"
        return None, "no process holds the run's lock: the run is not running"
    status = _proc_status(pid)
    if status and int(status["Uid"].split()[0]) != os.getuid():
        return None, f"pid {pid} belongs to another user"
    return pid, f"pid {pid}"


@dataclass
class RunSession:
    run_dir: Path
    mode: str  # "in-process" | "detached" | "attached"
    state: RunState = field(default_factory=RunState)
    control: Control | None = None  # for in-process runs
    thread: threading.Thread | None = None
    process: subprocess.Popen | None = None
    tail: EventTail | None = None
    stopping: bool = False  # a stop was asked for from here: the run saves, then ends
    _config_file: Path | None = None
    _saw_start: bool = False  # a tailed run's run_started came (since this session began)
    _console_pos: int = 0  # where this launch's lines start in the console log

    @property
    def label(self) -> str:
        """Where the run lives, in words: "in this app", "own process PID" (launched from here,
        F5 or resume) or "attached"."""
        if self.mode == "in-process":
            return "in this app"
        if self.process is not None:
            return f"own process {self.process.pid}"
        return "attached"

    @property
    def steerable(self) -> bool:
        return self.steering()[0]

    def steering(self) -> tuple[bool, str]:
        """Whether p/s/q reach the run, and whom (or why not): this app's trainer, the
        process it spawned, or the recorded writer when it is ours (same user and host)."""
        if self.control is not None:
            return True, "in this app"
        if self.process is not None and self.process.poll() is None:
            return True, f"pid {self.process.pid}"
        pid, why = writer_target(self.run_dir)
        return pid is not None, why

    def steer(self, request: Request) -> None:
        """Pause, resume, save, stop or toggle: to this app's trainer, or to the run's mailbox."""
        if self.control is not None:
            self.control.steer(request)
            return
        pid, why = writer_target(self.run_dir)
        if pid is None:
            if request.kind == "stop" and self.process is not None and self.process.poll() is None:
                os.kill(self.process.pid, signal.SIGTERM)  # launched from here, not reading its mailbox yet
                return
            raise UserError(f"cannot steer {self.run_dir}: {why}")
        post(self.run_dir, request)

    def toggle_pause(self) -> bool:
        """Pause or resume; True if a pause was asked for."""
        pausing = not self.state.paused
        self.steer(Request("pause" if pausing else "resume"))
        return pausing

    def save_now(self) -> None:
        self.steer(Request("save"))

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
        exited = self.process is not None and self.process.poll() is not None  # before reading: all it wrote is there
        dead = self.state.live and self._writer_dead(exited)  # likewise: a run that ended well is read ending
        resets = self.tail.resets
        events = self.tail.read_new()
        if self.tail.resets != resets:  # the file was truncated or replaced: start the view over
            self.state = RunState()
        self._saw_start = self._saw_start or any(isinstance(e, ev.RunStarted) for e in events)
        if exited and not self._saw_start and self.state.failed is None:
            # the child quit before starting the run: bad input; its one line is in the log
            events.append(ev.RunFailed(step=None, error=self.console_tail() or f"exit status {self.process.returncode}"))
        elif not self._saw_start and self.state.live:
            building = BUILD_LINE in self.console_text()
            # the child's console says each phase of the build as it starts ("encoding...")
            tail = self.console_tail()
            what = "" if BUILD_LINE in tail else tail.rstrip(".")
            current = self.state.building_step[0] if self.state.building_step else None
            if building != (self.state.building_since is not None) or (building and what != current):
                events.insert(0, Building(building, what))
        if dead != self.state.writer_lost:
            events.append(Writer(alive=not dead))
        if self._config_file is not None and self.state.started:
            self._config_file.unlink(missing_ok=True)
            self._config_file = None
        return events

    def writer_died(self) -> bool:
        """A tailed live run whose writer is gone and the view does not say so yet (cheap: a
        waitpid and /proc/locks; the dashboard asks every second, whatever its redraw rate)."""
        if self.tail is None or not self.state.live or self.state.writer_lost:
            return False
        return self._writer_dead(self.process is not None and self.process.poll() is not None)

    def _writer_dead(self, exited: bool) -> bool:
        """The one liveness rule, for every view of a tailed run: a process holds the run's
        lock (rundir.writer_alive; unknown for another host's run is not dead). A process
        launched from here is dead once it exited; before its run started it may not hold the
        lock yet (it builds the dataset first), so only its exit counts then."""
        if self.process is not None:
            if exited:
                return True
            if not self._saw_start:
                return False
        return rundir.writer_alive(self.run_dir) is False

    def console_text(self) -> str:
        """What the launched process wrote to the console log (not earlier launches' lines)."""
        try:
            with files.open_log(self.run_dir / CONSOLE_LOG, offset=self._console_pos) as f:
                return f.read(CONSOLE_CAP).decode(errors="replace")
        except OSError:
            return ""

    def console_tail(self) -> str:
        lines = [ln for ln in self.console_text().splitlines() if ln.strip()]
        return lines[-1] if lines else ""

    def request_stop(self) -> None:
        """Graceful: the trainer saves a checkpoint at the next step boundary and ends."""
        self.steer(Request("stop"))
        self.stopping = True
        self.state.note_stop()

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
    """The run on a thread of this process (engine's train_in_thread); `threads`: torch
    intra-op threads on it (the overhead benchmark pins it so both of its modes run alike)."""
    session = RunSession(run_dir=run_dir, mode="in-process", control=Control())
    session.thread = train_in_thread(
        config, run_dir, session.control, lambda e: on_event(session, e), threads,
        building=lambda what, fraction: on_event(session, Building(what is not None, what or "", fraction)),
    )  # fmt: skip
    return session


def start_detached(config: RunConfig, run_dir: Path, nproc: int = 1) -> RunSession:
    """The headless CLI on this config in its own process (engine's spawn_new); tail what it writes."""
    proc, config_file, pos = spawn_new(config, run_dir, nproc)
    session = RunSession(run_dir=run_dir, mode="detached", process=proc, tail=EventTail(run_dir / rundir.EVENTS))
    session._config_file, session._console_pos = config_file, pos
    return session


def start_resume(run_dir: Path, max_steps: int) -> RunSession:
    """Continue a run that is not running, to `max_steps`, in its own process (like F5):
    the headless CLI's --resume. The dashboard shows the run's history, then the new steps."""
    run_dir = Path(run_dir)
    rundir.load_config(run_dir)  # one line if it is not a run directory
    if rundir.writer_alive(run_dir):
        raise UserError(f"{run_dir} is running; attach to it instead")
    session = RunSession(run_dir=run_dir, mode="detached", tail=EventTail(run_dir / rundir.EVENTS))
    while history := session.tail.read_new():  # the history, at once; the tail goes on from its end
        for e in history:
            session.state.feed(e)
    if max_steps <= session.state.step:
        raise UserError(f"{run_dir} is at step {session.state.step}; resume it to more steps than that")
    session.state.resuming()
    session.process, session._console_pos = spawn_resume(run_dir, max_steps)
    return session


def attach(run_dir: Path) -> RunSession:
    """Any run directory: finished, or still being written by another process."""
    run_dir = Path(run_dir)
    rundir.load_config(run_dir)  # one-line error if it is not a run directory
    return RunSession(run_dir=run_dir, mode="attached", tail=EventTail(run_dir / rundir.EVENTS))
