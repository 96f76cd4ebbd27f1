"""Every child process the product starts goes through engine/child.py (issue 46, class C): its own
session, a death signal unless it is a detached run, its output read bounded, and a stop that
reaches everything it started. A scan (an AST walk, as the file boundary's) fails on a process
started anywhere else; the helper's promises are then shown on real processes."""

from __future__ import annotations

import ast
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from engine import child
from harness import python_c

ROOT = Path(__file__).resolve().parents[2]
HOME = "engine/child.py"
STARTERS = {
    "subprocess": {"run", "Popen", "call", "check_call", "check_output", "getoutput", "getstatusoutput"},
    "os": {"system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp", "spawnl", "spawnle", "spawnlp",
           "spawnlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe", "execv", "execve", "execl", "execlp", "execvp"},
    "pty": {"spawn", "fork"},
    "multiprocessing": {"Process", "Pool", "get_context"},
    "asyncio": {"create_subprocess_exec", "create_subprocess_shell"},
}  # fmt: skip


def _product_files() -> list[Path]:
    return sorted([*ROOT.glob("engine/**/*.py"), *ROOT.glob("bench/*.py"), *ROOT.glob("tui/**/*.py"),
                   ROOT / "gpt2_tui.py"])  # fmt: skip


def _starts(path: Path) -> list[str]:
    """`module.function(...)` calls that start a process, by the module's name as imported here."""
    tree = ast.parse(path.read_text(), str(path))
    alias = {}  # local name -> module, for `import subprocess as sp`, `from os import fork`
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            alias |= {(a.asname or a.name): a.name for a in node.names if a.name in STARTERS}
        elif isinstance(node, ast.ImportFrom) and node.module in STARTERS:
            alias |= {(a.asname or a.name): f"{node.module}.{a.name}" for a in node.names}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in alias:
            module = alias[f.value.id]
            if f.attr in STARTERS.get(module, ()):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {module}.{f.attr}")
        elif isinstance(f, ast.Name) and "." in alias.get(f.id, ""):
            module, name = alias[f.id].split(".", 1)
            if name in STARTERS[module]:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {module}.{name}")
    return found


def test_every_child_process_is_started_by_the_one_helper():
    outside = [hit for p in _product_files() if str(p.relative_to(ROOT)) != HOME for hit in _starts(p)]
    assert outside == [], "start children through engine.child (popen / run):\n" + "\n".join(outside)
    assert _starts(ROOT / HOME), "the scan sees the helper's own start: it would see one elsewhere"


@pytest.mark.slow  # starts processes
def test_a_child_that_prints_without_end_is_read_bounded_and_stopped_with_all_it_started(tmp_path):
    """A child printing 50 MB is kept to its last MAX_OUTPUT bytes; past the timeout it and the
    grandchild it started (in a session of its own) are killed."""
    loud = child.run([sys.executable, "-c", "import sys\nfor _ in range(50): sys.stdout.write('x' * (1 << 20))"],
                     timeout=120)  # fmt: skip
    assert loud.returncode == 0 and len(loud.output) == child.MAX_OUTPUT
    pid_file = tmp_path / "grandchild"
    code = (f"import os, subprocess, sys, time\n"
            f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], start_new_session=True)\n"
            f"open({str(pid_file)!r}, 'w').write(str(p.pid))\ntime.sleep(300)\n")  # fmt: skip
    began = time.monotonic()
    hung = child.run([sys.executable, "-c", code], timeout=3)
    assert hung.returncode is None and time.monotonic() - began < 60
    _gone(int(pid_file.read_text()))


@pytest.mark.slow  # starts processes
def test_a_child_dies_with_the_process_that_started_it_and_sigterm_runs_its_clean_up(tmp_path):
    """The parent killed outright (SIGKILL: no clean-up of its own runs): its child goes too (the
    death signal). A command stopped by SIGTERM (term_as_interrupt) kills its child's group first."""
    pid_file = tmp_path / "child"
    parent = (f"import sys, time\nfrom engine import child\n"
              f"p = child.popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
              f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
              f"import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")  # fmt: skip
    python_c(parent, timeout=120)
    _gone(int(pid_file.read_text()))
    sleeper, pid_file = tmp_path / "sleeper.py", tmp_path / "stopped-child"
    sleeper.write_text(f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(300)\n")
    term = (f"import os, signal, sys, threading\nfrom engine import child\n"
            f"threading.Timer(2, lambda: os.kill(os.getpid(), signal.SIGTERM)).start()\n"
            f"with child.term_as_interrupt():\n"
            f"    try:\n        child.run([sys.executable, {str(sleeper)!r}], timeout=300)\n"
            f"    except KeyboardInterrupt:\n        print('interrupted')\n")  # fmt: skip
    done = python_c(term, timeout=120)
    assert "interrupted" in done.stdout and pid_file.is_file(), done.stderr  # the child had started
    _gone(int(pid_file.read_text()))


def _gone(pid: int, within: float = 10) -> None:
    end = time.monotonic() + within
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        try:  # a zombie reaped by init counts as gone
            if Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z"):
                return
        except OSError:
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    pytest.fail(f"process {pid} outlived the one that started it")
