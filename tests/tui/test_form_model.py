"""The setup form's model without Textual (no Pilot): its fields come from the settings'
own descriptions, its verdicts word each fix as fields, and presets, the final config and
the TOML follow the form's rules."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from engine.config import resolve
from engine.errors import UserError
from engine.run.segments import SWITCHES
from engine.settings import setting
from tui.models import form as F
from harness import force_cpu_native, python_c


@pytest.mark.slow
def test_the_form_model_imports_no_textual() -> None:
    code = "import sys, tui.models.form\nassert not [m for m in sys.modules if m.startswith('textual')]\n"
    out = python_c(code)
    assert out.returncode == 0, out.stderr


def test_every_live_switch_is_in_the_form_and_only_switches_are_under_speed_switches() -> None:
    assert set(SWITCHES) <= set(F.ALL_FIELDS)  # model.loss was missing from the form
    sections = dict(F.SECTIONS)
    assert "model.loss" in sections["Speed switches"]
    assert all(setting(d).live for d in sections["Speed switches"])
    assert "speed.device" in sections["Device"] and "optim.grad_clip" in sections["Batch and schedule"]
    assert SWITCHES == tuple(d for d in SWITCHES if setting(d).live)  # derived, not listed by hand


def test_a_refusal_words_its_fix_as_flags_on_the_cli_and_as_fields_in_the_form() -> None:
    with pytest.raises(UserError) as caught:  # both set by the user, in conflict (issue 22: only then refused)
        resolve("nano", overrides={"train.max_steps": 30, "optim.warmup_steps": 50})
    assert "pass --warmup-steps 29 or less, or pass --max-steps 51 or more" in str(caught.value)
    assert caught.value.fixes == ({"optim.warmup_steps": "29 or less"}, {"train.max_steps": "51 or more"})
    words = F.form_words(caught.value)
    assert "set warmup steps to 29 or less, or set max steps to 51 or more" in words and "--" not in words


def shown(model: F.FormModel, **over: object) -> dict[str, object]:
    """Every field's value as the form shows it, `over` (dotted, with __ for .) on top."""
    values = {d: F.to_text(F.get_value(model.base, d)) for d in F.ALL_FIELDS} | {"data.path": None}
    return values | {k.replace("__", "."): v for k, v in over.items()}


def test_check_blames_the_field_in_form_words() -> None:
    model = F.FormModel(resolve("nano"))
    model.check(shown(model, train__max_steps="30", optim__warmup_steps="40"))
    assert model.config is None
    why = model.errors["optim.warmup_steps"]
    assert why.startswith("warmup steps 40 is not below max steps 30") and "--" not in why
    model.check(shown(model, train__block_size="999"))
    assert model.errors["train.block_size"].endswith("set block size to 128 or less")
    model.check(shown(model, train__block_size=""))
    assert model.errors == {} and model.validated is not None and model.validated.seq_len == 128


def test_a_preset_keeps_the_device_and_the_speed_switches(tmp_path: Path) -> None:
    model = F.FormModel(resolve("nano", overrides={"speed.compile": True, "speed.device": "cpu"}))
    model.apply_preset("micro")
    assert model.base["model"]["n_layer"] == 2 and model.base["train"]["max_steps"] == 20
    assert model.base["speed"]["compile"] is True and model.base["speed"]["device"] == "cpu"
    assert "speed.device" in F.KEPT_ON_PRESET and "model.loss" in F.KEPT_ON_PRESET
    assert "train.max_steps" not in F.KEPT_ON_PRESET


def test_the_final_config_and_its_toml_leave_the_vocab_to_the_dataset(tmp_path: Path) -> None:
    model = F.FormModel(resolve("nano"))
    model.check(shown(model, model__loss="chunked"))
    assert model.config is not None and model.launch_config().model.vocab_size is None
    text = model.toml_text()
    assert "vocab_size" not in text and tomllib.loads(text)["model"]["loss"] == "chunked"
    path = tmp_path / "run.toml"
    path.write_text(text)
    assert F.load_file(path).model.loss == "chunked" and F.load_file(path).train.max_steps == 600


def test_the_presets_warmup_follows_max_steps_the_form_shortened() -> None:
    """Issue 22 item 4, the CLI's rule (engine.config.fit_warmup): nano warms up for 50 steps;
    max steps 30 typed in the form scales it to 3, with one line saying so, not a refusal."""
    model = F.FormModel(resolve("nano"))
    model.check(shown(model, train__max_steps="30"))
    assert model.errors == {} and model.config is not None and model.config.optim.warmup_steps == 3
    assert len(model.notes) == 1 and "50 -> 3" in model.notes[0]
    assert model.base["optim"]["warmup_steps"] == 50  # the preset's value stays the form's base
    assert resolve("nano", overrides={"train.max_steps": 30}).optim.warmup_steps == 3  # the same on the CLI


def test_bf16_on_a_cpu_without_it_natively_is_said_in_the_form(monkeypatch) -> None:
    """Issue 22 item 10: the ladder's rule (engine.device.cpu_native), seen from the form: a CPU
    without avx512_bf16 or AMX (an AVX2 box, an AMD EPYC) emulates bf16."""
    from engine import device

    force_cpu_native(monkeypatch, "none")
    model = F.FormModel(resolve("nano", overrides={"speed.device": "cpu"}))
    model.caps = device.capabilities()
    model.check(shown(model, speed__precision="bf16"))
    assert model.errors == {} and any("native bf16" in n and "fp32" in n for n in model.notes), model.notes
    model.check(shown(model, speed__precision="fp32"))
    assert not any("native" in n for n in model.notes)


def test_start_from_pretrained_weights_gives_the_form_their_shape(tmp_path: Path) -> None:
    """The form's `start from` field (model.init_from): a transformers directory decides the
    shape the estimate sees; a directory without a model is refused at that field."""
    pytest.importorskip("transformers")
    from engine.device import capabilities
    from tests.make_tiny_gpt2 import make

    tiny = make(tmp_path / "tiny")
    assert "model.init_from" in dict(F.SECTIONS)["Starting weights"]
    model = F.FormModel(resolve("nano"))
    model.caps = capabilities()
    model.check(shown(model, model__init_from=str(tiny), train__block_size="32"))
    assert model.errors == {} and model.config is not None
    assert (model.config.model.n_layer, model.config.model.n_embd, model.config.model.block_size) == (2, 32, 64)
    assert tomllib.loads(model.toml_text())["model"]["init_from"] == str(tiny)
    model.check(shown(model, model__init_from=str(tmp_path), train__block_size="32"))
    assert "no config.json" in model.errors["model.init_from"] and model.config is None
