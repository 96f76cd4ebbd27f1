"""The `gpt2-tui` command: the app, `attach`, and every headless command of engine.cli.

    gpt2-tui [--config run.toml]     the app: setup form -> live dashboard
    gpt2-tui attach RUN_DIR          the dashboard on any run, live or finished
    gpt2-tui runs [DIR]              every run under DIR (default runs/), newest first
    gpt2-tui compare --tui RUN...    the Compare screen (without --tui: the table, or --json)
    gpt2-tui train|estimate|prepare|sample|toggle|compare ...    headless (engine.cli)
    gpt2-tui bench|bench-data ...    the measuring tools (bench.cli)

It sits above the packages: engine/ never imports the UI or bench/, and Textual loads only
when a screen is about to open (bad input is refused before that, in one line, exit status 2).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def _hold_keys() -> None:
    """Keys typed while the app starts (a second or more of imports) reach it as typed: the
    terminal leaves line mode now, not when Textual starts, so the kernel neither edits them
    (a backspace erasing the Tab before it) nor echoes them. Restored at exit (Textual puts
    back what it found: this mode)."""
    if len(sys.argv) > 2 and sys.argv[1] != "attach" or len(sys.argv) == 2 and sys.argv[1].startswith("-"):
        return  # a headless command (--help, --config alone is the app: handled below)
    try:
        import atexit
        import termios

        fd = sys.stdin.fileno()
        if not sys.stdin.isatty():
            return
        before = termios.tcgetattr(fd)
        now = termios.tcgetattr(fd)
        now[3] &= ~(termios.ICANON | termios.ECHO)
        termios.tcsetattr(fd, termios.TCSANOW, now)
        atexit.register(termios.tcsetattr, fd, termios.TCSANOW, before)
    except Exception:  # no terminal to hold (a pipe, another OS): Textual's own start then
        pass


if __name__ == "__main__" or Path(sys.argv[0]).name in ("gpt2-tui", "gpt2_tui.py"):
    _hold_keys()

from bench import cli as bench_cli
from engine import cli
from engine.console import out, route_warnings


def _app(config_path: Path | None) -> int:
    from engine.config import preset_names, read_toml, resolve

    config = None
    if config_path is not None:
        data = read_toml(config_path)
        preset = data.get("preset") if data.get("preset") in preset_names() else None
        config = resolve(preset, config_path)
    from tui.app import run_app

    return run_app(config)


def _attach(run_dir: Path) -> int:
    from engine import rundir

    rundir.load_config(run_dir)  # not a run: one line, before the screen opens
    from tui.app import run_attach

    return run_attach(run_dir)


def _runs(root: Path | None, target: float | None = None) -> int:
    from engine.errors import UserError
    from engine.inspect.runs import DEFAULT_ROOT, format_table, list_runs
    from engine.text import path_text

    if root is None and not DEFAULT_ROOT.is_dir():
        out.line(f"no runs yet: {DEFAULT_ROOT}/ does not exist here (start one with gpt2-tui, or give DIR)")
        return 0
    root = DEFAULT_ROOT if root is None else root
    if not root.is_dir():
        raise UserError(f"{path_text(root)} is not a directory; give the directory that holds your runs (default runs/)")
    out.line(format_table(list_runs(root, target), target))
    return 0


def _compare(run_dirs: list[Path], as_json: bool, target: float | None) -> int:
    from engine.inspect.compare import read_run
    from engine.errors import UserError

    if as_json:
        raise UserError("--json prints for scripts, --tui opens the screen: choose one")
    for d in run_dirs:
        read_run(d)  # not a run: one line, before the screen opens
    from tui.screens.compare import run_compare

    return run_compare(run_dirs, target)


def build_parser() -> tuple[cli.Parser, Any]:
    """engine.cli's parser with the measuring tools' commands and the UI's added."""
    parser, sub = cli.build_parser()
    bench_cli.add_parsers(sub)
    parser.add_argument("--config", type=Path, dest="app_config", metavar="FILE",
                        help="open the app with this run config TOML filled in")  # fmt: skip
    a = sub.add_parser("attach", help="open the dashboard on a run directory (live or finished)")
    a.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a run directory (live or finished)")
    r = sub.add_parser("runs", help="list the run directories under DIR, newest first")
    r.add_argument("root", type=Path, nargs="?", default=None, metavar="DIR",
                   help="the directory that holds the runs (default runs/)")  # fmt: skip
    r.add_argument("--target", type=cli.target_loss, metavar="LOSS", help="the val loss the `to target` column times "
                   "each run to (default: the worst final val loss listed)")  # fmt: skip
    sub.choices["compare"].add_argument("--tui", action="store_true",
                                        help="open the Compare screen (curves overlaid, segment table)")  # fmt: skip
    return parser, sub


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:  # the bare command: open the form at once, no parser needed
        return cli.guarded(lambda: _app(None), sigterm=False)
    parser, _ = build_parser()
    args, rest = cli.parse(parser, argv)
    route_warnings()  # Python's warnings reach stderr through the printable rule
    if args.command in bench_cli.COMMANDS:
        return cli.guarded(lambda: bench_cli.run_command(args, argv))
    if args.command == "compare" and args.tui:
        return cli.guarded(lambda: _compare(args.run_dirs, args.json, args.target), sigterm=False)
    if args.command == "runs":
        return cli.guarded(lambda: _runs(args.root, args.target), sigterm=False)
    if args.command == "attach":
        return cli.guarded(lambda: _attach(args.run_dir), sigterm=False)
    if args.command is None:
        return cli.guarded(lambda: _app(args.app_config), sigterm=False)
    return cli.guarded(lambda: cli.run_command(args, argv, rest))


if __name__ == "__main__":
    sys.exit(main())
