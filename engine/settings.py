"""Every user-facing setting, read off the pydantic config models: its flag, kind, choices,
bounds and help line. The CLI's flags and the TUI form are both built from here, so each
setting is described once (in engine/config.py) and shows the same words everywhere.
"""

from __future__ import annotations

import functools
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

from engine.config import RunConfig

Kind = Literal["int", "float", "bool", "choice", "tristate", "str"]
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

    @property
    def label(self) -> str:
        return self.dotted.split(".")[1].replace("_", " ")

    @property
    def metavar(self) -> str:
        """What `--help` shows for the value: readable, never the internal dotted name."""
        return {"int": "N", "float": "X", "str": "PATH"}.get(self.kind, "")


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
    if typing.get_origin(core) is Literal:
        kind: Kind = "choice"
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
    flag = extra["flag"] if "flag" in extra else "--" + name.replace("_", "-")
    return Setting(dotted, flag, kind, optional, choices, info.description or "", _bounds(info))  # type: ignore[arg-type]


def all_settings() -> list[Setting]:
    """Every config field, section by section, in the models' order."""
    out = []
    for section in SECTIONS:
        sub: type[BaseModel] = RunConfig.model_fields[section].annotation  # type: ignore[assignment]
        out += [setting(f"{section}.{name}") for name in sub.model_fields]
    return out


def flags() -> list[Setting]:
    return [s for s in all_settings() if s.flag]
