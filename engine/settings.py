"""Every user-facing setting, read off the pydantic config models: its flag, kind, choices,
bounds, help line, form section and whether a live run may change it. The CLI's flags, the
TUI form, the live Switches screen and engine.run.segments.SWITCHES are all built from here, so
each setting is described once (in engine/config.py) and shows the same words everywhere.
"""

from __future__ import annotations

import functools
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

from engine.config import FORM_SECTIONS, RunConfig, flag_of

Kind = Literal["int", "float", "bool", "choice", "tristate", "str", "multi"]  # multi: a list of choices
SECTIONS = ("model", "data", "optim", "speed", "train")


@dataclass(frozen=True)
class Setting:
    dotted: str  # "optim.lr"
    flag: str | None  # "--lr"; None: config files only
    kind: Kind
    optional: bool  # None allowed (blank in the form = the default rule, e.g. the model's context)
    choices: tuple[str, ...]
    help: str
    bounds: str  # ">= 1, < 1"
    form: str | None = None  # the form section showing it (config.FORM_SECTIONS); None: not in the form
    live: bool = False  # a speed switch: a live run may change it
    name: str | None = None  # the form's name for it, when not the field's own
    blank: str = ""  # what a blank input means (optional settings)
    value_name: str = ""  # what `--help` shows for the value, when not the kind's


    @property
    def label(self) -> str:
        return self.name or self.dotted.split(".")[1].replace("_", " ")

    @property
    def metavar(self) -> str:
        """What `--help` shows for the value: readable, never the internal dotted name."""
        return self.value_name or {"int": "N", "float": "X", "str": "PATH"}.get(self.kind, "")


def _bounds(info: Any) -> str:
    parts = []
    for m in info.metadata:
        for attr, sym in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            v = getattr(m, attr, None)
            if v is not None:
                parts.append(f"{sym} {v}")
    return ", ".join(parts)


@functools.cache
def setting(dotted: str) -> Setting:
    section, name = dotted.split(".")
    sub: type[BaseModel] = RunConfig.model_fields[section].annotation  # type: ignore[assignment]
    info = sub.model_fields[name]
    ann = info.annotation
    args = typing.get_args(ann)
    optional = (typing.get_origin(ann) in (typing.Union, types.UnionType)) and type(None) in args
    core = next((a for a in args if a is not type(None)), ann) if optional else ann
    choices: tuple[str, ...] = ()
    if typing.get_origin(core) is list and typing.get_origin(typing.get_args(core)[0]) is Literal:
        kind: Kind = "multi"
        choices = tuple(str(c) for c in typing.get_args(typing.get_args(core)[0]))
    elif typing.get_origin(core) is Literal:
        kind = "choice"
        choices = tuple(str(c) for c in typing.get_args(core))
    elif core is bool:
        kind = "tristate" if optional else "bool"
    elif core is int:
        kind = "int"
    elif core is float:
        kind = "float"
    else:
        kind = "str"
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    return Setting(dotted, flag_of(dotted), kind, optional, choices, info.description or "", _bounds(info),  # type: ignore[arg-type]
                   extra.get("form"), extra.get("live", False), extra.get("label"), extra.get("blank", ""),
                   extra.get("metavar", ""))  # fmt: skip


def all_settings(order: tuple[str, ...] = SECTIONS) -> list[Setting]:
    """Every config field, section by section (in `order`), in the models' order."""
    out = []
    for section in order:
        sub: type[BaseModel] = RunConfig.model_fields[section].annotation  # type: ignore[assignment]
        out += [setting(f"{section}.{name}") for name in sub.model_fields]
    return out


def flags() -> list[Setting]:
    return [s for s in all_settings() if s.flag]


def switches() -> tuple[str, ...]:
    """The settings a live run may change (speed switches): how fast, never what it computes."""
    return tuple(s.dotted for s in all_settings(("speed", "model", "optim", "data", "train")) if s.live)


def form_sections() -> list[tuple[str, list[Setting]]]:
    """The setup form's sections in order, each with its settings (engine.config.FORM_SECTIONS: the speed switches first)."""
    shown = all_settings(("train", "speed", "model", "optim", "data"))
    return [(title, [s for s in shown if s.form == title]) for title in FORM_SECTIONS]
