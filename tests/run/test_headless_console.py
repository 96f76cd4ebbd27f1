"""What a headless user sees: samples and an ETA in `train`'s console, and which checkpoint
`sample` used. One real micro run on a small prepared text dataset (with a tokenizer, so the
run samples) serves every test."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from engine import events as ev
from engine.text import SAMPLE_CHARS, duration_text, loss_text, printable
from gpt2_tui import main

MICRO = ["--preset", "micro", "--device", "cpu", "--precision", "fp32"]
MAX_STEPS = 8


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A finished 8-step run that evals and samples every 4 steps, and its console output."""
    from engine.prep.prepare import prepare_report

    root = tmp_path_factory.mktemp("headless")
    text = root / "text"
    text.mkdir()
    for i in range(6):
        (text / f"doc{i}.txt").write_text(f"def function_{i}(x):\n    return x * {i} + 1\n" * 40)
    prepare_report([text], root / "data", vocab_size=300, progress=False).info
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["train", *MICRO, "--data", str(root / "data"), "--out", str(root / "run"),
                     "--max-steps", str(MAX_STEPS), "--eval-interval", "4", "--ckpt-interval", "4",
                     "--log-interval", "1", "--sample-tokens", "24"])  # fmt: skip
    assert code == 0, out.getvalue()
    return root / "run", out.getvalue()


def _events(run_dir: Path) -> list[ev._Event]:
    events, problems = ev.read_events(run_dir / "events.jsonl")
    assert not problems
    return events


@pytest.mark.slow
def test_console_prints_each_sample_indented_under_a_header(run: tuple[Path, str]) -> None:
    run_dir, out = run
    samples = [e for e in _events(run_dir) if isinstance(e, ev.Sample)]
    assert [s.step for s in samples] == [4, 8]  # an eval (and its sample) every 4 steps, none before the first step
    lines = out.splitlines()
    for s in samples:
        at = lines.index(f"sample at step {s.step}:")
        first = printable(s.text).split("\n")[0].rstrip()
        assert lines[at + 1] == "    " + first  # the text itself follows, indented
    assert "\x1b" not in out


@pytest.mark.slow
def test_step_lines_carry_the_eta_of_the_settled_step_time(run: tuple[Path, str]) -> None:
    run_dir, out = run
    steps = [e for e in _events(run_dir) if isinstance(e, ev.Step)]
    lines = [line for line in out.splitlines() if line.startswith("step ")]
    assert len(lines) == len(steps) == MAX_STEPS
    for n, (e, line) in enumerate(zip(steps, lines), 1):
        times = [s.step_time_s for s in steps[:n]]
        if n < ev.ETA_MIN_REPORTS or e.step == MAX_STEPS:  # no basis yet; nothing left at the end
            assert "eta" not in line, line
        else:
            left = (MAX_STEPS - e.step) * ev.settled_step_time(times)
            assert line.endswith(f" | eta {duration_text(left)}"), line


@pytest.mark.slow
def test_a_toggle_starts_the_eta_afresh_and_no_max_steps_means_none(run: tuple[Path, str]) -> None:
    """A new segment runs at another speed: the old step times are no basis for the ETA."""
    run_dir, _ = run
    events = _events(run_dir)
    first_step = next(i for i, e in enumerate(events) if isinstance(e, ev.Step))
    toggle = ev.Segment(step=4, switches={}, changed={"speed.compile": [False, True]}, reason="toggle")
    out = io.StringIO()
    sink = ev.ConsoleSink(out)
    for e in events[: first_step + 4] + [toggle] + events[first_step + 4 :]:
        sink.emit(e)
    steps = [line for line in out.getvalue().splitlines() if line.startswith("step ")]
    assert ["eta" in line for line in steps] == [False, False, True, True, False, False, True, False]
    bare = io.StringIO()  # steps without a run_started: max_steps unknown
    sink = ev.ConsoleSink(bare)
    for e in events:
        if isinstance(e, ev.Step):
            sink.emit(e)
    assert bare.getvalue().count("step ") == MAX_STEPS and "eta" not in bare.getvalue()


def test_console_sample_is_made_safe_and_trimmed() -> None:
    text = "\x1b[2J\x1b]0;owned\x07wiped\r\nok\tline\x9b31m\u202eevil\n" + "".join(f"line {i}\n" for i in range(50))
    out = io.StringIO()
    ev.ConsoleSink(out).emit(ev.Sample(step=7, text=text))
    shown = out.getvalue().splitlines()
    assert shown[0] == "sample at step 7:"
    assert shown[1:] == [
        "    \u00b7[2J\u00b7]0;owned\u00b7wiped",
        "    ok\tline\u00b731m\u00b7evil",
        "    line 0", "    line 1", "    line 2", "    line 3",
        "    ...",
    ]  # fmt: skip
    long = io.StringIO()
    ev.ConsoleSink(long).emit(ev.Sample(step=1, text="x" * 5000))
    assert long.getvalue() == "sample at step 1:\n    " + "x" * SAMPLE_CHARS + "\n    ...\n"
    empty = io.StringIO()
    ev.ConsoleSink(empty).emit(ev.Sample(step=2, text="\n\n"))
    assert empty.getvalue() == "sample at step 2:\n    (empty)\n"


@pytest.mark.slow
def test_sample_names_the_checkpoint_and_step_on_stderr(run: tuple[Path, str], capsys) -> None:
    run_dir, _ = run
    val = {e.step: e.val_loss for e in _events(run_dir) if isinstance(e, ev.Eval)}
    latest = run_dir / "checkpoints" / "step_000008.pt"
    assert main(["sample", str(run_dir), "--prompt", "def ", "--max-new-tokens", "8", "--seed", "1"]) == 0
    got = capsys.readouterr()
    assert got.err == f"sampling from {latest} (step 8, val loss {loss_text(val[8])})\n"
    assert got.out.startswith("def ") and "sampling" not in got.out  # stdout: the text alone
    older = run_dir / "checkpoints" / "step_000004.pt"
    assert main(["sample", str(older), "--max-new-tokens", "4", "--seed", "1"]) == 0
    assert capsys.readouterr().err == f"sampling from {older} (step 4, val loss {loss_text(val[4])})\n"


def test_duration_text() -> None:
    assert [duration_text(s) for s in (0.2, 42, 754, 3725, 90000)] == ["0s", "42s", "12m34s", "1h02m", "25h00m"]
    assert re.fullmatch(r"\d+s", duration_text(59.4))
