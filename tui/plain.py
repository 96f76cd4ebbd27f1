"""Text from files, on screen: printable (engine.text) and never read as markup.

Textual reads a str given to a DataTable cell or a notification as markup: a `[/]` in a
run's preset crashed the Runs screen, a run named `[red]r` showed styled, and the title took
escapes raw. Every table in the app is a PlainTable and every app a PlainApp, so what a run directory
holds is shown as written (tests/tui/test_tui_hostile_text.py checks the screens and that no
other table or app class is used)."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import App
from textual.content import Content
from textual.widgets import DataTable

from engine.api import printable, shown


def plain(cell: Any) -> Any:
    """A str cell as Text (no markup, printable, one line); anything else as it is."""
    return Text(shown(cell)) if isinstance(cell, str) else cell


class PlainTable(DataTable):
    """A DataTable whose str cells are plain text."""

    def add_row(self, *cells: Any, **kw: Any) -> Any:
        return super().add_row(*(plain(c) for c in cells), **kw)

    def update_cell(self, row_key: Any, column_key: Any, value: Any, **kw: Any) -> None:
        super().update_cell(row_key, column_key, plain(value), **kw)

    def update_cell_at(self, coordinate: Any, value: Any, **kw: Any) -> None:
        super().update_cell_at(coordinate, plain(value), **kw)


class PlainApp(App):
    """An App whose notifications and title are plain, printable text."""

    def notify(self, message: str, *, title: str = "", severity: Any = "information", timeout: float | None = None,
               markup: bool = False) -> None:  # fmt: skip
        super().notify(printable(message), title=printable(title), severity=severity, timeout=timeout, markup=False)

    def format_title(self, title: str, sub_title: str) -> Content:
        return super().format_title(printable(title), printable(sub_title))
