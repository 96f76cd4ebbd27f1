"""The setup form's first paint: the rows the terminal shows first, with stand-ins for the
selects, and the rest mounted right after that frame (docs/benchmarks.md, "The form's
first paint"). The form (tui/screens/setup.py) says what its rows are; this says when they mount.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from textual.app import App, ComposeResult
from textual.content import Content
from textual.widget import Widget
from textual.widgets import Footer, Static

from tui.widgets.setting_input import compact_select

CHROME_ROWS = 3  # the header, the memory verdict line and the footer
Row = tuple[int, Callable[[], list[Widget]]]  # (about how many lines it takes, what builds its widgets)


def breakpoint_classes(app: App) -> dict[str, bool]:
    """The width classes Textual gives a screen of the app's size (its HORIZONTAL_BREAKPOINTS
    rule: the highest breakpoint at or below the width), for a screen to set before it mounts."""
    points = sorted(app.HORIZONTAL_BREAKPOINTS or [], reverse=True)
    chosen = next((name for width, name in points if app.size.width >= width), None)
    return {name: name == chosen for _, name in points}


def paint_first(headless: bool) -> bool:
    """Paint the rows the terminal shows first, then mount the rest of the form and probe
    the device on a worker thread; unless torch is imported already (nothing to wait for)
    or the app is headless (Pilot tests: no one waits for a frame, and a form that is
    complete at once keeps them deterministic)."""
    return not ("torch" in sys.modules or headless)


class SelectStandIn(Static):
    """What a compact Select draws (its value, then its arrow, on $surface), for the first
    frame only: a Select costs ~30 ms to mount on a 2-core VM, 4-6x a plain widget, and the
    form shows five. The real selects replace these right after that frame, before the form
    takes input (FirstPaint.complete)."""

    DEFAULT_CSS = """
    SelectStandIn { width: 24; height: 1; background: $surface; color: $foreground; }
    """

    can_focus = True  # in the Tab order as the Select will be: keys typed early go where they will later

    def __init__(self, label: str, id: str):
        super().__init__(id=id)
        self.label = label

    def render(self) -> Content:
        width = self.size.width or 24
        return Content.assemble((self.label[: width - 3]).ljust(width - 3), " ", ("▼", "$foreground 50%"), " ")


class KeysFooter(Footer):
    """Textual's footer, with its keys in the form's first frame: Footer composes empty until
    the screen's first bindings signal, which comes only after that frame (and the footer a
    few hundred ms later, behind the rest of the form)."""

    def compose(self) -> ComposeResult:
        if hasattr(Footer, "_bindings_ready"):  # Textual's flag; without it, Footer's own timing
            self.set_reactive(Footer._bindings_ready, True)
        yield from super().compose()


class FirstPaint:
    """Which rows the first frame holds, and the rest after it. `split` False: all at once."""

    def __init__(self, split: bool) -> None:
        self.split = split
        self.later: list[Callable[[], list[Widget]]] = []  # rows below the first screen
        self._standing_in = False  # building the first frame: selects drawn by stand-ins
        self._swaps: list[tuple[Widget, Callable[[], Widget]]] = []  # each stand-in, its select

    def first(self, rows: list[Row], room: int) -> list[Widget]:
        """The widgets of the rows that fill `room` lines (every row unless split)."""
        shown = len(rows)
        if self.split:
            shown = 0
            while shown < len(rows) and room > 0:
                room -= rows[shown][0]
                shown += 1
        self.later = [build for _, build in rows[shown:]]
        self._standing_in = self.split
        widgets = [w for _, build in rows[:shown] for w in build()]
        self._standing_in = False
        return widgets

    def select(self, options: list[tuple[str, Any]], value: Any, id: str) -> Widget:
        """A compact Select; in the first frame, a stand-in drawn the same (SelectStandIn)."""
        options = list(options)
        if not self._standing_in:
            return compact_select(options, value, id)
        stand_in = SelectStandIn(next(text for text, v in options if v == value), id=id + "-stand-in")
        self._swaps.append((stand_in, lambda: compact_select(options, value, id)))
        return stand_in

    async def complete(self, app: App, form: Widget) -> None:
        """The real selects in, in one update (no frame shows both, or neither), then the rows
        below the first screen. Raises MountError when the app is quitting meanwhile."""
        if self._swaps:
            had = app.screen.focused  # a stand-in the user tabbed to: its select takes the focus
            with app.batch_update():
                done = [aw for stand_in, make in self._swaps
                        for aw in (stand_in.parent.mount(make(), after=stand_in), stand_in.remove())]  # type: ignore[union-attr]  # fmt: skip
            for aw in done:
                await aw
            if had is not None and any(had is stand_in for stand_in, _ in self._swaps) and had.id:
                app.screen.set_focus(app.screen.query_one("#" + had.id.removesuffix("-stand-in")), scroll_visible=False)
            self._swaps = []
        if self.later:
            await form.mount_all([w for build in self.later for w in build()])
            self.later = []

