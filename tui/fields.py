"""The setup form's fields, derived from the pydantic config models (one source of truth).

A field's widget kind, choices, bounds and help line come from engine.settings, which
reads them off the config models, exactly as the CLI's flags do; validation is pydantic's
own, so the form refuses exactly what `gpt2-tui train` refuses, with the same message, at
the field it concerns.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from engine.config import RunConfig, merge, set_dotted
from engine.settings import Setting, setting

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
            dotted = ".".join(loc[:2]) if len(loc) >= 2 else _MODEL_LEVEL.get(loc)
            if dotted in values:
                by_field.setdefault(dotted, msg)
            else:
                general.append(f"{'.'.join(loc) or 'config'}: {msg}")
        return None, by_field, general


def preset_params(name: str, vocab: int = 50257) -> int:
    """Parameters of a preset; `vocab` is used when the preset leaves it to the dataset."""
    from engine.config import resolve

    return resolve(name).model.n_params(vocab)


def fmt_params(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e5 else f"{n / 1e3:.0f}K"
