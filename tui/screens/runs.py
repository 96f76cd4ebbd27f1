"""The Runs screen: every run under a root at a glance, and where attach/resume/compare start.

The list comes from engine.inspect.runs (the same summaries `gpt2-tui runs` prints), read on a
worker thread so a root full of long logs never freezes the UI, and re-read every few
seconds so states move on (running -> completed, or writer gone). The screen only says what
the user chose, by posting `RunsScreen.Open`; the app decides what attach, resume and
compare mean.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static

from engine.api import RUN_COLUMNS as COLUMNS, DEFAULT_ROOT, RunSummary, list_runs, row
from tui.screens import BACK
from tui.plain import PlainTable

Action = Literal["attach", "resume", "compare"]
REFRESH_S = 5.0
MARK = "*"


class RunsScreen(Screen):
    BINDINGS = [
        Binding("a", "open('attach')", "Attach"),  # enter is the table's own select
        Binding("r", "open('resume')", "Resume"),
        Binding("space", "toggle", "Mark"),
        Binding("c", "compare", "Compare marked"),
        BACK,
    ]

    DEFAULT_CSS = """
    RunsScreen #runs-info { height: auto; padding: 0 1; background: $boost; }
    RunsScreen #runs { height: 1fr; }
    """

    class Open(Message):
        """The user chose a run (compare: `paths` holds every marked run, `path` the first)."""

        def __init__(self, path: Path, action: Action = "attach", paths: list[Path] | None = None):
            super().__init__()
            self.path, self.action = path, action
            self.paths = paths if paths is not None else [path]

    def __init__(self, root: Path = DEFAULT_ROOT, *, refresh_s: float = REFRESH_S):
        super().__init__()
        self.root = Path(root)
        self.refresh_s = refresh_s
        self.summaries: list[RunSummary] = []
        self.marked: set[str] = set()
        self.loaded = False  # True once the first listing is on screen

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(f"reading runs under {self.root} ...", id="runs-info", markup=False)
        yield PlainTable(id="runs", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        self.title = f"gpt2-tui - runs in {self.root}"
        table = self.query_one("#runs", DataTable)
        table.add_column(" ", key="mark")
        for c in COLUMNS:
            table.add_column(c, key=c)
        table.focus()
        self.reload()
        if self.refresh_s > 0:
            self.set_interval(self.refresh_s, self.reload)

    # ----------------------------------------------------------------- listing

    @work(thread=True, exclusive=True, group="runs-list")
    def reload(self) -> None:
        runs = list_runs(self.root)
        self.app.call_from_thread(self._show, runs)

    def _show(self, runs: list[RunSummary]) -> None:
        table = self.query_one("#runs", DataTable)
        current = self.selected()
        self.summaries = runs
        keys = {str(r.path) for r in runs}
        self.marked &= keys
        table.clear()
        for r in runs:
            table.add_row(MARK if str(r.path) in self.marked else "", *row(r), key=str(r.path))
        if current is not None and str(current.path) in keys:
            table.move_cursor(row=table.get_row_index(str(current.path)))
        info = f"{len(runs)} run(s) under {self.root}" if runs else f"no runs under {self.root}"
        self.query_one("#runs-info", Static).update(
            info + ("   enter/a attach  r resume  space mark  c compare marked  esc back" if runs else "")
        )
        self.loaded = True

    def selected(self) -> RunSummary | None:
        """The run under the cursor."""
        table = self.query_one("#runs", DataTable)
        if not self.summaries or table.row_count == 0:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return next((r for r in self.summaries if str(r.path) == key), None)

    # ----------------------------------------------------------------- actions

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_open("attach")

    def action_open(self, action: Action) -> None:
        r = self.selected()
        if r is None:
            self.notify("no run selected", severity="warning")
            return
        if action == "resume" and r.state == "running":
            self.notify(f"{r.name} is running: attach to it instead", severity="warning")
            return
        self.post_message(self.Open(r.path, action))

    def action_toggle(self) -> None:
        r = self.selected()
        if r is None:
            return
        key = str(r.path)
        self.marked ^= {key}
        self.query_one("#runs", DataTable).update_cell(key, "mark", MARK if key in self.marked else "")

    def action_compare(self) -> None:
        paths = [r.path for r in self.summaries if str(r.path) in self.marked]
        if len(paths) < 2:
            self.notify("mark two or more runs with space, then press c", severity="warning")
            return
        self.post_message(self.Open(paths[0], "compare", paths))

    def action_back(self) -> None:
        if len(self.app.screen_stack) > 1:
            self.app.pop_screen()
        else:
            self.app.exit()


__all__ = ["RunsScreen"]
