"""The Textual app: setup form -> dashboard; `attach` opens a dashboard on any run directory.

The app talks to the engine only through RunConfig, the trainer's Control and events.
Extra screens (e.g. the speed-ladder benchmark) register with one line in EXTRA_SCREENS.
Nothing here imports torch at module level: the form paints first, and torch loads on a
worker thread behind it (tui/screens/setup.py).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual import events
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen

from engine.api import RunConfig
from engine.api import UserError
from engine.api import console, path_text, program
from tui.models.form import form_words
from tui.plain import PlainApp

if TYPE_CHECKING:  # a run's session is imported when one opens: not before the form's first frame
    from tui.session import RunSession


def open_runs() -> Screen:
    from tui.screens.runs import RunsScreen

    return RunsScreen()


def open_ladder() -> Screen:
    from tui.screens.benchmark import open_benchmark  # imports torch: only when asked for

    return open_benchmark()


# (key, footer label, factory, description): each becomes a binding and a command-palette
# entry. Footer labels stay one short word: at 80 columns the footer must keep them all.
EXTRA_SCREENS: list[tuple[str, str, Callable[[], Screen], str]] = [
    ("f7", "Runs", open_runs, "every run under runs/: attach to one, resume or compare"),
    ("f8", "Ladder", open_ladder, "the speed ladder: what each optimization buys on this machine"),
]

KEY_WAIT_S = 0.5  # the longest a key waits for the one before it to be handled (one dropped on the way)
KEY_POLL_S = 0.005  # how often a waiting key looks again
STOP_POLL_S = 0.2  # how often a quit that waits for the run's checkpoint looks at the thread
QUIT_NOW_STATUS = 3  # the exit status when the user chose to quit without the run's checkpoint


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


class GPT2App(PlainApp):
    CSS_PATH = "app.tcss"
    TITLE = "gpt2-tui"
    BINDINGS = [
        Binding("ctrl+q", "quit", "Quit", priority=True), Binding("f1", "help", "Help", show=False),
        # Tab moves the focus in the app's own turn, as it reads the key (a priority binding),
        # not once the focused widget has passed the key back up: the key after it goes to the
        # field it moved to, and that field's Focus comes before that key (on_event, below)
        Binding("tab", "focus_next", "Focus next", show=False, priority=True),
        Binding("shift+tab", "focus_previous", "Focus previous", show=False, priority=True),
    ]    # below 100 columns the screen gets the class -narrow: app.tcss tightens the footer
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-wide")]
    # below 32 rows the screen gets the class -short: the dashboard's log takes fewer rows
    VERTICAL_BREAKPOINTS = [(0, "-short"), (32, "-tall")]

    def __init__(self, config: RunConfig | None = None, attach_dir: Path | None = None):
        super().__init__()
        self.initial_config = config
        self.attach_dir = attach_dir
        self.session: RunSession | None = None
        self.sessions: list[RunSession] = []  # every run opened here (a quit must stop the in-process ones)
        self.stopping = False  # quit asked: waiting for the in-process run's checkpoint
        self.inbox = Inbox(self)
        self._keys: deque[events.Key] = deque()  # keys read while the one before is still being handled
        self._key_flight: events.Key | None = None  # the key being handled (forwarded, bubbling)
        self._key_since = 0.0
        self._key_polling = False
        for key, title, factory, _ in EXTRA_SCREENS:
            self.bind(key, f"open_extra('{title}')", description=title)

    def on_mount(self) -> None:
        from tui.screens.setup import SetupScreen

        if self.attach_dir is not None:
            from tui.session import attach

            self.open_dashboard(attach(self.attach_dir))
        else:
            form = SetupScreen(self.initial_config)
            if self.is_headless:  # no frames to show: the form is there as soon as the app is
                self.push_screen(form)
            else:
                # from the message loop, once the app's start batch is over: pushed here, inside
                # it, the form lays out and renders once for a frame Textual then drops, and
                # again for the frame that shows (0.2-0.4 s of the first paint on a 2-core VM)
                self.call_later(self.push_screen, form)

    # ----------------------------------------------------------------- keys, in order

    async def on_event(self, event: events.Event) -> None:
        """Keys are handled one at a time, in the order typed. Textual forwards each key to the
        widget focused when the app reads it, and a key that widget does not take (backspace in
        an Input: a binding) travels back up to the app as a message of its own; in a burst
        (typed fast, or while the form mounts) the next key was forwarded meanwhile, so
        8 backspaces and "65536" came out as the digits first, then the backspaces eating them.
        Here a key waits until the one before it was taken (stopped) or reached the app."""
        if isinstance(event, events.Key):
            if not event.is_forwarded:
                if not getattr(event, "_in_turn", False):
                    self._keys.append(event)
                    await self._next_key()
                    return
            elif event is self._key_flight:  # back at the app, its last stop: handled after this
                await super().on_event(event)
                self._key_flight = None
                if self._keys:
                    self.call_later(self._next_key)
                return
        await super().on_event(event)

    def _key_done(self) -> bool:
        key = self._key_flight
        return key is None or key._stop_propagation or time.monotonic() - self._key_since > KEY_WAIT_S

    async def _next_key(self) -> None:
        while self._keys and self._key_done():
            key = self._keys.popleft()
            key._in_turn = True  # type: ignore[attr-defined]
            focus_first = getattr(self.screen, "focus_first", None)
            if focus_first is not None and self.screen.focused is None:  # the form, before its first frame
                focus_first()
            self._key_flight, self._key_since = key, time.monotonic()
            await super().on_event(key)
            if not key.is_forwarded:  # taken by a priority binding (Tab, ctrl+q) in the app's own turn
                self._key_flight = None
        if self._keys and not self._key_polling:
            self._key_polling = True
            self.set_timer(KEY_POLL_S, self._poll_keys)

    async def _poll_keys(self) -> None:
        self._key_polling = False
        await self._next_key()

    # ----------------------------------------------------------------- runs

    def launch(
        self, config: RunConfig, run_dir: Path, detached: bool = False, threads: int | None = None, nproc: int = 1
    ) -> None:
        from tui.session import start_detached, start_in_process

        try:
            if detached:
                session = start_detached(config, run_dir, nproc)
            else:
                self.inbox = Inbox(self)
                session = start_in_process(config, run_dir, self.inbox, threads=threads)
        except UserError as err:
            self.notify(form_words(err), severity="error")
            return
        self.open_dashboard(session)

    def open_dashboard(self, session: RunSession) -> None:
        from tui.screens.dashboard import DashboardScreen

        self.session = session
        if session not in self.sessions:
            self.sessions.append(session)
        self.push_screen(DashboardScreen(session))

    def on_runs_screen_open(self, message: Any) -> None:
        """The Runs screen chose a run: attach opens its dashboard (this app's own session
        when it is one of ours)."""
        path = Path(message.path)
        if message.action == "resume":  # ask how far, continue it in its own process, open its dashboard
            from tui.screens.run_end import ask_and_resume

            ask_and_resume(self.screen, path, pop=True)
            return
        if message.action == "compare":
            from tui.screens.compare import CompareScreen

            self.push_screen(CompareScreen(message.paths))
            return
        from tui.session import attach

        own = next((s for s in self.sessions if s.run_dir.resolve() == path.resolve()), None)
        try:
            session = own or attach(path)
        except UserError as err:
            self.notify(str(err), severity="error")
            return
        self.pop_screen()
        self.open_dashboard(session)

    def on_events_ready(self, message: EventsReady) -> None:
        for event in self.inbox.drain():
            message.session.state.feed(event)

    def action_help(self) -> None:
        from tui.screens.modals import HelpScreen

        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_open_extra(self, title: str) -> None:
        """F7/F8. On the form while torch loads, the key is kept and the screen opens once
        it has (opening it now would wait on the same import with the UI frozen)."""
        when_loaded = getattr(self.screen, "when_loaded", None)
        if when_loaded is not None and when_loaded(f"opening {title}", lambda: self.action_open_extra(title)):
            return
        for _, t, factory, _ in EXTRA_SCREENS:
            if t == title:
                self.push_screen(factory())

    def running_in_process(self) -> list[RunSession]:
        return [s for s in self.sessions if s.thread is not None and s.thread.is_alive()]

    def action_quit(self) -> None:
        """Never kills a step or a save midway: a run on this app's thread is asked to stop
        (it saves a checkpoint at the step boundary) and the app waits for it, however long,
        with the UI live (STOPPING). Only a second ctrl+q quits at once, losing the steps
        since the last checkpoint. A run in its own process is left running."""
        live = self.running_in_process()
        if not live:
            hold = getattr(self.screen, "hold_quit", None)  # the form, still mounting its rows
            if hold is None or not hold():
                self.exit()
            return
        if self.stopping:
            self.exit(return_code=QUIT_NOW_STATUS)  # run_app ends the process without waiting
            return
        self.stopping = True
        for s in live:
            s.request_stop()
        self.notify(
            "STOPPING: the run saves a checkpoint, then the app quits.\n"
            "ctrl+q again quits now and loses the steps since the last checkpoint.",
            title="quit", timeout=30,
        )  # fmt: skip
        self.set_interval(STOP_POLL_S, self._quit_when_stopped)

    def _quit_when_stopped(self) -> None:
        if not self.running_in_process():
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
        yield SystemCommand("Keys help", "F1: every key of every screen", self.action_help)


def run_app(config: RunConfig | None = None) -> int:
    """The bare `gpt2-tui`: the form (filled in from `config` if given), then the dashboard."""
    app = GPT2App(config)
    app.run()
    if app.running_in_process():  # ctrl+q twice: the user chose not to wait for the checkpoint
        import os

        for s in app.running_in_process():
            console.out.line(f"quit without waiting: {path_text(s.run_dir)} lost its steps since the last checkpoint; "
                             f"continue it with: {program()} train --resume {path_text(s.run_dir)}")  # fmt: skip
        console.out.flush()
        console.err.flush()
        # never let the interpreter tear down under the training thread (a C++ abort)
        os._exit(QUIT_NOW_STATUS)
    s = app.session
    if s is not None and s.process is not None and s.process.poll() is None:
        console.out.line(f"the run goes on in process {s.process.pid}; re-attach with: {program()} attach {path_text(s.run_dir)}")
    for line in resume_lines(app):
        console.out.line(line)
    return app.return_code or 0


def resume_lines(app: GPT2App) -> list[str]:
    """How to continue each run this app trained on its thread that stopped before its end
    (ctrl+q stops it with a checkpoint): the command, said once the app has left the screen."""
    own = [s for s in app.sessions if s.mode == "in-process"]
    if own:  # the last events the app had no turn to read (it quit once the thread had ended)
        for event in app.inbox.drain():
            own[-1].state.feed(event)
    lines = []
    for s in own:
        end = s.state.finished
        if end is not None and end.reason == "stopped":
            where = path_text(s.run_dir)
            lines.append(f"{where} stopped at step {end.step} with a checkpoint; continue it with: "
                         f"{program()} train --resume {where}")  # fmt: skip
    return lines


def run_attach(run_dir: Path) -> int:
    """`gpt2-tui attach RUN_DIR`: the dashboard on any run directory, live or finished."""
    app = GPT2App(attach_dir=run_dir)
    app.run()
    return app.return_code or 0
