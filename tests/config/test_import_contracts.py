"""The import contract: engine/ never imports tui/, textual, bench/ or gpt2_tui (function-level
imports included), the foundations keep their order, neither engine nor tui has an import cycle
(pyproject's [tool.importlinter], checked by `lint-imports`), and each setting is described once."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = str(Path(sys.executable).parent / "lint-imports")


def _lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([LINT_IMPORTS, "--no-cache", "--no-logo"], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(cwd)})  # fmt: skip


@pytest.mark.slow
def test_the_import_contracts_hold():
    out = _lint_imports(ROOT)
    assert out.returncode == 0 and "7 kept, 0 broken" in out.stdout, out.stdout + out.stderr


def test_engine_keeps_few_flat_modules():
    """engine/'s top holds the foundations, api.py and __init__.py; a domain's module goes in its package.
    (15: the process boundary, child.py, joined the file boundary as a foundation.)"""
    flat = sorted(p.name for p in (ROOT / "engine").glob("*.py"))
    assert len(flat) <= 15, flat


@pytest.mark.slow
def test_the_contracts_see_function_level_imports_and_cycles(tmp_path):
    """The same contracts on a copy of the tree with the breaches planted inside functions."""
    for name in ("engine", "tui", "bench"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    (tmp_path / "engine" / "planted_ui.py").write_text("def f():\n    from tui import app\n    import textual\n")
    (tmp_path / "engine" / "planted_bench.py").write_text("def f():\n    from bench import ladder\n")
    (tmp_path / "engine" / "planted_a.py").write_text("def f():\n    from engine import planted_b\n")
    (tmp_path / "engine" / "planted_b.py").write_text("from engine import planted_a\n")
    errors = tmp_path / "engine" / "errors.py"  # the bottom foundation reaching up to the one above it
    errors.write_text(errors.read_text() + "\n\ndef planted():\n    from engine import files\n")
    up = len(errors.read_text().splitlines())
    out = _lint_imports(tmp_path)
    assert out.returncode == 1 and "4 kept, 3 broken" in out.stdout, out.stdout + out.stderr
    for line in ("engine.planted_ui -> tui.app (l.2)", "engine.planted_ui -> textual (l.3)",
                 "engine.planted_bench -> bench.ladder (l.2)", "No cycles are allowed in engine",
                 ".planted_a (1 import)", f"engine.errors -> engine.files (l.{up})"):  # fmt: skip
        assert line in out.stdout, out.stdout


def test_cli_help_and_the_form_read_the_same_description_for_every_setting():
    """`train --help` shows each config field's own description, with a readable metavar."""
    from engine.cli import build_parser
    from engine.settings import flags
    from tui.models import form as fields

    parser, sub = build_parser()
    train = sub.choices["train"]
    by_dest = {a.dest: a for a in train._actions}
    for s in flags():
        action = by_dest[s.dotted]
        assert action.help.replace("%%", "%") == s.help and s.help, s.dotted
        assert action.metavar is None or "." not in action.metavar and "__" not in action.metavar
    for dotted in fields.ALL_FIELDS:
        assert fields.setting(dotted).help == by_dest[dotted].help.replace("%%", "%")
    text = train.format_help()
    from engine.settings import SECTIONS

    assert not [sec for sec in SECTIONS if f"{sec.upper()}." in text or f"{sec.upper()}__" in text]


def test_every_name_of_the_apps_surface_resolves():
    """engine.api is the app's whole view of the engine: each name it lists loads, and a name
    it does not list is an AttributeError that says where to add it."""
    import pytest

    import engine.api as api

    for name in api.__all__:
        assert getattr(api, name) is not None, name
    with pytest.raises(AttributeError, match="_SURFACE"):
        api.Trainer  # noqa: B018  (the segment class is not the app's business)
