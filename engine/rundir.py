"""The run directory: config.toml, events.jsonl, checkpoints/, tokenizer.json.

A run directory describes itself: `attach`, `--resume` and `sample` need nothing else.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from engine.config import RunConfig, build, read_toml
from engine.errors import UserError

CONFIG, EVENTS, CHECKPOINTS, TOKENIZER = "config.toml", "events.jsonl", "checkpoints", "tokenizer.json"
WRITER = "writer.pid"  # host and pid of the process writing the run, while it runs
LAUNCH_LOG = "console.log"  # the app's detached launch writes the run's console here before it starts


def default_path(preset: str | None) -> Path:
    return Path("runs") / f"{preset or 'run'}-{time.strftime('%Y%m%d-%H%M%S')}"


def holds_run(path: Path) -> bool:
    return (path / CONFIG).exists() or (path / EVENTS).exists()


def check_new(path: Path, flag: str = "--out") -> None:
    """Refuse a path that would overwrite anything, before a single byte is written: an output
    directory (a run's, a dataset's, a benchmark's) is a new path or an empty directory."""
    if path.exists() and not path.is_dir():
        raise UserError(f"{flag} {path} is a file; choose a new directory path")
    if holds_run(path):
        raise UserError(f"{path} already holds a run; continue it with --resume {path} or choose another {flag}")
    if path.is_dir() and any(p.name != LAUNCH_LOG for p in path.iterdir()):
        raise UserError(f"{flag} {path} is not empty; choose a new or empty directory so nothing is overwritten")


def atomic_write_bytes(path: Path, data: bytes) -> None:
    # imported here: engine.checkpoint imports torch, and reading a run (`gpt2-tui runs`,
    # attach) must not pay for that
    from engine.checkpoint import atomic_write_bytes as write

    write(path, data)


def create(path: Path, config: RunConfig, tokenizer: str | None) -> None:
    check_new(path)
    (path / CHECKPOINTS).mkdir(parents=True, exist_ok=True)
    write_config(path, config)
    if tokenizer:
        atomic_write_bytes(path / TOKENIZER, Path(tokenizer).read_bytes())  # never a torn copy


def write_config(path: Path, config: RunConfig) -> None:
    atomic_write_bytes(path / CONFIG, config.to_toml().encode())


def load_config(path: Path) -> RunConfig:
    if not path.is_dir():
        raise UserError(f"run directory {path} does not exist; check the path")
    if not (path / CONFIG).is_file():
        raise UserError(f"{path} is not a run directory (no {CONFIG}); give the --out of a run")
    return build(read_toml(path / CONFIG))


def tokenizer_of(path: Path) -> Path | None:
    p = path / TOKENIZER
    return p if p.is_file() else None


def claim_writer(path: Path) -> None:
    """Record who writes this run, so `attach` can tell a live run from one whose writer died."""
    atomic_write_bytes(path / WRITER, f"{socket.gethostname()} {os.getpid()}\n".encode())


def release_writer(path: Path) -> None:
    (path / WRITER).unlink(missing_ok=True)


def writer_alive(path: Path) -> bool | None:
    """False when the recorded writer is a dead process on this host; None when unknown
    (no record, or another host's process, which we cannot see)."""
    try:
        host, pid = (path / WRITER).read_text().split()
        pid_n = int(pid)
    except (OSError, ValueError):
        return None
    if host != socket.gethostname():
        return None
    try:
        os.kill(pid_n, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True
