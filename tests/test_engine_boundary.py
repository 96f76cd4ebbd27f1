"""engine/ never imports textual: the TUI drives it through config, Control and events."""

import re
import subprocess
import sys
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[1] / "engine"


def test_no_textual_import_in_engine_sources():
    pattern = re.compile(r"^\s*(import textual|from textual)", re.M)
    offenders = [p.name for p in ENGINE.glob("*.py") if pattern.search(p.read_text())]
    assert offenders == []


def test_importing_every_engine_module_loads_no_textual():
    modules = [f"engine.{p.stem}" for p in ENGINE.glob("*.py") if p.stem != "__init__"]
    code = f"import sys, importlib\nfor m in {modules!r}: importlib.import_module(m)\nprint('textual' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
