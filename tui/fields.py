"""The setup form's fields, derived from the pydantic config models (one source of truth).

A field's widget kind, choices, bounds and help line come from engine.settings, which
reads them off the config models, exactly as the CLI's flags do; validation is pydantic's
own, so the form refuses exactly what `gpt2-tui train` refuses, with the same message, at
the field it concerns.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError

from engine.config import RunConfig, merge, set_dotted
from engine.settings import Setting, flags, setting

# What the form shows, by section; everything else keeps the preset's / file's value.
SECTIONS: list[tuple[str, list[str]]] = [
    ("Batch and schedule", [
        "train.block_size", "train.batch_size", "train.grad_accum", "optim.lr", "optim.min_lr",
        "optim.warmup_steps", "train.max_steps", "train.eval_interval", "train.ckpt_interval",
        "train.keep_last", "train.seed",
    ]),
    ("Speed switches", [
        "speed.device", "speed.precision", "speed.compile", "speed.compile_mode", "model.attention",
        "model.pad_vocab", "data.preload", "data.vectorized", "data.pin_memory", "data.prefetch",
        "model.grad_checkpointing", "optim.fused", "optim.grad_clip",
    ]),
]  # fmt: skip
ALL_FIELDS = [d for _, names in SECTIONS for d in names]

# pydantic's model-level validators report at the section; these say which field to blame
# (at the top level, the first word of the message names the setting: "warmup steps ...").
_MODEL_LEVEL = {("optim",): "optim.min_lr", (): "train.block_size", ("model",): "train.block_size"}
_TOP_LEVEL_BY_WORD = {"warmup": "optim.warmup_steps", "block": "train.block_size"}


def _blame(loc: tuple[str, ...], msg: str) -> str | None:
    if loc == ():
        return _TOP_LEVEL_BY_WORD.get(msg.split(" ", 1)[0], _MODEL_LEVEL[()])
    return _MODEL_LEVEL.get(loc)


def get_value(data: dict[str, Any], dotted: str) -> Any:
    section, name = dotted.split(".")
    return data.get(section, {}).get(name)


def to_text(value: Any) -> str:
    """How a config value shows in an Input (None = blank)."""
    return "" if value is None else str(value)


def from_input(sp: Setting, raw: Any) -> Any:
    """An Input's text as pydantic should see it: blank = None for optional fields, else the
    text itself, which pydantic parses (and refuses with its own message)."""
    if isinstance(raw, str):
        raw = raw.strip()
        if raw == "" and sp.optional:
            return None
    return raw


def validate(base: dict[str, Any], values: dict[str, Any]) -> tuple[RunConfig | None, dict[str, str], list[str]]:
    """The form's values over `base` -> (config or None, error by field, errors of no field)."""
    nested: dict[str, Any] = {}
    for dotted, raw in values.items():
        set_dotted(nested, dotted, from_input(setting(dotted), raw))
    try:
        return RunConfig.model_validate(merge(base, nested)), {}, []
    except ValidationError as err:
        by_field: dict[str, str] = {}
        general: list[str] = []
        for e in err.errors():
            loc = tuple(str(p) for p in e["loc"])
            msg = e["msg"].removeprefix("Value error, ")
            dotted = ".".join(loc[:2]) if len(loc) >= 2 else _blame(loc, msg)
            if dotted in values:
                by_field.setdefault(dotted, tui_words(msg))
            else:
                general.append(f"{'.'.join(loc) or 'config'}: {tui_words(msg)}")
        return None, by_field, general


# ---------------------------------------------------------------- engine words -> form words

_FORM_NAMES = {"--data": "dataset", "--context": "model context", "--fused-adamw": "fused"}
_PASS_TO_DATA = re.compile(r"\bpass (.+?) to --data\b")
_SET_FLAG = re.compile(r"\b(?:pass|use) --(no-)?([a-z][a-z0-9-]*)(?: ([^\s,;:)]+))?")
_FLAG = re.compile(r"--(no-)?([a-z][a-z0-9-]*)")


def _name(flag: str) -> str:
    """A flag as the form names its field: '--block-size' -> 'block size'."""
    if flag in _FORM_NAMES:
        return _FORM_NAMES[flag]
    by_flag = {s.flag: s.label for s in flags()}
    return by_flag.get(flag, flag.removeprefix("--").replace("-", " "))


def _set(m: re.Match[str]) -> str:
    neg, name, value = m.groups()
    field = _name("--" + name)
    if neg:
        return f"turn {field} off"
    return f"set {field} to {value}" if value else f"set {field}"


def tui_words(text: str) -> str:
    """An engine message (written for the command line) in the form's words: flags become the
    fields that set them ('pass --block-size 512 or less' -> 'set block size to 512 or less').
    A shell command in backticks is left as it is: it is meant to be typed in a shell."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # outside backticks only
        t = _PASS_TO_DATA.sub(r"give \1 in the dataset field", parts[i])
        t = _SET_FLAG.sub(_set, t)
        parts[i] = _FLAG.sub(lambda m: _name("--" + m[2]) + (" off" if m[1] else ""), t)
    return "`".join(parts)
