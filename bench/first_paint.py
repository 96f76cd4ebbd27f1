"""How long the bare `gpt2-tui` takes to paint the setup form, in a real terminal (tmux).

    python -m bench.first_paint [--rounds 5] [--size 120x40] [--baseline CMD]

Starts the installed command in a fresh tmux server, polls the screen every 20 ms until the
form's first fields and the footer are on it, quits, and prints each round and the median.
The figure includes the interpreter's start and every import before the first frame: what a
user waits for. With --baseline, each round also times CMD (e.g. an older checkout's
`PYTHONPATH=OLD python -m gpt2_tui`), the two alternating so both see the same load.
Recorded in docs/benchmarks.md (with device, date, torch version).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from engine import child, console

GPT2_TUI = Path(sys.executable).with_name("gpt2-tui")
# on screen = the form has painted: its first fields, and the footer, which the frame writes
# last (a frame can reach the terminal in pieces: its top alone is not a painted form)
PAINTED = ("preset", "Speed switches", "Quit")
POLL_S = 0.02
LIMIT_S = 60.0


def _tmux(sock: str, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TMUX")} | {"TERM": "xterm-256color"}
    return child.run(["tmux", "-L", sock, *args], env=env, timeout=30, stderr=False).output


def one_round(cols: int, rows: int, command: str = str(GPT2_TUI)) -> float:
    """Seconds from starting `command` to the form on screen (in an empty working directory)."""
    sock = f"paint-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as cwd:
        t0 = time.monotonic()
        _tmux(sock, "new-session", "-d", "-s", "t", "-x", str(cols), "-y", str(rows), f"cd {cwd} && {command}")
        try:
            while True:
                screen = _tmux(sock, "capture-pane", "-t", "t", "-p")
                if all(p in screen for p in PAINTED):
                    return time.monotonic() - t0
                if time.monotonic() - t0 > LIMIT_S:
                    raise TimeoutError(f"the form was not on screen after {LIMIT_S:.0f} s:\n{screen}")
                time.sleep(POLL_S)
        finally:
            _tmux(sock, "send-keys", "-t", "t", "C-q")
            time.sleep(0.5)
            _tmux(sock, "kill-server")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--size", default="120x40", help="terminal COLSxROWS")
    p.add_argument("--baseline", metavar="CMD", help="also time this command, alternating with gpt2-tui")
    args = p.parse_args(argv)
    if shutil.which("tmux") is None:
        console.err.line("tmux is not installed (apt-get install tmux)")
        return 2
    cols, rows = (int(x) for x in args.size.split("x"))
    runs = {"gpt2-tui": str(GPT2_TUI)} | ({"baseline": args.baseline} if args.baseline else {})
    times: dict[str, list[float]] = {name: [] for name in runs}
    for i in range(args.rounds):
        order = list(runs) if i % 2 == 0 else list(runs)[::-1]  # paired: the order flips each round
        for name in order:
            try:
                times[name].append(one_round(cols, rows, runs[name]))
            except TimeoutError as err:
                console.err.line(f"{name}: {err}")
                return 1
            console.out.line(f"round {i + 1}, {name}: form on screen after {times[name][-1]:.2f} s", flush=True)
    for name, ts in times.items():
        console.out.line(f"{name}: median {statistics.median(ts):.2f} s (min {min(ts):.2f}, max {max(ts):.2f}) "
                         f"at {cols}x{rows}, load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
