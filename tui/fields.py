"""The setup form's fields, derived from the pydantic config models (one source of truth).

A field's widget kind, choices and bounds come from its pydantic annotation; its one-line
"what it buys" comes from the CLI's FLAGS help (which quotes the reference figures);
validation is pydantic's own, so the form refuses exactly what `gpt2-tui train` refuses,
with the same message, at the field it concerns.
"""

from __future__ import annotations

import functools
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from engine.config import RunConfig, merge, set_dotted

Kind = Literal["int", "float", "bool", "choice", "tristate"]

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

# pydantic's model-level validators report at the section; these say which field to blame.
_MODEL_LEVEL = {("optim",): "optim.min_lr", (): "train.block_size", ("model",): "train.block_size"}


@dataclass(frozen=True)
class FieldSpec:
    dotted: str
    label: str
    kind: Kind
    optional: bool  # blank input = None (e.g. block size: the model's context)
    choices: tuple[str, ...]
    help: str
    bounds: str


def _flag_help() -> dict[str, str]:
    from engine.cli import FLAGS

    return {dotted: help_.replace("%%", "%") for _, dotted, _, help_ in FLAGS}


def _bounds(info: Any) -> str:
    parts = []
    for m in info.metadata:
        for attr, sym in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            v = getattr(m, attr, None)
            if v is not None:
                parts.append(f"{sym} {v}")
    return ", ".join(parts)


@functools.cache
def spec(dotted: str) -> FieldSpec:
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
    else:
        kind = "float"
    help_ = _flag_help().get(dotted) or info.description or ""
    return FieldSpec(dotted, name.replace("_", " "), kind, optional, choices, help_, _bounds(info))


def get_value(data: dict[str, Any], dotted: str) -> Any:
    section, name = dotted.split(".")
    return data.get(section, {}).get(name)


def to_text(value: Any) -> str:
    """How a config value shows in an Input (None = blank)."""
    return "" if value is None else str(value)


def from_input(sp: FieldSpec, raw: Any) -> Any:
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
        set_dotted(nested, dotted, from_input(spec(dotted), raw))
    try:
        return RunConfig.model_validate(merge(base, nested)), {}, []
    except ValidationError as err:
        by_field: dict[str, str] = {}
        general: list[str] = []
        for e in err.errors():
            loc = tuple(str(p) for p in e["loc"])
            msg = e["msg"].removeprefix("Value error, ")
            dotted = ".".join(loc[:2]) if len(loc) >= 2 else _MODEL_LEVEL.get(loc)
            if dotted in values:
                by_field.setdefault(dotted, msg)
            else:
                general.append(f"{'.'.join(loc) or 'config'}: {msg}")
        return None, by_field, general


def count_params(n_layer: int, n_embd: int, context: int, vocab: int, pad_vocab: bool = True, bias: bool = True) -> int:
    """GPT-2's parameter count (tied embedding once), in closed form: instant for any size.
    Per block: 12 C^2 weights, plus 13 C of biases and LayerNorms (2 C without biases)."""
    v = -(-vocab // 64) * 64 if pad_vocab else vocab
    per_block = 12 * n_embd * n_embd + (13 if bias else 2) * n_embd
    return v * n_embd + context * n_embd + n_layer * per_block + (2 if bias else 1) * n_embd


def preset_params(name: str, vocab: int = 50257) -> int:
    """Parameters of a preset; `vocab` is used when the preset leaves it to the dataset."""
    from engine.config import resolve

    m = resolve(name).model
    return count_params(m.n_layer, m.n_embd, m.block_size, m.vocab_size or vocab, m.pad_vocab, m.bias)


def fmt_params(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e5 else f"{n / 1e3:.0f}K"
