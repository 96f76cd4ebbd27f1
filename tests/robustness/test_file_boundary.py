"""One file boundary that code cannot route around: engine/files.py is the only product module
that opens, reads, writes, renames or removes a file by path itself (bounded reads, regular files
only, no links followed, atomic O_EXCL writes, created directories checked). Everything else goes
through it, or stands on ALLOWED below, keyed by module and enclosing function, with why it is
safe. The scan is an AST walk, so a new raw `open(` anywhere in the product fails this test."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BOUNDARY = "engine/files.py"

# module-level functions that open/read/write/move/remove a file by path
FORBIDDEN = {
    "open", "io.open", "builtins.open", "os.open", "os.fdopen", "gzip.open", "bz2.open", "lzma.open",
    "json.load", "tomllib.load", "pickle.load", "pickle.dump", "marshal.load",
    "numpy.fromfile", "numpy.memmap", "numpy.load", "numpy.save", "numpy.savez", "numpy.savetxt", "numpy.loadtxt",
    "torch.load", "torch.save", "safetensors.torch.load_file", "safetensors.torch.save_file", "safetensors.safe_open",
    "os.rename", "os.renames", "os.replace", "os.unlink", "os.remove", "os.rmdir", "os.removedirs",
    "os.makedirs", "os.mkdir", "os.link", "os.symlink", "os.truncate",
    # libraries that open a path themselves (issue 38): give them bytes read under the cap instead
    "tokenizers.Tokenizer.from_file", "torch.from_file", "numpy.lib.format.open_memmap", "safetensors.numpy.load_file",
    "datasets.load_dataset", "datasets.load_from_disk", "huggingface_hub.snapshot_download",
    "huggingface_hub.hf_hub_download",
}  # fmt: skip
# library entry points that open a path, whatever reaches them (an imported class, a module held in
# a variable): `Tokenizer.from_file(p)`, `GPT2LMHeadModel.from_pretrained(p)`, `st.load_file(p)`
LIBRARY_METHODS = {
    "from_file", "from_pretrained", "load_file", "safe_open", "memmap", "open_memmap", "load_dataset",
    "load_from_disk", "snapshot_download", "hf_hub_download",
}  # fmt: skip
SHUTIL_HARMLESS = {"which", "disk_usage", "get_terminal_size"}  # every other shutil.* moves files
# methods of a path or an array that open, read, write, move or remove a file (a pathlib.Path's,
# an ndarray's tofile, a safetensors module reached through a variable)
METHODS = {
    "open", "read_text", "read_bytes", "write_text", "write_bytes", "mkdir", "unlink", "rename", "rmdir",
    "touch", "symlink_to", "hardlink_to", "tofile", "save_file", *LIBRARY_METHODS,
}  # fmt: skip
# Path.replace(target) takes one argument; str.replace takes two or more, datetime.replace keywords.
# A `.save(...)` on anything but our own objects (`self...`) is a library writing a path itself
# (tokenizers' `Tokenizer.save(path)` follows a planted link): give it bytes to write instead.
# Known gap, by design of a name-based scan: a module reached through a variable other than the
# names above.

# "module:function" -> why its raw file call is safe. Keep it short; prefer a helper in engine/files.py.
ALLOWED: dict[str, str] = {
    "engine/config.py:_packaged_preset": "reads our own packaged preset TOML through importlib.resources, no user path",
    "engine/cli/__init__.py:_guarded": "opens os.devnull to silence stdout after a reader left the pipe",
    "engine/train/checkpoint.py:atomic_save.write": "torch.save into the O_EXCL temp file files.atomic_write opened",
    "engine/train/checkpoint.py:load": "torch.load(weights_only=True) of a file object files.open_read opened (regular, bounded)",
    "engine/prep/hf.py:_download": "huggingface_hub's snapshot into its own cache (its locks, renames); read via files",
    "engine/prep/hub.py:_stream": "datasets streams the user's own corpus (--data-files), as prepare reads it: no cap fits",
    "engine/prep/hf.py:export": "safetensors save_file into the temp directory files.make_new_dir made for this export",
    "engine/rundir.py:lock": "O_NOFOLLOW|O_DIRECTORY fd and writer.lock fd held for flock; the link check runs first",
    "engine/run/requests.py:Mailbox.take": "the mailbox needs flock and an in-place rewrite: O_NOFOLLOW|O_NONBLOCK, regular-file and size checks",
    "engine/run/requests.py:Mailbox.settle": "rewrites the mailbox under flock like take: O_NOFOLLOW|O_NONBLOCK, own-file and size checks",
    "engine/run/requests.py:post": "appends under flock: O_NOFOLLOW|O_NONBLOCK|O_APPEND, regular-file check",
    "engine/inspect/runs.py:_scan": "os.fdopen of the fd files.open_regular opened (regular, capped, not a link)",
    # the app (it reaches the engine only through engine.api; not yet routed through api.files)
    "tui/overhead.py:run_headless_cli": "a measuring tool writing a config beside a run in its own mkdtemp root",
    "tui/overhead.py:main": "removes the mkdtemp root this measuring tool made",
    "tui/screens/setup.py:SetupScreen.action_save_config.where.write": "mkdir of the runs' root before api.atomic_write_bytes writes the file",
    "tui/session.py:_proc_status": "reads the kernel's /proc/PID/status of a child this app spawned",
    "tui/session.py:RunSession.poll": "unlinks the mkstemp config file this session wrote for its child",
    # the measuring tools: write reports into the --out directory the user picks, read their own reports
    "bench/best.py:sweep": "mkdir of the measuring tool's own --out directory",
    "bench/compile_warmup.py:main": "mkdir of the measuring tool's own --out directory",
    "bench/gpu_report.py:run": "mkdir of the measuring tool's own --out directory",
    "bench/ladder.py:run_ladder": "mkdir of its --out directory; removes that --out again when stopped before any rung wrote to it",
    "bench/memory_check.py:_synthetic_dataset": "writes a synthetic dataset into a directory under its own workdir",
    "bench/nanogpt.py:step_times": "copies nanoGPT's three files and writes our tokens into its own TemporaryDirectory",
    "bench/plain.py:run": "mkdir of the measuring tool's own --out directory",
    "bench/timeline.py:run": "mkdir of the measuring tool's own --out directory",
}


def _qualnames(tree: ast.AST) -> dict[ast.AST, str]:
    """Each call node -> the dotted name of the functions (and classes) around it."""
    out: dict[ast.AST, str] = {}

    def walk(node: ast.AST, scope: tuple[str, ...]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                walk(child, (*scope, child.name))
            else:
                if isinstance(child, ast.Call):
                    out[child] = ".".join(scope) or "<module>"
                walk(child, scope)

    walk(tree, ())
    return out


def _imports(tree: ast.AST) -> dict[str, str]:
    """Local names bound by imports anywhere in the module -> what they name (numpy, os.replace)."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                names[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


def _dotted(node: ast.expr) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


def file_calls(path: str, source: str) -> list[tuple[str, int, str]]:
    """Every raw file call in `source` (module `path`): (module:function, line, call)."""
    tree = ast.parse(source, path)
    imported = _imports(tree)
    scopes = _qualnames(tree)
    found = []
    for call, scope in scopes.items():
        func = call.func
        what = None
        parts = _dotted(func)
        if parts and parts[0] in imported:  # a module's function (or one imported by name)
            full = ".".join([imported[parts[0]], *parts[1:]])
            full = full.replace("np.", "numpy.", 1) if full.startswith("np.") else full
            top, _, name = full.rpartition(".")
            if full in FORBIDDEN or (top == "shutil" and name not in SHUTIL_HARMLESS):
                what = full
            elif len(parts) > 1 and name in LIBRARY_METHODS and full.split(".")[0] not in ("engine", "tui", "bench"):
                # an imported class's path-opener (X.from_pretrained); our own modules' functions are scanned where they are
                what = full
            elif len(parts) > 1 and len(parts[0]) > 1 and parts[0].isupper():
                what = _method(call)  # a path constant imported from another module: CACHE.mkdir()
        elif isinstance(func, ast.Name):
            if func.id == "open":
                what = "open"
        elif isinstance(func, ast.Attribute):
            what = _method(call)
        if what:
            found.append((f"{path}:{scope}", call.lineno, what))
    return found


def _method(call: ast.Call) -> str | None:
    assert isinstance(call.func, ast.Attribute)
    name = call.func.attr
    if name == "open" and call.args and not (isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str)):
        return None  # Path.open() takes a mode string or nothing; `run.open(config, ...)` is no file
    if name in METHODS:
        return f".{name}()"
    if name == "save" and ((_dotted(call.func.value) or ["?"])[0] != "self"):
        return ".save()"  # a library object's own writer (tok.save(path)); ours are reached through self
    if name == "replace" and len(call.args) == 1 and not call.keywords:
        return ".replace()"
    return None


def violations(path: str, source: str) -> list[str]:
    """The raw file calls of module `path` that are neither in the boundary nor allowed."""
    if path == BOUNDARY:
        return []
    return [f"{where} line {line}: {what}" for where, line, what in file_calls(path, source) if where not in ALLOWED]


def product_files() -> list[str]:
    files = [*ROOT.glob("engine/**/*.py"), *ROOT.glob("tui/**/*.py"), *ROOT.glob("bench/**/*.py"), ROOT / "gpt2_tui.py"]
    return sorted(p.relative_to(ROOT).as_posix() for p in files)


def test_no_raw_file_call_outside_the_boundary() -> None:
    bad = [v for rel in product_files() for v in violations(rel, (ROOT / rel).read_text(encoding="utf-8"))]
    assert not bad, "raw file calls outside engine/files.py (route them through it, or allow-list with a reason):\n" + "\n".join(bad)


def test_every_allowed_entry_is_used_and_says_why() -> None:
    used = {where for rel in product_files() for where, _, _ in file_calls(rel, (ROOT / rel).read_text(encoding="utf-8"))}
    stale = sorted(set(ALLOWED) - used)
    assert not stale, f"allow-list entries with no raw file call left (remove them): {stale}"
    for key, why in ALLOWED.items():
        assert why.strip() and "\n" not in why, key


def test_the_boundary_itself_is_scanned_and_has_the_raw_calls() -> None:
    """The scan sees engine/files.py's own os.open: the exemption is by name, not blindness."""
    assert file_calls(BOUNDARY, (ROOT / BOUNDARY).read_text(encoding="utf-8"))
    assert BOUNDARY in product_files()


PLANTED = [
    ("def f(p):\n    return open(p).read()\n", "open"),
    ("def f(tok, p):\n    tok.save(str(p))\n", ".save()"),
    ("def f(texts, p):\n    train(texts).save(p)\n", ".save()"),
    ("import io\ndef f(p):\n    return io.open(p)\n", "io.open"),
    ("from os import replace as mv\ndef f(a, b):\n    mv(a, b)\n", "os.replace"),
    ("import numpy as np\ndef f(p):\n    return np.memmap(p)\n", "numpy.memmap"),
    ("import numpy\ndef f(p):\n    return numpy.fromfile(p)\n", "numpy.fromfile"),
    ("import torch\nclass C:\n    def f(self, p):\n        return torch.load(p)\n", "torch.load"),
    ("import json\ndef f(fh):\n    return json.load(fh)\n", "json.load"),
    ("import shutil\ndef f(p):\n    shutil.rmtree(p)\n", "shutil.rmtree"),
    ("from pathlib import Path\ndef f(p):\n    return Path(p).read_text()\n", ".read_text()"),
    ("def f(p):\n    p.write_bytes(b'')\n", ".write_bytes()"),
    ("def f(p, q):\n    p.replace(q)\n", ".replace()"),
    ("x = open('/etc/passwd')\n", "open"),
    # library entry points that open a path themselves (issue 38)
    ("from tokenizers import Tokenizer\ndef f(p):\n    return Tokenizer.from_file(p)\n", "tokenizers.Tokenizer.from_file"),
    ("import tokenizers\ndef f(p):\n    return tokenizers.Tokenizer.from_file(str(p))\n", "tokenizers.Tokenizer.from_file"),
    ("def f(tok_class, p):\n    return tok_class.from_file(p)\n", ".from_file()"),
    ("from transformers import GPT2LMHeadModel\ndef f(p):\n    return GPT2LMHeadModel.from_pretrained(p)\n",
     "transformers.GPT2LMHeadModel.from_pretrained"),
    ("def f(auto, p):\n    return auto.from_pretrained(p)\n", ".from_pretrained()"),
    ("from safetensors import safe_open\ndef f(p):\n    return safe_open(p, 'pt')\n", "safetensors.safe_open"),
    ("def f(st, p):\n    return st.load_file(p)\n", ".load_file()"),
    ("import numpy as np\ndef f(p):\n    return np.lib.format.open_memmap(p)\n", "numpy.lib.format.open_memmap"),
    ("import torch\ndef f(p):\n    return torch.from_file(p, size=9)\n", "torch.from_file"),
    ("from datasets import load_dataset\ndef f(p):\n    return load_dataset('text', data_files=p)\n",
     "datasets.load_dataset"),
]


@pytest.mark.parametrize(("source", "call"), PLANTED)
def test_a_planted_raw_call_fails_the_scan(source: str, call: str) -> None:
    """The same function the product scan runs, on a module that claims a product path."""
    found = violations("engine/train/planted.py", source)
    assert len(found) == 1 and found[0].endswith(call), found


def test_an_allowed_function_elsewhere_is_not_allowed() -> None:
    """The allow-list is by module AND function: the same name in another module still fails."""
    assert violations("engine/prep/prepare.py", "def _packaged_preset(p):\n    return open(p)\n")
    assert violations("engine/config.py", "def other(p):\n    return open(p)\n")
    assert not violations("engine/config.py", "def _packaged_preset(p):\n    return open(p)\n")


def test_harmless_lookalikes_pass() -> None:
    source = (
        "import shutil, dataclasses\nfrom engine.train import checkpoint as ckpt\n"
        "def f(s, d, p):\n    shutil.which('x'); s.replace('a', 'b'); dataclasses.replace(d, x=1)\n"
        "    d.replace(tzinfo=None); ckpt.load(p); [].remove(1)\n"
    )
    assert violations("engine/train/planted.py", source) == []
