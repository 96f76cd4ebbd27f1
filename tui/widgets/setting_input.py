"""A setting as an input widget and back: the one place that maps a setting's kind
(engine.settings) to a widget, shows a value in it and reads the value out (tri-state
included). The setup form and the live Switches screen both build their fields here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from textual.widget import Widget
from textual.widgets import Input, Select, Static, Switch

from engine.api import Setting
from tui.models.form import to_text

TRISTATE = [("auto", "auto"), ("on", "on"), ("off", "off")]
_TRI_TO = {"auto": None, "on": True, "off": False}
_TRI_FROM = {None: "auto", True: "on", False: "off"}
MakeSelect = Callable[[list[tuple[str, Any]], Any, str], Widget]  # (options, value, id) -> a select


def on_off(value: bool) -> str:
    """A switch's state in words: visible without colour."""
    return "on" if value else "off"


def compact_select(options: list[tuple[str, Any]], value: Any, id: str) -> Widget:
    return Select(options, value=value, allow_blank=False, id=id, compact=True)


def options(sp: Setting) -> list[tuple[str, Any]]:
    return TRISTATE if sp.kind == "tristate" else [(c, c) for c in sp.choices]


def shown(sp: Setting, value: Any) -> Any:
    """A config value as its widget holds it."""
    if sp.kind == "bool":
        return bool(value)
    if sp.kind == "tristate":
        return _TRI_FROM[value]
    return str(value) if sp.kind == "choice" else to_text(value)


def widgets(sp: Setting, value: Any, id: str, select: MakeSelect = compact_select) -> list[Widget]:
    """The input for a setting holding `value` (a switch comes with its state in words,
    `state-ID`); `select` builds the selects (the form's first frame draws stand-ins)."""
    if sp.kind == "bool":
        return [Switch(bool(value), id=id), Static(on_off(bool(value)), id="state-" + id, classes="state")]
    if sp.kind in ("tristate", "choice"):
        return [select(options(sp), shown(sp, value), id)]
    return [Input(to_text(value), placeholder=sp.blank or sp.bounds, id=id, compact=True)]


def read(sp: Setting, widget: Widget) -> Any:
    """The value a setting's widget holds, as the config takes it (an Input's raw text)."""
    value = widget.value  # type: ignore[attr-defined]
    return _TRI_TO[str(value)] if sp.kind == "tristate" else value


def write(sp: Setting, widget: Widget, value: Any) -> None:
    """Show a config value in a setting's widget."""
    widget.value = shown(sp, value)  # type: ignore[attr-defined]


def switch_changed(screen: Widget, event: Switch.Changed) -> None:
    """Keep a switch's state in words beside it."""
    screen.query_one("#state-" + (event.switch.id or ""), Static).update(on_off(event.value))
