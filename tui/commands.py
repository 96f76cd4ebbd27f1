"""The CLI's TUI entry points, importable without loading Textual (the CLI builds its
parser on every call; Textual loads only when a screen is about to open)."""

from __future__ import annotations

import argparse
import signal
from pathlib import Path

# engine/cli.py's `train` handles these: SIGUSR1 saves at the next step boundary, SIGUSR2
# pauses or resumes (POSIX only). The dashboard steers the runs it spawned with them.
SAVE_SIGNAL = getattr(signal, "SIGUSR1", None)
PAUSE_SIGNAL = getattr(signal, "SIGUSR2", None)


def add_attach_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a run directory (live or finished)")


def run_attach(args: argparse.Namespace) -> int:
    """`gpt2-tui attach RUN_DIR`: bad path -> one line, exit 2, before the screen opens."""
    from engine import rundir

    rundir.load_config(args.run_dir)
    from tui.app import GPT2App

    app = GPT2App(attach_dir=args.run_dir)
    app.run()
    return app.return_code or 0


def run_app(config_path: Path | None = None) -> int:
    """The bare `gpt2-tui`; with `--config run.toml` the form opens filled in."""
    from engine.config import preset_names, read_toml, resolve

    config = None
    if config_path is not None:
        data = read_toml(config_path)
        preset = data.get("preset") if data.get("preset") in preset_names() else None
        config = resolve(preset, config_path)
    from tui.app import GPT2App

    app = GPT2App(config)
    app.run()
    s = app.session
    if s is not None and s.process is not None and s.process.poll() is None:
        print(f"the run goes on in process {s.process.pid}; re-attach with: gpt2-tui attach {s.run_dir}")
    return app.return_code or 0
