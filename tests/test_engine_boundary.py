"""The import contract: engine/ never imports tui/ or textual (function-level imports
included), neither package has an import cycle, and each setting is described once."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _modules(package: str) -> dict[str, Path]:
    out = {}
    for p in (ROOT / package).rglob("*.py"):
        name = ".".join(p.relative_to(ROOT).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = p
    return out


def _imports(name: str, path: Path) -> set[str]:
    """Every module named by an import anywhere in the file (inside functions too)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)  # `from engine import rundir`
    return found


def _graph(package: str) -> dict[str, set[str]]:
    mods = _modules(package)
    graph = {}
    for name, path in mods.items():
        deps = {d for d in _imports(name, path) if d in mods and d != name}
        # `from engine import x` names the package only to reach x: not an edge to engine/__init__
        graph[name] = {d for d in deps if not any(o.startswith(d + ".") for o in deps)}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while (w := stack.pop()) != v:
                comp.append(w)
            if comp:
                out.append(sorted([v, *comp]))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_engine_imports_nothing_of_the_ui_anywhere_in_a_file():
    offenders = {
        name: sorted(d for d in _imports(name, path) if d.split(".")[0] in ("tui", "textual", "textual_plotext", "gpt2_tui"))
        for name, path in _modules("engine").items()
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_checker_sees_function_level_imports(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("def f():\n    from tui import app\n    import textual\n")
    assert {"tui", "tui.app", "textual"} <= _imports("engine.m", path)


def test_no_import_cycle_inside_engine_or_tui():
    assert _cycles(_graph("engine")) == []
    assert _cycles(_graph("tui")) == []
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]  # the check itself works


def test_importing_every_engine_module_loads_no_textual():
    modules = sorted(_modules("engine"))
    code = f"import sys, importlib\nfor m in {modules!r}: importlib.import_module(m)\nprint('textual' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False"


def test_cli_help_and_the_form_read_the_same_description_for_every_setting():
    """`train --help` shows each config field's own description, with a readable metavar."""
    from engine.cli import build_parser
    from engine.settings import flags
    from tui import form_model as fields

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
