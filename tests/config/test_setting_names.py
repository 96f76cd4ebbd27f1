"""Every dotted setting name written as a string in engine/, tui/ and bench/ ("speed.compile" as
a value, a dict key, or inside a message) names a real setting (issue 36): the code addresses
settings by these strings in hundreds of places, and a typo there is silently a different key.
The sections come from RunConfig itself, the names from engine.settings' registry."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from pydantic import BaseModel

from engine.config import RunConfig
from engine.settings import all_settings

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("engine", "tui", "bench")
SECTIONS = tuple(name for name, f in RunConfig.model_fields.items()
                 if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel))  # fmt: skip
KNOWN = frozenset(s.dotted for s in all_settings())
# Strings shaped like a setting that are file names the code reads or writes, not settings.
FILE_NAMES = frozenset({"train.bin", "model.safetensors", "train.py", "model.py"})  # the last two: nanoGPT's
# "section.name" standing alone in a string (a sentence's full stop may follow): not part of a
# longer dotted path ("config.speed.compile", "speed.compile.x"), a path or a call ("model.n_params(").
DOTTED = re.compile(rf"(?<![\w./])(?:{'|'.join(SECTIONS)})\.[A-Za-z_]\w*(?![\w/(]|\.\w)")


def setting_names(source: str) -> list[tuple[int, str]]:
    """(line, name) of every dotted setting-shaped name in a string constant of `source`: plain
    strings, dict keys and the literal parts of f-strings (all ast.Constant nodes)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [(node.lineno, m.group(0)) for m in DOTTED.finditer(node.value)]
    return sorted(found)


def unknown_names(source: str) -> list[tuple[int, str]]:
    return sorted((line, name) for line, name in setting_names(source) if name not in KNOWN | FILE_NAMES)


def _scanned_files() -> list[Path]:
    return sorted(p for top in SCANNED for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts)


def test_the_sections_are_read_from_runconfig():
    assert set(SECTIONS) == {"model", "data", "optim", "speed", "train"}
    assert {name.split(".")[0] for name in KNOWN} == set(SECTIONS)


def test_every_dotted_setting_name_in_the_code_is_a_real_setting():
    bad, seen = [], 0
    for path in _scanned_files():
        source = path.read_text(encoding="utf-8")
        seen += len(setting_names(source))
        bad += [f"{path.relative_to(ROOT)}:{line}: {name!r}" for line, name in unknown_names(source)]
    assert not bad, "dotted names that are no setting (engine.settings):\n" + "\n".join(bad)
    assert seen > 200  # the scan reads the code's hundreds of setting names, not nothing


def test_the_scan_fails_on_a_planted_typo():
    planted = '''
over = {"speed.compil": True, "train.batch_size": 8}
name = "optim.lerning_rate"
hint = f"set data.preload or {x}, then model.n_layr=2 or --speed.precison."
ok = ("config.speed.compile", "data/train.bin", "model.n_params()", "speed.compile")
'''
    assert unknown_names(planted) == [
        (2, "speed.compil"), (3, "optim.lerning_rate"), (4, "model.n_layr"), (4, "speed.precison")
    ]
    assert [name for _, name in setting_names(planted)].count("speed.compile") == 1
