"""One terminal boundary: everything engine/, tui/, bench/ and gpt2_tui.py write to a terminal goes
through engine/console.py (`out`, `err`), and so through engine.text's printable rule.

Two halves:
- a scan of the source (AST, not grep): no `print(`, `sys.stdout.write`, `sys.stderr.write`
  (or their `__stdout__`/`writelines` kin) or `os.write(1|2, ...)` outside engine/console.py and
  ALLOWED below; a planted module proves the scanner catches each kind;
- behaviour: real commands (`train`, `train --resume`, `prepare`, `export`) on run directories,
  inputs and outputs whose names hold ESC ] 0 ; x BEL (retitles a terminal) and ESC [ 2 J
  (clears it): nothing the command prints, on stdout or stderr (captured at the file
  descriptors), holds an ESC or a BEL.

bench/ is scanned too (issue 38): its tables are numbers, but its lines name paths the user gave
(`bench --to-loss --out DIR` printed an escape in DIR raw), so it goes through the console as well.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from engine import console
from gpt2_tui import main

ROOT = Path(__file__).resolve().parents[2]
SCANNED = [ROOT / "engine", ROOT / "tui", ROOT / "bench", ROOT / "gpt2_tui.py"]
BOUNDARY = "engine/console.py"  # the one module that writes to the streams

# "module.py:function" -> why it may write to a terminal itself. Keep it short: each entry
# must still match a write (test_every_allowed_entry_is_still_used), so none goes stale.
# Today every write goes through the console, so it is empty.
ALLOWED: dict[str, str] = {}

HOSTILE = "run\x1b]0;x\x07\x1b[2J"  # ESC ] 0 ; x BEL: a new window title; ESC [ 2 J: a cleared screen
MICRO = ["--preset", "micro", "--device", "cpu", "--precision", "fp32"]


# ------------------------------------------------------------------------------ the scanner


def _dotted(node: ast.AST) -> str:
    """`sys.stdout.write` for that attribute chain ('' for anything else)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


_STREAM_WRITES = {f"sys.{s}.{w}" for s in ("stdout", "stderr", "__stdout__", "__stderr__") for w in ("write", "writelines")}


def _terminal_write(call: ast.Call) -> str | None:
    """What this call writes to a terminal past the console, or None."""
    name = _dotted(call.func)
    if name in ("print", "builtins.print"):
        return "print("
    if name in _STREAM_WRITES:
        return name
    if name == "os.write" and call.args:
        fd = call.args[0]
        if isinstance(fd, ast.Constant) and fd.value in (1, 2):
            return f"os.write({fd.value}, ...)"
        if _dotted(fd.func if isinstance(fd, ast.Call) else fd) in ("sys.stdout.fileno", "sys.stderr.fileno"):
            return "os.write(sys.std*.fileno(), ...)"
    return None


def scan(path: str, source: str) -> list[tuple[str, int, str]]:
    """(`module.py:function`, line, what) for each write to a terminal in `source` that does
    not go through engine/console.py. `path`: the file, relative to the repository."""
    if path == BOUNDARY:
        return []
    module = Path(path).name
    found: list[tuple[str, int, str]] = []

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = where
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = child.name if where == "<module>" else f"{where}.{child.name}"
            if isinstance(child, ast.Call):
                what = _terminal_write(child)
                if what is not None:
                    found.append((f"{module}:{where}", child.lineno, what))
            visit(child, inner)

    visit(ast.parse(source, filename=path), "<module>")
    return found


def problems(path: str, source: str) -> list[str]:
    """The scan's findings less the allowed ones, each as `path:line: what in module.py:function`."""
    return [f"{path}:{line}: {what} in {key}" for key, line, what in scan(path, source) if key not in ALLOWED]


def _sources() -> list[tuple[str, str]]:
    files = [f for top in SCANNED for f in ([top] if top.is_file() else sorted(top.rglob("*.py")))]
    return [(f.relative_to(ROOT).as_posix(), f.read_text(encoding="utf-8")) for f in files]


def test_nothing_writes_to_a_terminal_past_the_console() -> None:
    found = [p for path, source in _sources() for p in problems(path, source)]
    assert found == [], "write through engine.console (out.line / err.line / out.json) instead:\n" + "\n".join(found)


def test_every_allowed_entry_is_still_used() -> None:
    used = {key for path, source in _sources() for key, _, _ in scan(path, source)}
    assert set(ALLOWED) <= used, f"stale ALLOWED entries: {sorted(set(ALLOWED) - used)}"


PLANTED = '''
import os, sys
from engine.console import out

def fine(x):
    out.line(x)
    os.write(7, b"a file")
    sys.stdout.flush()

def leaks(path):
    print(f"wrote {path}")

class Report:
    def show(self, line):
        sys.stderr.write(line)
        sys.__stdout__.writelines([line])
        os.write(2, line.encode())
        os.write(sys.stdout.fileno(), b"x")
'''


def test_the_scanner_catches_a_planted_write() -> None:
    found = problems("engine/planted.py", PLANTED)
    assert found == [
        "engine/planted.py:11: print( in planted.py:leaks",
        "engine/planted.py:15: sys.stderr.write in planted.py:Report.show",
        "engine/planted.py:16: sys.__stdout__.writelines in planted.py:Report.show",
        "engine/planted.py:17: os.write(2, ...) in planted.py:Report.show",
        "engine/planted.py:18: os.write(sys.std*.fileno(), ...) in planted.py:Report.show",
    ], found
    assert problems(BOUNDARY, PLANTED) == []  # the console itself is the boundary


# ------------------------------------------------------------------------------ the console


def test_console_lines_pass_the_printable_rule(capsys: pytest.CaptureFixture[str]) -> None:
    console.out.line(f"a\tb\nc {HOSTILE} \x9b1m \u202eevil")
    console.err.line(HOSTILE, flush=True)
    console.out.json({"name": HOSTILE, "bidi": "\u202e", "word": "héllo"})
    got = capsys.readouterr()
    lines = got.out.splitlines()
    assert lines[:2] == ["a\tb", "c run\u00b7]0;x\u00b7\u00b7[2J \u00b71m \u00b7evil"]  # newline, tab kept
    assert json.loads("\n".join(lines[2:])) == {"name": HOSTILE, "bidi": "\u202e", "word": "héllo"}
    assert "\\u001b" in got.out and "\\u202e" in got.out and "\\u00e9" in got.out
    assert got.err == "run\u00b7]0;x\u00b7\u00b7[2J\n"


def test_raw_is_the_one_path_that_passes_text_as_it_is(capsys: pytest.CaptureFixture[str]) -> None:
    console.out.raw(HOSTILE)
    assert capsys.readouterr().out == HOSTILE + "\n"


def test_a_progress_label_is_printable_plain_text() -> None:
    assert console.progress_label(f"{HOSTILE}\n[bold]x") == "run\u00b7]0;x\u00b7\u00b7\\[2J \\[bold]x"


def test_python_warnings_are_formatted_through_the_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    import warnings

    monkeypatch.setattr(warnings, "formatwarning", warnings.formatwarning)  # put back afterwards
    console.route_warnings()  # what `gpt2-tui ...` and `python -m engine.cli ...` do first
    assert warnings.formatwarning is console.format_warning
    said = warnings.formatwarning(f"bad file {HOSTILE}", UserWarning, f"/x/{HOSTILE}.py", 3)
    assert "UserWarning: bad file run" in said and "\x1b" not in said and "\x07" not in said


# ------------------------------------------------------------------------------ the commands


def _clean(capfd: pytest.CaptureFixture[str]) -> str:
    """Both streams, captured at the file descriptors (rich, C code, anything): no ESC, no BEL."""
    got = capfd.readouterr()
    both = got.out + got.err
    assert "\x1b" not in both and "\x07" not in both, both
    return both


@pytest.mark.slow
def test_train_and_resume_print_a_hostile_run_directory_escaped(tmp_path: Path, tiny_dataset: Path, capfd) -> None:
    run = tmp_path / HOSTILE
    assert main(["train", *MICRO, "--data", str(tiny_dataset), "--out", str(run), "--max-steps", "2",
                 "--ckpt-interval", "2"]) == 0  # fmt: skip
    said = _clean(capfd)
    assert "run directory: " in said and "\\x1b]0;x\\x07\\x1b[2J" in said  # escaped, so still findable
    assert main(["train", "--resume", str(run), "--max-steps", "3"]) == 0
    said = _clean(capfd)
    assert "run completed at step 3" in said and f"run directory: {tmp_path}/run\\x1b]0;x\\x07\\x1b[2J" in said

    pytest.importorskip("transformers")
    hf = tmp_path / f"model{HOSTILE}"
    assert main(["export", str(run), "--hf", str(hf)]) == 0
    said = _clean(capfd)
    assert f"wrote {tmp_path}/modelrun\\x1b]0;x\\x07\\x1b[2J: " in said


def test_prepare_prints_hostile_names_escaped(tmp_path: Path, capfd) -> None:
    corpus = tmp_path / f"corpus{HOSTILE}"
    corpus.mkdir()
    for i in range(4):
        (corpus / f"doc{i}{HOSTILE}.txt").write_text(f"def function_{i}(x):\n    return x * {i} + 1\n" * 30)
    (corpus / f"binary{HOSTILE}.txt").write_bytes(b"\x00\x01\xff\xfe" * 50)  # skipped: its name is printed
    out = tmp_path / f"data{HOSTILE}"
    assert main(["prepare", str(corpus), "--out", str(out), "--vocab-size", "300"]) == 0
    said = _clean(capfd)
    assert "wrote " in said and "datarun\\x1b]0;x\\x07\\x1b[2J" in said and "skipped 1 files" in said
    assert (out / "train.bin").is_file() or any(out.iterdir())

    assert main(["prepare", str(corpus), "--out", str(out), "--vocab-size", "300"]) == 2  # not empty: refused
    said = _clean(capfd)
    assert said.startswith("error: ")
