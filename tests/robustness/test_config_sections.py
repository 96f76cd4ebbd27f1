"""A config section written as a value (issue 38): `optim = "muon"` in a --config file was a
traceback, and `model = "gpt2-medium"` with a model flag silently trained the schema's default
shape (the flags' table replaced the string). Sections are tables, or one line naming the section.

By class: every section of RunConfig, written as each kind of TOML value, with and without a flag
of that section, is refused in one line (exit 2, nothing made); a run's own config.toml too."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from engine import rundir
from engine.config import RunConfig
from engine.errors import UserError
from harness import cli_fails, tree_snapshot

SECTIONS = [k for k, f in RunConfig.model_fields.items() if isinstance(f.annotation, type)
            and issubclass(f.annotation, BaseModel)]  # fmt: skip
VALUES = ['"gpt2-medium"', '"muon"', "12", "1.5", "true", "[1, 2]", '[{ n_layer = 2 }]']
A_FLAG = {"model": ["--n-layer", "1"], "data": [], "optim": ["--lr", "0.001"], "speed": ["--device", "cpu"],
          "train": ["--max-steps", "1"]}  # fmt: skip


def test_the_sections_are_known() -> None:
    assert set(SECTIONS) == set(A_FLAG) and len(SECTIONS) == 5


@pytest.mark.parametrize("section", SECTIONS)
def test_a_section_written_as_a_value_is_one_line(tmp_path: Path, tiny_dataset: Path, capsys, section) -> None:
    problems = []
    for i, value in enumerate(VALUES):
        config = tmp_path / f"c{i}.toml"
        config.write_text(f"{section} = {value}\n")
        for flags in ([], A_FLAG[section]):
            out = tmp_path / f"out{i}"
            argv = ["train", "--preset", "micro", "--config", str(config), "--data", str(tiny_dataset), "--device",
                    "cpu", "--precision", "fp32", "--max-steps", "1", "--out", str(out), *flags]  # fmt: skip
            before = tree_snapshot(tmp_path)
            try:
                cli_fails(capsys, argv, f"{section} = ", f"{section} is a section")
            except BaseException as err:  # noqa: BLE001 - a traceback or a silent run is what this finds
                problems.append(f"{section} = {value} {' '.join(flags)}: {type(err).__name__}: {str(err)[:160]}")
                continue
            if tree_snapshot(tmp_path) != before:
                problems.append(f"{section} = {value} {' '.join(flags)}: refused, but files were made")
    assert not problems, "\n".join(problems)


def test_a_model_preset_name_is_pointed_at_the_preset_flag(tmp_path: Path, tiny_dataset: Path, capsys) -> None:
    config = tmp_path / "c.toml"
    config.write_text('model = "gpt2-medium"\n')
    err = cli_fails(capsys, ["train", "--preset", "micro", "--config", str(config), "--data", str(tiny_dataset),
                             "--device", "cpu", "--n-layer", "1", "--max-steps", "1", "--out", str(tmp_path / "out")],
                    "--preset gpt2-medium")  # fmt: skip
    assert "[model]" in err


def test_a_run_config_with_a_section_as_a_value_is_one_line(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / rundir.CONFIG).write_text('preset = "micro"\ntrain = 3\n')
    with pytest.raises(UserError, match="train is a section") as err:
        rundir.load_config(run)
    assert len(str(err.value).splitlines()) == 1
