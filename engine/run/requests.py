"""One way to steer a run: requests (pause, resume, save, stop, toggle), each with an id and
a time, that the trainer takes at its step boundary and acknowledges in the events.

Two sources of requests, one shape:
- `Control`: in memory, for a run in this process (the app's own thread, the CLI's signal
  handlers, tests);
- `Mailbox`: `requests.jsonl` in the run directory, for any other process (a detached or
  attached run, torchrun's rank 0). Senders append one line under flock; the run takes the
  whole file at a step boundary. It is read only as a small regular file, never through a
  link, never blocking; anything else is refused in one warning and training goes on.

Signals stay only for stopping a process that does not read its mailbox (Ctrl-C, SIGTERM).
"""

from __future__ import annotations

import errno
import json
import math
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from engine import files as runfiles
from engine.rundir import MAILBOX

MAX_BYTES = 64 * 1024  # a mailbox larger than this is not ours: refused, not read
MAX_DEPTH = 4  # {"switches": {...}} needs 2
KINDS = ("pause", "resume", "save", "stop", "toggle")


@dataclass(frozen=True)
class Request:
    """What a UI asks of a run. `problem` is set on a line that could not be read as a request
    (the trainer drops it, in words); kind "mailbox" is a refused mailbox file (a warning)."""

    kind: str
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    time: float = field(default_factory=time.time)
    switches: dict[str, Any] = field(default_factory=dict)
    problem: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "time": self.time, "kind": self.kind}
        return out | ({"switches": self.switches} if self.kind == "toggle" else {})


def parse(line: str) -> Request:
    """One mailbox line as a Request; what is not one comes back with its `problem`."""
    if runfiles.depth(line) > MAX_DEPTH:
        return Request(kind="?", id="?", problem="nested too deeply to be a request")
    try:
        raw = json.loads(line)
    except ValueError:
        return Request(kind="?", id="?", problem="not JSON")
    if not isinstance(raw, dict):
        return Request(kind="?", id="?", problem="not a JSON object")
    rid, at, kind, switches = raw.get("id"), raw.get("time"), raw.get("kind"), raw.get("switches", {})
    rid = rid if isinstance(rid, str) and 0 < len(rid) <= 64 and rid.isprintable() else "?"
    kind = kind if kind in KINDS else "?"
    ok_time = isinstance(at, (int, float)) and not isinstance(at, bool) and math.isfinite(at)
    problem = None
    if rid == "?" or kind == "?" or not ok_time:
        problem = "needs an id, a time and a kind (" + ", ".join(KINDS) + ")"
    elif not isinstance(switches, dict):
        problem = "switches must be a JSON object"
    return Request(kind=kind, id=rid, time=float(at) if ok_time else 0.0,
                   switches=switches if isinstance(switches, dict) else {}, problem=problem)  # fmt: skip


class RequestSource(Protocol):
    def take(self) -> list[Request]:
        """Every request asked since the last take, oldest first; never blocks."""
        ...


class Control:
    """Requests from this process (another thread, a signal handler): thread-safe, in memory."""

    def __init__(self) -> None:
        self._queue: list[Request] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._paused = False

    def steer(self, request: Request) -> None:
        with self._lock:
            self._queue.append(request)
        if request.kind == "stop":
            self._stop.set()
        elif request.kind in ("pause", "resume"):
            self._paused = request.kind == "pause"

    def take(self) -> list[Request]:
        with self._lock:
            taken, self._queue = self._queue, []
        return taken

    @property
    def stop_requested(self) -> bool:
        """A stop was asked of this run (it may not have reached a step boundary yet)."""
        return self._stop.is_set()

    @property
    def paused(self) -> bool:
        """The last of pause and resume asked here was a pause."""
        return self._paused

    # the words callers use; each is one request
    def pause(self) -> None:
        self.steer(Request("pause"))

    def resume(self) -> None:
        self.steer(Request("resume"))

    def stop(self) -> None:
        self.steer(Request("stop"))

    def save_now(self) -> None:
        self.steer(Request("save"))


class Mailbox:
    """The run directory's requests.jsonl, taken whole at each step boundary (rank 0 only)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / MAILBOX
        self._refused: set[tuple[int, int, str]] = set()  # what was refused once is not refused again

    def take(self, defer: tuple[str, ...] = ()) -> list[Request]:
        """Every request in the mailbox, oldest first; those of a kind in `defer` (toggles while
        the run is paused) stay in the file, so a writer killed meanwhile never holds one only
        in memory: the next writer finds it there (stale, dropped with a line)."""
        import fcntl

        try:
            fd = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return []  # the usual case: one failed open() a step
        except OSError as err:
            what = "a symbolic link" if err.errno == errno.ELOOP else err.strerror or "unreadable"
            return self._refuse((0, 0, what), what)
        try:
            st = os.fstat(fd)
            if not (st.st_mode & 0o170000 == 0o100000):
                return self._refuse((st.st_dev, st.st_ino, "kind"), "not a regular file")
            if st.st_size > MAX_BYTES:
                return self._refuse((st.st_dev, st.st_ino, "size"), f"{st.st_size} bytes, over {MAX_BYTES}")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return []  # a sender is writing: next step
            data = os.read(fd, MAX_BYTES + 1)
            if len(data) > MAX_BYTES:
                os.unlink(self.path)
                return self._refuse((0, 0, "grew"), f"over {MAX_BYTES} bytes")
            lines = [line for line in data.decode("utf-8", errors="replace").splitlines() if line.strip()]
            taken = [(line, parse(line)) for line in lines]
            kept = [line for line, r in taken if r.problem is None and r.kind in defer]
            if kept:  # under the lock: rewritten in place, a sender appends after it
                os.ftruncate(fd, 0)
                os.pwrite(fd, ("\n".join(kept) + "\n").encode(), 0)
            else:
                os.unlink(self.path)  # under the lock: a sender waiting on it sees the file gone and retries
        finally:
            os.close(fd)
        return [r for _, r in taken if not (r.problem is None and r.kind in defer)]

    def _refuse(self, key: tuple[int, int, str], why: str) -> list[Request]:
        if key in self._refused:
            return []
        self._refused.add(key)
        return [Request(kind="mailbox", id="-", problem=f"{self.path} refused ({why}); requests to this run "
                                                        f"are not read until it is a small regular file")]  # fmt: skip


def post(run_dir: Path, request: Request) -> None:
    """Append `request` to a run's mailbox (any process may, the run takes it at its next step
    boundary). OSError if the mailbox cannot be written; UserError if it is not a regular file."""
    import fcntl

    from engine.errors import UserError

    path = Path(run_dir) / MAILBOX
    line = (json.dumps(request.to_json()) + "\n").encode()
    for _ in range(50):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
        try:
            st = os.fstat(fd)
            if st.st_mode & 0o170000 != 0o100000:
                raise UserError(f"{path} is not a regular file; remove it to steer this run")
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                same = os.lstat(path).st_ino == st.st_ino
            except FileNotFoundError:
                same = False  # the run took the file while we waited for the lock
            if same:
                os.write(fd, line)
                return
        finally:
            os.close(fd)
    raise OSError(errno.EAGAIN, f"could not post to {path}")



def pending(run_dir: Path) -> list[dict[str, Any]]:
    """The switches of each toggle waiting in a run's mailbox, oldest first ({dotted switch:
    value} per request): what a UI shows as pending and checks a new toggle against, so that
    the same toggle is not asked twice. Read only (the run still takes them); a mailbox that
    is absent, a link, not a regular file or too large holds none."""
    try:
        data = runfiles.read_bounded(Path(run_dir) / MAILBOX, MAX_BYTES)
    except OSError:
        return []
    out = []
    for line in data.decode("utf-8", errors="replace").splitlines():
        if line.strip():
            r = parse(line)
            if r.problem is None and r.kind == "toggle" and r.switches:
                out.append(dict(r.switches))
    return out
