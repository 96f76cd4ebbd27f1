"""The setup form's model, without Textual: which fields it shows, their values checked as a
whole, presets, the final config and its TOML. SetupScreen only draws it and reads widgets.

A field's section, widget kind, choices, bounds and help line come from engine.settings,
which reads them off the config models, exactly as the CLI's flags do; validation is
pydantic's own, so the form refuses exactly what `gpt2-tui train` refuses, at the field it
concerns, with each refusal's fix worded as the fields to change (form_words).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import tomli_w
from pydantic import ValidationError

from engine.api import BATCH, RunConfig, fit_warmup, merge, preset_names, read_toml, resolve, set_dotted
from engine.api import Refusal
from engine.api import Setting, form_sections, setting

if TYPE_CHECKING:
    from engine.api import Capabilities

# What the form shows, by section (each setting's `form` in engine/config.py); the rest keeps
# the preset's / file's value.
SECTIONS: list[tuple[str, list[str]]] = [(title, [s.dotted for s in ss]) for title, ss in form_sections()]
ALL_FIELDS = [d for _, names in SECTIONS for d in names]
KEPT_ON_PRESET = [d for title, names in SECTIONS if title != BATCH for d in names]  # the user's, not the preset's

def form_change(dotted: str, value: Any) -> str:
    """One change of a refusal's fix, as the field to change: 'set block size to 512'."""
    sp = setting(dotted)
    if value is True or value is False:
        return f"turn {sp.label} {'on' if value else 'off'}"
    return f"give {value} in the {sp.label} field" if sp.kind == "str" else f"set {sp.label} to {value}"


def form_words(err: BaseException | str) -> str:
    """A refusal in the form's words: its fixes name fields, never CLI flags."""
    if isinstance(err, Refusal):
        return err.words(form_change, join=" and ", verb="")
    return str(err)


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


def user_set(base: dict[str, Any], values: dict[str, Any]) -> set[str]:
    """The fields the user changed: those that no longer show the base's (preset's, file's) value."""
    return {d for d, raw in values.items() if from_input(setting(d), raw) != to_text(get_value(base, d))
            and from_input(setting(d), raw) != get_value(base, d)}  # fmt: skip


def validate(
    base: dict[str, Any], values: dict[str, Any], notes: list[str] | None = None
) -> tuple[RunConfig | None, dict[str, str], list[str]]:
    """The form's values over `base` -> (config or None, error by field, errors of no field);
    the CLI's rule for a warmup the user did not set (config.fit_warmup) applies, its line
    appended to `notes`."""
    nested: dict[str, Any] = {}
    for dotted, raw in values.items():
        set_dotted(nested, dotted, from_input(setting(dotted), raw))
    data = merge(base, nested)
    for dotted in ("train.max_steps", "optim.warmup_steps"):  # typed numbers: the rule needs their values
        raw = get_value(data, dotted)
        if isinstance(raw, str) and raw.isdigit():
            set_dotted(data, dotted, int(raw))
    note = fit_warmup(data, user_set(base, values))
    if note and notes is not None:
        notes.append(note)
    try:
        return RunConfig.model_validate(data), {}, []
    except ValidationError as err:
        by_field: dict[str, str] = {}
        general: list[str] = []
        for e in err.errors():
            loc = tuple(str(p) for p in e["loc"])
            why = e.get("ctx", {}).get("error")
            msg = form_words(why) if isinstance(why, Refusal) else e["msg"].removeprefix("Value error, ")
            # a model-level validator reports at its section: its first fix names the field to blame
            blame = next(iter(why.fixes[0])) if isinstance(why, Refusal) and why.fixes else None
            dotted = ".".join(loc[:2]) if len(loc) >= 2 else blame
            if dotted in values:
                by_field.setdefault(dotted, msg)
            else:
                general.append(f"{'.'.join(loc) or 'config'}: {msg}")
        return None, by_field, general


def load_file(path: Path) -> RunConfig:
    """A run config file as the form loads it: over its preset when it names one of ours."""
    data = read_toml(path)
    return resolve(data["preset"], path) if data.get("preset") in preset_names() else resolve(None, path)


class FormModel:
    """The form's state: the config it starts from, and the verdict on the values it shows."""

    def __init__(self, base: RunConfig | None = None) -> None:
        self.load(base or resolve("nano"))
        self.caps: Capabilities | None = None  # what this machine can run, once torch has loaded
        self.dataset_info: Any = None  # the dataset's DatasetInfo, once checked
        self.config: RunConfig | None = None  # the values' config, when nothing refuses it
        self.validated: RunConfig | None = None  # the same, as far as pydantic goes
        self.errors: dict[str, str] = {}
        self.general: list[str] = []
        self.notes: list[str] = []  # what the check decided on its own (a warmup that follows max steps)
        self.verdict: Any = None  # engine.run.preflight.Verdict of the values, once torch has loaded

    def load(self, config: RunConfig) -> None:
        self.base_config = config
        self.base = config.model_dump(mode="json")

    def preset(self) -> str:
        """The preset the form shows: the base's, when it is one of ours."""
        p = self.base.get("preset")
        return p if p in preset_names() else "nano"

    def apply_preset(self, name: str) -> None:
        """A new preset: its model shape and train/optim values; data and speed kept (the form
        then puts back the KEPT_ON_PRESET fields as the user set them)."""
        self.base = merge(resolve(name).model_dump(mode="json"), {"data": self.base["data"], "speed": self.base["speed"]})

    def check(self, values: dict[str, Any]) -> None:
        """Judge the form's values ({dotted: value}, data.path included): pydantic's validation,
        then, once torch has loaded (caps), the engine's preflight, as every front door: the
        `start from` weights' shape, what this machine cannot run, the dataset's vocab and length,
        inputs of no effect (notes). Errors by field, errors of no field, the config or None."""
        fields = {k: v for k, v in values.items() if k in ALL_FIELDS}
        self.notes = []
        self.verdict = None
        config, errors, general = validate(merge(self.base, {"data": {"path": values.get("data.path")}}), fields,
                                           self.notes)  # fmt: skip
        if config is not None and self.caps is not None:
            from engine.api import preflight

            given = {d: fields[d] for d in user_set(self.base, fields)}
            self.verdict = preflight(config, dataset=self.dataset_info or False, caps=self.caps, explicit=given,
                                     local_only=True, memory=False)  # the memory panel shows the estimate's verdict
            for dotted, why in self.verdict.errors.items():
                if dotted in ALL_FIELDS:
                    errors.setdefault(dotted, form_words(why))
                else:
                    general.append(f"{dotted}: {form_words(why)}")
            general += [form_words(why) for why in self.verdict.general]
            self.notes += [form_words(why) for why in self.verdict.warnings]
            config = self.verdict.judged
        self.errors, self.general, self.validated = errors, general, config
        self.config = config if not errors and not general else None
        if self.config is not None and self.caps is not None:  # the vocab the run gets, for the estimate
            from engine.api import memory

            self.config = memory.with_dataset_vocab(self.config)  # (F2 and launch leave it to the data)

    def refusal(self) -> str | None:
        """Why the values cannot launch, naming the field to change; None: as far as they go."""
        if self.caps is None:
            return "still loading torch to check this machine: launch in a moment"
        bad = [d for d in ALL_FIELDS if d in self.errors]
        if bad:
            return f"fix the fields marked in red first ({setting(bad[0]).label}: {self.errors[bad[0]]})"
        if self.general:
            return f"fix the config first: {self.general[0]}"
        return None

    def launch_config(self) -> RunConfig:
        """The config to launch: the vocab is the dataset's unless the base named one."""
        assert self.config is not None
        vocab = self.base["model"].get("vocab_size")
        return self.config.model_copy(update={"model": self.config.model.model_copy(update={"vocab_size": vocab})})

    def toml_text(self) -> str:
        """The form as a run config file. The vocab is written once at most: the dataset decides
        it unless the config named one; [data] vocab_size only where it decides (nanoGPT/llm.c
        files, which carry none)."""
        assert self.config is not None
        data = self.config.model_dump(mode="json", exclude_none=True)
        if self.base["model"].get("vocab_size") is None:
            data["model"].pop("vocab_size", None)
        headerless = self.dataset_info is not None and self.dataset_info.format != "gpt2-tui"
        if "vocab_size" in data["model"] or not headerless:
            data["data"].pop("vocab_size", None)
        return tomli_w.dumps(data)
