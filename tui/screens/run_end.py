"""Where to go once a run is over (q on an ended dashboard), and how many steps a resume runs to.

RunEndScreen answers "form", "resume", "runs" or None (stay); ResumeScreen answers the
step to train to, or None. The dashboard and the Runs screen act on the answers.
"""

from __future__ import annotations

from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Static

from engine.api import rundir
from engine.api import UserError
from tui.screens.modals import ARROWS

CSS = """
RunEndScreen, ResumeScreen { align: center middle; }
RunEndScreen .dialog, ResumeScreen .dialog { width: 72; max-width: 100%; }
ResumeScreen Input { width: 16; }
"""


class RunEndScreen(ModalScreen["str | None"]):
    DEFAULT_CSS = CSS
    BINDINGS = [
        Binding("f", "choose('form')", "back to the form"),
        Binding("r", "choose('resume')", "resume"),
        Binding("o,f7", "choose('runs')", "other run"),
        Binding("escape,q", "choose(None)", "stay"),
        *ARROWS,
    ]

    def __init__(self, summary: str, can_resume: bool = True):
        super().__init__()
        self.summary, self.can_resume = summary, can_resume

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(f"{self.summary}\nWhat next?", markup=False)
            with Vertical(classes="buttons"):
                yield Button("[f] Back to the form, filled in with this run's config", id="form", variant="primary")
                yield Button("[r] Resume this run: train it to more steps", id="resume", disabled=not self.can_resume)
                yield Button("[o] Open another run (the runs list, F7)", id="runs")
                yield Button("[esc] Stay on this dashboard", id="stay")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.action_choose(None if event.button.id == "stay" else event.button.id)

    def action_choose(self, what: str | None) -> None:
        if what == "resume" and not self.can_resume:
            return
        self.dismiss(what)


class ResumeScreen(ModalScreen["int | None"]):
    DEFAULT_CSS = CSS
    BINDINGS = [Binding("escape", "cancel", "cancel"), *ARROWS]

    def __init__(self, name: str, step: int, max_steps: int | None):
        super().__init__()
        self.run_name, self.step = name, step
        # a run stopped before its max steps resumes to them; one that reached them, twice as far
        done = max_steps is None or step >= max_steps
        self.default = max(max_steps or 0, step) + max(max_steps or 0, step, 1) if done else max_steps

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(f"Resume {self.run_name} from step {self.step} (its latest checkpoint), "
                         "in its own process. Train to step:", markup=False)  # fmt: skip
            yield Input(str(self.default), id="resume-steps", type="integer")
            yield Static("", id="resume-error", markup=False)
            with Horizontal(classes="buttons"):
                yield Button("Resume", id="go", variant="primary")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self._go()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "go":
            self._go()
        else:
            self.dismiss(None)

    def _go(self) -> None:
        text = self.query_one(Input).value.strip()
        if not text.isdigit() or int(text) <= self.step:
            self.query_one("#resume-error", Static).update(f"a whole number of steps above {self.step}, e.g. {self.default}")
            return
        self.dismiss(int(text))

    def action_cancel(self) -> None:
        self.dismiss(None)


def ask_and_resume(screen, run_dir: Path, step: int | None = None, max_steps: int | None = None,
                   pop: bool = False) -> None:  # fmt: skip
    """Ask how far, then continue the run in its own process and open its dashboard
    (`pop`: close `screen` first, e.g. the runs list). Step and max steps are read from the
    run when not given."""
    from engine.api import summarize
    from tui.session import start_resume

    if step is None:
        summary = summarize(Path(run_dir))
        step, max_steps = (summary.step, summary.max_steps) if summary else (0, None)

    def answer(to: int | None) -> None:
        if to is None:
            return
        try:
            session = start_resume(run_dir, to)
        except UserError as err:
            screen.notify(str(err), severity="error")
            return
        app = screen.app
        if pop:
            app.pop_screen()
        app.open_dashboard(session)

    screen.app.push_screen(ResumeScreen(Path(run_dir).name, step, max_steps), answer)


def back_to_form(app, run_dir: Path) -> None:
    """The setup form, filled in with this run's config (and a new run directory)."""
    from tui.screens.setup import SetupScreen

    try:
        config = rundir.load_config(Path(run_dir)).model_copy(update={"out_dir": None})
    except UserError:  # refused at set-up, nothing written: the form it was launched from, as it was
        config = None
    form = next((s for s in app.screen_stack if isinstance(s, SetupScreen)), None)
    if config is None and form is not None:
        while app.screen is not form:
            app.pop_screen()
        return
    while len(app.screen_stack) > 1:
        app.pop_screen()
    app.push_screen(SetupScreen(config))
