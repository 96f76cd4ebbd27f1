"""Small modal screens: a yes/no confirm, the key help, a directory picker, a file path."""

from __future__ import annotations

from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, DirectoryTree, Input, Static

# One entry a line, every line under 72 columns: at 80x24 the dialog wraps nothing mid-phrase.
HELP = """\
Setup form
  F5  launch in its own process (the run survives the terminal)
  F6  launch in this app           F4  apply the memory fix
  F2  save the form as TOML        F3  load a TOML
  ?   every field's whole help (the focused field shows its own)
Dashboard
  p  pause/resume                  s  save a checkpoint now
  q  stop the run (asks first)     l  log-y on/off
  x  x-axis: step / tokens / time  ?  this help
  o  switches of the live run: a applies them at the next step,
     Esc cancels; the Segments tab shows what each set bought
  q  (once the run is over) what next: form, resume, another run
  t  the next tab; 1-5 a tab: Charts, Checkpoints, Sample, Segments, GPU
  Left/Right  switch tabs while the tab bar has focus
  Tab / shift+Tab  move between the panels
Anywhere
  F7  the runs list: attach, resume, compare (space marks)
  F8  the speed ladder
  F1  this help                    ctrl+p  the command palette
  ctrl+q  quit: a run in this app saves a checkpoint first, then the
          command that resumes it is printed (again: quit now); a run
          in its own process goes on (`gpt2-tui attach RUN_DIR`)"""


# Arrow keys move between a dialog's buttons and switches, as Tab does (a focused widget that
# uses an arrow itself, an Input or a Select, keeps it: these bindings are not priority).
ARROWS = [
    Binding("down,right", "app.focus_next", "next", show=False),
    Binding("up,left", "app.focus_previous", "previous", show=False),
]


class ConfirmScreen(ModalScreen[bool]):
    BINDINGS = [Binding("y", "answer(True)", "yes"), Binding("n,escape", "answer(False)", "no"), *ARROWS]

    def __init__(self, question: str):
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(self.question, markup=False)
            with Horizontal(classes="buttons"):
                yield Button("Yes [y]", id="yes", variant="error")
                yield Button("No [n]", id="no")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class AskPath(ModalScreen["Path | None"]):
    """A file path, shown whole and editable before anything is written (F2 asks where)."""

    BINDINGS = [Binding("escape", "cancel", "cancel"), *ARROWS]

    def __init__(self, question: str, default: Path, ok: str = "Save"):
        super().__init__()
        self.question, self.default, self.ok = question, default, ok

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide"):
            yield Static(self.question, markup=False)
            yield Input(str(self.default), id="path")
            with Horizontal(classes="buttons"):
                yield Button(f"{self.ok} [enter]", id="ok", variant="primary")
                yield Button("Cancel [esc]", id="cancel")

    def _answer(self) -> None:
        text = self.query_one("#path", Input).value.strip()
        self.dismiss(Path(text).expanduser() if text else None)

    def on_input_submitted(self, _: Input.Submitted) -> None:
        self._answer()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "ok":
            self._answer()
        else:
            self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "app.pop_screen", "close")]

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide"):
            yield Static(HELP, markup=False)
            yield Static("(Esc to close)", classes="help-line")


class PickDirectory(ModalScreen["Path | None"]):
    """A dataset directory anywhere: the tree starts at `root`, and Up (backspace) climbs
    above it, to the file system's root if need be."""

    BINDINGS = [Binding("escape", "cancel", "cancel"), Binding("backspace", "up", "parent directory")]

    def __init__(self, root: Path):
        super().__init__()
        self.root = root.resolve()
        self.chosen: Path | None = None

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog tall"):
            yield Static("Pick a dataset directory (Enter opens, Choose takes the highlighted one)")
            yield Static(str(self.root), id="where", markup=False)
            yield DirectoryTree(self.root, id="tree")
            with Horizontal(classes="buttons"):
                yield Button("Choose", id="choose", variant="primary")
                yield Button("Up [backspace]", id="up")
                yield Button("Cancel", id="cancel")

    def action_up(self) -> None:
        """Re-root the tree at the parent directory (a no-op at the file system's root)."""
        if self.root.parent != self.root:
            self.root = self.root.parent
            self.query_one(DirectoryTree).path = self.root
            self.query_one("#where", Static).update(str(self.root))

    def on_directory_tree_directory_selected(self, event: DirectoryTree.DirectorySelected) -> None:
        self.chosen = event.path

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "up":
            self.action_up()
        elif event.button.id == "choose":
            node = self.query_one(DirectoryTree).cursor_node
            path = node.data.path if node and node.data else self.chosen
            self.dismiss(Path(path) if path else None)
        else:
            self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)
