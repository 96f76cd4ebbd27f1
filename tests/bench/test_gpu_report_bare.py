"""Issue 20, finding 2: the one-command GPU report on a bare box.

A fresh GPU box often has torch and little else. The report must get through every part
there: each finishes, or is skipped with a one-line reason, and the report files are
written. This builds such a box in seconds: a venv without pip whose site-packages holds
symlinks to only torch (and what torch itself imports), numpy, tokenizers, pydantic and
tomli-w from this venv; no rich, textual, plotext or pytest. Copying a wheel per package
would cost minutes; a symlink is the same installed files, and `--system-site-packages`
would let rich and textual back in.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import subprocess
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# what a bare GPU box has: torch with its own requirements, and the engine's hard dependencies
BARE = ["torch", "numpy", "tokenizers", "pydantic", "tomli-w"]
NEVER = {"rich", "textual", "textual-plotext", "plotext", "pytest", "markdown-it-py", "pygments"}


def _closure(names: list[str]) -> set[str]:
    """The distributions `names` need (their non-extra requirements, recursively)."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in seen:
            continue
        try:
            reqs = md.requires(name) or []
        except md.PackageNotFoundError:
            continue  # an optional requirement this venv lacks: the bare box lacks it too
        seen.add(name)
        for r in reqs:
            if "extra ==" in r:
                continue
            todo.append(re.split(r"[\s<>=!~;\[(]", r, maxsplit=1)[0])
    return seen


def _top_level(dist: md.Distribution) -> set[str]:
    """The site-packages entries a distribution installed (packages, modules, .libs, dist-info)."""
    entries = set()
    for f in dist.files or []:
        first = f.parts[0]
        if first not in ("..", "__pycache__") and not first.endswith(".pth"):
            entries.add(first)
    return entries


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> Path:
    """A python whose site-packages holds only BARE and their requirements (symlinked)."""
    root = tmp_path_factory.mktemp("bare")
    venv.create(root / "venv", with_pip=False, symlinks=True)
    python = root / "venv" / "bin" / "python"
    site = Path(subprocess.check_output([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                        text=True).strip())  # fmt: skip
    ours = Path(sysconfig.get_paths()["purelib"])
    dists = _closure(BARE)
    assert not dists & NEVER, f"a bare box would not have {dists & NEVER}"
    for name in dists:
        for entry in _top_level(md.distribution(name)):
            src = ours / entry
            if src.exists() and not (site / entry).exists():
                (site / entry).symlink_to(src)
    return python


@pytest.mark.slow
def test_the_bare_box_really_is_bare(bare_python):
    code = "import importlib.util as u; print([m for m in ('rich','textual','plotext','pytest') if u.find_spec(m)])"
    out = subprocess.run([bare_python, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    subprocess.run([bare_python, "-c", "import torch, numpy, tokenizers, pydantic, tomli_w, engine.cli"],
                   cwd=ROOT, check=True)  # fmt: skip


@pytest.mark.slow
def test_gpu_report_dry_run_gets_through_every_part_on_a_bare_box(bare_python, tmp_path):
    """The short-window profile (the report with no part flags): every item finishes or is skipped
    with a one-line reason; the report files are written. No --data: the headline, ladder and best
    items build the default dataset, as on a first run."""
    out = tmp_path / "report"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env |= {"GPT2_TUI_CACHE": str(tmp_path / "cache"), "PATH": f"{bare_python.parent}:{env.get('PATH', '')}"}
    proc = subprocess.run([bare_python, "-m", "gpt2_tui", "bench", "--gpu-report", "--dry-run", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    tail = (proc.stdout + proc.stderr)[-3000:]
    reports = sorted(out.glob("*.json"))
    assert len(reports) == 1 and reports[0].with_suffix(".md").is_file(), tail
    parts = json.loads(reports[0].read_text())["parts"]
    assert list(parts) == ["env", "headline", "matrix", "ladder", "best", "overhead"], tail
    for name, part in parts.items():
        status = part["status"]
        assert status == "ok" or status.startswith("skipped: "), f"{name}: {status}\n{tail}"
        assert "\n" not in status
    assert all(parts[p]["status"] == "ok" for p in ("env", "headline", "ladder", "best")), tail
    assert "pytest" in parts["matrix"]["status"]  # skipped, and says what is missing
    assert "textual" in parts["overhead"]["status"]
    assert proc.returncode == 0, tail
