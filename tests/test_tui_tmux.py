"""The installed `gpt2-tui` in a real terminal (tmux) at 80x24 and 120x40, read off the screen.

Runs on its own tmux server socket, which it kills at the end; skipped when tmux is absent
(.ci/setup installs it where apt-get exists).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

GPT2_TUI = Path(sys.executable).with_name("gpt2-tui")
DATA = Path(__file__).parent / "data"
WAIT_S = 120.0  # bound only; the poll returns as soon as the text is on screen

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install tmux)")


class Tmux:
    def __init__(self, cols: int, rows: int, command: str, cwd: Path):
        self.sock = f"gpt2tui-{uuid.uuid4().hex[:8]}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("TMUX")}
        env["TERM"] = "xterm-256color"
        self.env = env
        shell = f"cd {cwd} && {command}; echo EXIT-STATUS-$?; sleep 60"
        self._tmux("new-session", "-d", "-s", "t", "-x", str(cols), "-y", str(rows), shell)

    def _tmux(self, *args: str) -> str:
        out = subprocess.run(["tmux", "-L", self.sock, *args], capture_output=True, text=True, env=self.env, timeout=30)
        return out.stdout

    def screen(self) -> str:
        return self._tmux("capture-pane", "-t", "t", "-p")

    def keys(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", "t", *keys)

    def wait_for(self, *needles: str) -> str:
        end = time.monotonic() + WAIT_S
        while True:
            text = self.screen()
            if all(n in text for n in needles):
                return text
            if time.monotonic() > end:
                raise AssertionError(f"{needles} not on screen after {WAIT_S} s:\n{text}")
            time.sleep(0.3)

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.sock, "kill-server"], capture_output=True, env=self.env)


@pytest.mark.parametrize("cols,rows", [(80, 24), (120, 40)])
def test_attach_in_a_real_terminal(cols: int, rows: int) -> None:
    t = Tmux(cols, rows, f"{GPT2_TUI} attach tui-run", DATA)
    try:
        screen = t.wait_for("COMPLETED", "step 30/30")
        assert "best val 6.9384" in screen and "loss" in screen
        assert all(len(line) <= cols for line in screen.splitlines())
        t.keys("?")
        t.wait_for("pause/resume", "x-axis")
        t.keys("Escape")
        t.keys("C-q")
        t.wait_for("EXIT-STATUS-0")
    finally:
        t.close()


@pytest.mark.parametrize("cols,rows", [(80, 24), (120, 40)])
def test_bare_command_opens_the_setup_form(cols: int, rows: int, tmp_path: Path) -> None:
    t = Tmux(cols, rows, str(GPT2_TUI), tmp_path)
    try:
        t.wait_for("set up a run", "preset", "nano")
        t.wait_for("Batch and schedule", "block size")
        t.keys("C-q")
        t.wait_for("EXIT-STATUS-0")
    finally:
        t.close()
    assert list(tmp_path.iterdir()) == []  # opening the form writes nothing
