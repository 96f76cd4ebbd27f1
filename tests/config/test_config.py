"""Config validation: every bad value is one line naming the field."""

import pytest

from engine.config import RunConfig, resolve
from engine.errors import UserError


@pytest.mark.parametrize(
    "overrides, words",
    [
        ({"optim.lr": 0.0}, "optim.lr"),
        ({"optim.lr": -1.0}, "optim.lr"),
        ({"train.batch_size": 0}, "train.batch_size"),
        ({"train.block_size": 4096}, "above the model's context"),
        ({"model.n_head": 5}, "not divisible"),
        ({"optim.min_lr": 1.0}, "min_lr"),
        ({"model.dropout": 1.5}, "model.dropout"),
    ],
)
def test_bad_values_are_one_line_errors(overrides, words):
    with pytest.raises(UserError) as err:
        resolve("nano", None, overrides)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_unknown_preset_lists_the_choices():
    with pytest.raises(UserError, match="unknown preset 'gpt5'.*nano"):
        resolve("gpt5")


def test_config_file_unknown_key_and_wrong_type(tmp_path):
    bad = tmp_path / "run.toml"
    bad.write_text("[train]\nbatch_sise = 4\n")
    with pytest.raises(UserError, match="batch_sise"):
        resolve("nano", bad)
    bad.write_text('[train]\nbatch_size = "four"\n')
    with pytest.raises(UserError, match="train.batch_size"):
        resolve("nano", bad)
    bad.write_text("[train\n")
    with pytest.raises(UserError, match="not valid TOML"):
        resolve("nano", bad)


def test_precedence_preset_then_file_then_flags(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text("[train]\nbatch_size = 7\nmax_steps = 9\n[optim]\nwarmup_steps = 2\n")  # warmup < max steps
    cfg = resolve("nano", f, {"train.max_steps": 11})
    assert (cfg.model.n_embd, cfg.train.batch_size, cfg.train.max_steps) == (128, 7, 11)


def test_toml_round_trip():
    cfg = resolve("nano", None, {"model.vocab_size": 300, "speed.compile": True})
    import tomllib

    assert RunConfig.model_validate(tomllib.loads(cfg.to_toml())) == cfg
