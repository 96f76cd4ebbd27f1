"""The Textual app: setup form -> dashboard; `attach` opens a dashboard on any run directory.

The app talks to the engine only through RunConfig, the trainer's Control and events.
Extra screens (e.g. the speed-ladder benchmark) register with one line in EXTRA_SCREENS.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen

from engine.config import RunConfig
from engine.errors import UserError
from tui.screens.benchmark import open_benchmark
from tui.session import RunSession, attach, start_detached, start_in_process

# (key, title, factory, description): each becomes a binding and a command-palette entry.
EXTRA_SCREENS: list[tuple[str, str, Callable[[], Screen], str]] = [
    ("f8", "Speed ladder", open_benchmark, "run the speed ladder: what each optimization buys on this machine"),
]

QUIT_WAIT_S = 10.0  # an in-process run gets this long to stop at a step boundary on quit


class EventsReady(Message):
    """Engine events are waiting in a session's inbox (posted from the trainer thread;
    post_message is thread-safe and never blocks it)."""

    def __init__(self, session: RunSession):
        super().__init__()
        self.session = session


class Inbox:
    """Coalesces the trainer's events: one message per batch, not per event, so a fast
    loop (hundreds of steps a second on small models) does not flood the UI thread."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.events: deque[Any] = deque()
        self.pending = threading.Event()

    def __call__(self, session: RunSession, event: Any) -> None:  # on the trainer thread
        self.events.append(event)
        if not self.pending.is_set():
            self.pending.set()
            self.app.post_message(EventsReady(session))

    def drain(self) -> list[Any]:  # on the UI thread
        self.pending.clear()
        out = []
        while self.events:
            out.append(self.events.popleft())
        return out


class GPT2App(App):
    CSS_PATH = "app.tcss"
    TITLE = "gpt2-tui"
    BINDINGS = [Binding("ctrl+q", "quit", "Quit", priority=True)]

    def __init__(self, config: RunConfig | None = None, attach_dir: Path | None = None):
        super().__init__()
        self.initial_config = config
        self.attach_dir = attach_dir
        self.session: RunSession | None = None
        self.inbox = Inbox(self)
        for key, title, factory, _ in EXTRA_SCREENS:
            self.bind(key, f"open_extra('{title}')", description=title)

    def on_mount(self) -> None:
        from tui.screens.setup import SetupScreen

        if self.attach_dir is not None:
            self.open_dashboard(attach(self.attach_dir))
        else:
            self.push_screen(SetupScreen(self.initial_config))

    # ----------------------------------------------------------------- runs

    def launch(
        self, config: RunConfig, run_dir: Path, detached: bool = False, threads: int | None = None, nproc: int = 1
    ) -> None:
        try:
            if detached:
                session = start_detached(config, run_dir, nproc)
            else:
                self.inbox = Inbox(self)
                session = start_in_process(config, run_dir, self.inbox, threads=threads)
        except UserError as err:
            self.notify(str(err), severity="error")
            return
        self.open_dashboard(session)

    def open_dashboard(self, session: RunSession) -> None:
        from tui.screens.dashboard import DashboardScreen

        self.session = session
        self.push_screen(DashboardScreen(session))

    def on_events_ready(self, message: EventsReady) -> None:
        for event in self.inbox.drain():
            message.session.state.feed(event)

    def action_open_extra(self, title: str) -> None:
        for _, t, factory, _ in EXTRA_SCREENS:
            if t == title:
                self.push_screen(factory())

    async def action_quit(self) -> None:
        """Never hangs: an in-process run is asked to stop and given QUIT_WAIT_S; its thread
        is a daemon, and checkpoint writes are atomic, so leaving after that is safe."""
        if self.session is not None and self.session.thread is not None and self.session.thread.is_alive():
            self.notify("stopping the run at the next step boundary...")
            import asyncio

            await asyncio.get_running_loop().run_in_executor(None, self.session.shutdown, QUIT_WAIT_S)
        self.exit()

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        from tui.screens.dashboard import DashboardScreen

        if isinstance(screen, DashboardScreen):
            for name, action, help_ in (
                ("Pause / resume the run", screen.action_pause, "p: pause at the next step boundary, or resume"),
                ("Save a checkpoint now", screen.action_save, "s: at the next step boundary"),
                ("Stop the run", screen.action_stop, "q: saves a checkpoint, asks first"),
                ("Toggle log-y", screen.action_logy, "l"),
                ("Cycle the x-axis", screen.action_xaxis, "x: step / tokens / time"),
                ("Keys help", screen.action_help, "?"),
            ):
                yield SystemCommand(name, help_, action)
        for _, title, factory, description in EXTRA_SCREENS:
            yield SystemCommand(title, description, lambda f=factory: self.push_screen(f()))


def run_app(config: RunConfig | None = None) -> int:
    """The bare `gpt2-tui`: the form (filled in from `config` if given), then the dashboard."""
    app = GPT2App(config)
    app.run()
    s = app.session
    if s is not None and s.process is not None and s.process.poll() is None:
        print(f"the run goes on in process {s.process.pid}; re-attach with: gpt2-tui attach {s.run_dir}")
    return app.return_code or 0


def run_attach(run_dir: Path) -> int:
    """`gpt2-tui attach RUN_DIR`: the dashboard on any run directory, live or finished."""
    app = GPT2App(attach_dir=run_dir)
    app.run()
    return app.return_code or 0
