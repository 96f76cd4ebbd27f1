"""Every child process the product starts, started here (tests/robustness/test_children.py scans
for a `subprocess` call anywhere else): in its own session, so a stop reaches everything it
started (`kill_group`); with a death signal, so it dies with us, unless it is meant to outlive us
(a detached run); its output read bounded (the last MAX_OUTPUT bytes kept, the rest counted, never
held). And one way for a command to take SIGTERM: as Ctrl-C (`term_as_interrupt`), so its
clean-up runs and its children go with it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_OUTPUT = 1 << 20  # bytes of a child's output kept: its tail (a child printing 600 MB costs us 1 MiB)
_PRCTL: list[Any] = []  # libc's prctl, looked up in the parent before a fork (nothing is imported in the child)


def _die_with_parent() -> None:  # pragma: no cover - runs in the child, between fork and exec
    """In the child: SIGKILL when the parent dies (Linux PR_SET_PDEATHSIG), however it dies."""
    if _PRCTL:
        _PRCTL[0](1, signal.SIGKILL)


def popen(argv: Sequence[str | os.PathLike[str]], *, detached: bool = False, **kwargs: Any) -> subprocess.Popen:
    """Start `argv` in its own session. Unless `detached` (a run that outlives the app that started
    it), it gets SIGKILL when this process dies. kwargs: subprocess.Popen's (cwd, env, stdout...)."""
    death = None
    if not detached and sys.platform.startswith("linux"):
        if not _PRCTL:
            import ctypes

            with contextlib.suppress(OSError, AttributeError):
                _PRCTL.append(ctypes.CDLL(None, use_errno=True).prctl)
        death = _die_with_parent if _PRCTL else None
    return subprocess.Popen([str(a) for a in argv], start_new_session=True, preexec_fn=death, **kwargs)


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (Linux /proc; [] elsewhere): listed before a kill, so that one
    that made a session of its own (out of its parent's process group) is killed too."""
    from engine import files

    below: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            text = files.read_text(f"/proc/{entry}/stat", 4096)
            below.setdefault(int(text[text.rindex(")") + 2 :].split()[1]), []).append(int(entry))
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
    out, todo = [], [pid]
    while todo:
        for child in below.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    """`sig` to the child, its session's group and everything below it; gone already: nothing."""
    below = descendants(proc.pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
    for pid in below:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


class Tail:
    """A stream's last `cap` bytes, read on a thread as they come (the child never blocks on a full
    pipe); `total` counts what was read, `on_line` sees each line as it completes (echo, progress)."""

    def __init__(self, stream: Any, cap: int = MAX_OUTPUT, on_line: Callable[[str], None] | None = None):
        self.cap, self.total, self._buf, self._on_line = cap, 0, bytearray(), on_line
        self._partial = b""
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self._thread.start()

    def _pump(self, stream: Any) -> None:
        fd = stream.fileno()
        while chunk := os.read(fd, 1 << 16):
            with self._lock:
                self.total += len(chunk)
                self._buf += chunk
                if len(self._buf) > self.cap:
                    del self._buf[: len(self._buf) - self.cap]
            if self._on_line is not None:
                *lines, self._partial = (self._partial + chunk).split(b"\n")
                self._partial = self._partial[-self.cap :]
                for line in lines:
                    self._on_line(line.decode("utf-8", "replace"))

    def text(self) -> str:
        with self._lock:
            return self._buf.decode("utf-8", "replace")

    def join(self, timeout: float = 10) -> None:
        self._thread.join(timeout)


@dataclass
class Finished:
    returncode: int | None  # None: stopped at its timeout
    output: str  # stdout and stderr as they interleaved: the last MAX_OUTPUT bytes
    seconds: float


def run(argv: Sequence[str | os.PathLike[str]], *, timeout: float | None, cwd: Path | str | None = None,
        env: dict[str, str] | None = None, cap: int = MAX_OUTPUT, stderr: bool = True) -> Finished:  # fmt: skip
    """Run `argv` to its end (or `timeout` seconds: then it and all it started are killed), its
    output (stdout, and stderr unless `stderr` is False: then it is dropped) read bounded. Stopped
    here (Ctrl-C, SIGTERM as term_as_interrupt makes it), the child's whole group is killed before
    the stop goes on up."""
    t0 = time.monotonic()
    err = subprocess.STDOUT if stderr else subprocess.DEVNULL
    proc = popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err)
    tail = Tail(proc.stdout, cap)
    rc: int | None = None
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    except BaseException:
        kill_group(proc)
        proc.wait()
        raise
    finally:
        kill_group(proc)  # what it left running in its group
        if rc is None:
            proc.wait()
        tail.join()
        if proc.stdout is not None:
            proc.stdout.close()
    return Finished(rc, tail.text(), time.monotonic() - t0)


@contextlib.contextmanager
def term_as_interrupt() -> Iterator[None]:
    """Within it, SIGTERM raises KeyboardInterrupt in the main thread, so a command's clean-up (a
    build's hidden temp directory, a child's group, a scratch directory) runs as on Ctrl-C; the
    handler before it is put back after. Every command runs inside one (engine.cli, bench.run);
    `train` installs its own, gentler one within (stop at the step boundary, with a checkpoint)."""

    def terminated(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
