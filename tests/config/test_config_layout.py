"""engine/config.py is the page everyone reads first (issue 36): no line over 100 characters, and
each setting's Field(...) one argument a line, so a setting's bounds, words and form metadata
read down the page instead of off its right edge."""

from __future__ import annotations

import ast
from pathlib import Path

CONFIG = Path(__file__).resolve().parents[2] / "engine" / "config.py"
WIDTH = 100


def _crowded_fields(source: str) -> list[int]:
    """Lines of Field(...) calls where two arguments start on one line (or one on the call's)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Field":
            lines = [node.lineno] + [a.lineno for a in node.args] + [k.lineno for k in node.keywords]
            if len(set(lines)) != len(lines):
                out.append(node.lineno)
    return out


def test_no_line_of_the_config_is_over_100_characters():
    long = [f"{n}: {len(line)}" for n, line in enumerate(CONFIG.read_text().splitlines(), 1) if len(line) > WIDTH]
    assert not long, f"engine/config.py lines over {WIDTH} characters (line: length): {', '.join(long)}"


def test_each_field_takes_one_argument_a_line():
    assert _crowded_fields(CONFIG.read_text()) == []
    assert _crowded_fields('x: int = Field(1, ge=0,\n    description="a")\n') == [1]  # the check sees a crowded one
