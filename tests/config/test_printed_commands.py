"""A printed command is one that works (issue 39): each suggestion the CLI prints is run here
as printed, and must train. Also: no flag is abbreviated, an unknown flag points at its
subcommand's --help, `toggle` names a setting that is no live switch, a resume with nothing left
to train is one line (its advice keeping the flags given), and a run's closing summary never
calls a segment too short to settle "settled".

Every run is the micro preset on CPU (a few steps, seconds).
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

import pytest

from engine import rundir
from engine.config import resolve
from engine.run.owner import start
from engine.text import program
from gpt2_tui import build_parser, main

FLAGS = {"speed.device": "cpu", "speed.precision": "fp32", "train.eval_interval": 100, "train.sample_tokens": 0}


def trained(run_dir: Path, data: Path, steps: int) -> Path:
    start(resolve("micro", None, FLAGS | {"data.path": str(data), "train.max_steps": steps}), run_dir).run()
    return run_dir


def refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """The one line a refused command prints: exit 2, nothing on stdout, no traceback."""
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's refusals leave this way
        code = exit_.code
    said = capsys.readouterr()
    assert code == 2, said
    assert said.out == "", said.out  # nothing said before the refusal (no "run directory: ..." first)
    lines = said.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in said.err, said.err
    return lines[0]


def printed_command(line: str) -> list[str]:
    """The gpt2-tui command a line prints (after `program()`), as the argv it runs with."""
    prog = program()
    assert prog in line, line
    words = shlex.split(line.split(prog, 1)[1].split("; see `", 1)[0])
    return words


def runs(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    code = main(argv)
    said = capsys.readouterr()
    assert code == 0, f"{argv}: exit {code}\n{said.err}"
    return said.out


def test_no_flag_is_abbreviated_by_any_parser(capsys: pytest.CaptureFixture[str]) -> None:
    parser, _ = build_parser()
    parsers = [parser] + [p for a in parser._actions if isinstance(a, argparse._SubParsersAction)
                          for p in a.choices.values()]  # fmt: skip
    assert [p.prog for p in parsers if p.allow_abbrev] == []
    line = refused(capsys, ["train", "--max-step", "3"])
    assert "unrecognized arguments: --max-step 3" in line and "did you mean --max-steps?" in line, line


def test_an_unknown_flag_points_at_the_subcommands_help(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    line = refused(capsys, ["toggle", str(tmp_path), "--bogus"])
    assert "unrecognized arguments: --bogus" in line and line.endswith("see `gpt2-tui toggle --help`"), line
    line = refused(capsys, ["train", "--bogus"])
    assert line.endswith("see `gpt2-tui train --help`"), line


@pytest.mark.slow
def test_toggle_names_a_setting_that_is_no_live_switch_and_the_new_run_that_trains_with_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, tiny_dataset: Path
) -> None:
    run_dir = trained(tmp_path / "run", tiny_dataset, 2)
    line = refused(capsys, ["toggle", str(run_dir), "--optimizer", "muon"])
    assert "--optimizer is not a live switch" in line and "unrecognized" not in line, line
    assert line.endswith("see `gpt2-tui toggle --help`"), line
    argv = printed_command(line)
    assert argv[0] == "train" and argv[-2:] == ["--optimizer", "muon"], argv
    runs(capsys, argv)
    new = Path(argv[argv.index("--out") + 1])
    assert new != run_dir and rundir.load_config(new).optim.optimizer == "muon"
    assert (new / rundir.CHECKPOINTS / "step_000002.pt").is_file()


@pytest.mark.slow
def test_toggle_on_a_finished_run_suggests_a_resume_that_trains(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, tiny_dataset: Path
) -> None:
    run_dir = trained(tmp_path / "run", tiny_dataset, 2)
    line = refused(capsys, ["toggle", str(run_dir), "--no-vectorized"])
    assert "no live run writes" in line, line
    argv = printed_command(line)
    assert argv[:3] == ["train", "--resume", str(run_dir)] and "--no-vectorized" in argv, argv
    runs(capsys, argv)  # the advice as printed: it trains (a resume to the same max steps would not)
    config = rundir.load_config(run_dir)
    assert config.data.vectorized is False and (run_dir / rundir.CHECKPOINTS / "step_000004.pt").is_file()


@pytest.mark.slow
def test_resuming_a_finished_run_is_one_line_whose_advice_keeps_the_flags_given(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, tiny_dataset: Path
) -> None:
    run_dir = trained(tmp_path / "run", tiny_dataset, 2)
    for given in (["--no-vectorized"], ["--max-steps", "2", "--no-vectorized"]):
        line = refused(capsys, ["train", "--resume", str(run_dir), *given])
        assert "nothing is left to train" in line, line
        argv = printed_command(line)
        assert "--no-vectorized" in argv and argv[argv.index("--max-steps") + 1] == "4", argv
    runs(capsys, argv)
    assert rundir.load_config(run_dir).data.vectorized is False


@pytest.mark.slow
def test_the_closing_summary_never_calls_a_segment_too_short_to_settle_settled(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, tiny_dataset: Path
) -> None:
    run_dir = trained(tmp_path / "run", tiny_dataset, 4)  # 4 step reports: it settles
    out = runs(capsys, ["train", "--resume", str(run_dir), "--max-steps", "5", "--no-vectorized"])  # 1 step
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("run completed at step 5"))
    assert lines[at + 1].startswith("the last segment (from step 4) has 1 step report, too few to settle"), lines[at:]
    assert lines[at + 1].endswith("the last settled segment instead (steps 0-4):"), lines[at:]
    assert lines[at + 2].startswith("settled speed: "), lines[at:]


@pytest.mark.slow
def test_sample_ends_its_text_with_a_newline(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                             tiny_dataset: Path) -> None:  # fmt: skip
    from harness import write_tokenizer

    run_dir = trained(tmp_path / "run", tiny_dataset, 1)
    write_tokenizer(tmp_path / "tokenizer.json")
    for raw in ([], ["--raw"]):
        out = runs(capsys, ["sample", str(run_dir), "--max-new-tokens", "5", "--seed", "1",
                            "--tokenizer", str(tmp_path / "tokenizer.json"), *raw])  # fmt: skip
        assert out.endswith("\n") and out.strip(), repr(out)
