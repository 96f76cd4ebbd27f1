"""The one terminal boundary: every line the engine, the CLI and the app write to a terminal
goes through `out` (stdout: a command's result) or `err` (stderr: progress, notes, warnings,
errors), and so through engine.text's printable rule: control characters (ESC, BEL, CR, C1,
bidi overrides) never reach the terminal raw; newlines and tabs stay. A foundation: it imports
engine.text and the standard library only.

    out.line(f"wrote {path_text(out_dir)}")   a line (paths: path_text first, so they stay findable)
    err.line("note: ...", flush=True)        the same on stderr
    out.json(obj)                            JSON, ASCII-escaped (control characters as \\u001b)
    out.raw(text)                            the one raw path: `gpt2-tui sample --raw` (or a pipe)

tests/robustness/test_terminal_boundary.py holds engine/, tui/ and gpt2_tui.py to it: no
print( or sys.stdout/stderr.write elsewhere.
"""

from __future__ import annotations

import json as _json
import sys
import warnings
from typing import Any, TextIO

from engine.text import printable, shown


class Console:
    """A text stream behind the printable rule. Built on a stream, or on the name of one of
    sys's ("stdout", "stderr"), looked up at each write (pytest and redirect_stdout swap it)."""

    def __init__(self, stream: TextIO | str = "stdout") -> None:
        self._stream = stream

    @property
    def stream(self) -> TextIO:
        s = self._stream
        return getattr(sys, s) if isinstance(s, str) else s

    def _write(self, text: str, flush: bool) -> None:
        stream = self.stream
        stream.write(text)
        if flush:
            stream.flush()

    def line(self, text: object = "", flush: bool = False) -> None:
        """`text` (any object, as str() words it) and a newline, made printable."""
        self._write(printable(str(text)) + "\n", flush)

    def json(self, obj: Any, indent: int | None = 1, flush: bool = False) -> None:
        """`obj` as JSON: ensure_ascii, so every control or non-ASCII character is a \\u escape."""
        self._write(_json.dumps(obj, indent=indent, ensure_ascii=True) + "\n", flush)

    def raw(self, text: str, flush: bool = False) -> None:
        """The text as it is, control characters included: only for `gpt2-tui sample --raw`
        (or sample's stdout when it is no terminal), which documents that it does so."""
        self._write(text + "\n", flush)

    def isatty(self) -> bool:
        try:
            return bool(self.stream.isatty())
        except (AttributeError, ValueError):  # a closed or bare stream
            return False

    def flush(self) -> None:
        self.stream.flush()


out = Console("stdout")
err = Console("stderr")


def progress_label(text: str) -> str:
    """A label for a rich progress bar (prepare's, the Hub's): printable on one line, and its
    '[' escaped, since rich reads a task's description as markup."""
    return shown(text).replace("[", "\\[")


_stdlib_format = warnings.formatwarning


def format_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                   line: str | None = None) -> str:  # fmt: skip
    """warnings.formatwarning through the rule: a warning may quote a file's name or its text."""
    return printable(_stdlib_format(message, category, filename, lineno, line))


def route_warnings() -> None:
    """Python's warnings reach stderr through the rule (the commands call it at their start).
    Their formatting is replaced, not their display: whoever records them (pytest, a
    catch_warnings(record=True)) still does."""
    warnings.formatwarning = format_warning
