"""One way to steer a run: requests (pause, resume, save, stop, toggle), each with an id and
a time, that the trainer takes at its step boundary and acknowledges in the events.

Two sources of requests, one shape:
- `Control`: in memory, for a run in this process (the app's own thread, the CLI's signal
  handlers, tests);
- `Mailbox`: `requests.jsonl` in the run directory, for any other process (a detached or
  attached run, torchrun's rank 0). Senders append one line under flock; the run takes the
  whole file at a step boundary. It is read only as a small regular file, never through a
  link, never blocking; anything else is refused in one warning and training goes on.
  It is bounded: `post` refuses a request once the mailbox holds MAX_BYTES ("the run's
  mailbox is full"), except stop and resume, which have RESERVE bytes more of their own, so a
  paused run full of toggles can still be resumed or stopped; `take` reads it all (at most
  READ_CAP bytes: a larger one was not filled by post, and is removed unread with one
  warning). A mailbox that fails the identity rule (engine.files.not_own: a hard link, whose
  in-place rewrite would cut another file, not the run's user's, writable by others) is not
  obeyed: removed unread (its name only), one warning.

Signals stay only for stopping a process that does not read its mailbox (Ctrl-C, SIGTERM).
"""

from __future__ import annotations

import errno
import json
import os
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from engine import events as ev
from engine import files
from engine.rundir import MAILBOX

MAX_BYTES = 64 * 1024  # post refuses a request past this ("the run's mailbox is full")
RESERVE = 16 * 1024  # room past MAX_BYTES that only stop and resume may use: a run can always be let go
READ_CAP = MAX_BYTES + RESERVE  # all post ever fills: a larger mailbox was planted, and is removed unread
ALWAYS = ("stop", "resume")  # the kinds that may use the reserve
MAX_DEPTH = 4  # {"switches": {...}} needs 2
KINDS = ("pause", "resume", "save", "stop", "toggle", "tune")  # tune: start the run's tuner (engine/run/tune.py)


@dataclass(frozen=True)
class Request:
    """What a UI asks of a run. `problem` is set on a line that could not be read as a request
    (the trainer drops it, in words); kind "mailbox" is a refused mailbox file (a warning)."""

    kind: str
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    time: float = field(default_factory=time.time)
    switches: dict[str, Any] = field(default_factory=dict)
    problem: str | None = None
    old: bool = False  # in the mailbox already when this run's writer started (Mailbox.mark_start)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "time": self.time, "kind": self.kind}
        return out | ({"switches": self.switches} if self.kind == "toggle" else {})


def parse(line: str) -> Request:
    """One mailbox line as a Request; what is not one comes back with its `problem`."""
    if files.depth(line) > MAX_DEPTH:
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
    at = ev.bounded(ev.Timestamp, at)  # the events' rule for a time: a finite epoch time, never 10**400
    problem = None
    if rid == "?" or kind == "?" or at is None:
        problem = "needs an id, a time and a kind (" + ", ".join(KINDS) + ")"
    elif not isinstance(switches, dict):
        problem = "switches must be a JSON object"
    elif ev.bounded(ev.Plain, switches) is None:
        problem = "switches hold a number out of range (NaN, Infinity or an int beyond int64)"
    ok = isinstance(switches, dict) and problem is None
    return Request(kind=kind, id=rid, time=0.0 if at is None else at, switches=switches if ok else {}, problem=problem)


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
    """The run directory's requests.jsonl, taken at each step boundary (rank 0 only)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / MAILBOX
        self._refused: set[tuple[int, int, str]] = set()  # what was refused once is not refused again
        self._start: tuple[int, int, int, int] | None = None  # (dev, ino, from, to): bytes there at the writer's start

    def mark_start(self) -> None:
        """Remember what the mailbox holds as this run's writer starts: every request already
        in it was asked of a writer that is gone (`Request.old`), whatever time it claims."""
        try:
            fd = files.open_regular(self.path)  # O_NOFOLLOW|O_NONBLOCK: a FIFO never blocks
        except OSError:
            self._start = None  # none, or not a regular file (take refuses it)
            return
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        self._start = (st.st_dev, st.st_ino, 0, st.st_size)

    def take(self, defer: tuple[str, ...] = (), hold: tuple[str, ...] = ()) -> list[Request]:
        """Every request in the mailbox, oldest first; those of a kind in `defer` (toggles while the run is paused)
        stay in the file, so a writer killed meanwhile never holds one only in memory: the next
        writer finds it there (stale, dropped with a line). Those of a kind in `hold` are taken
        and stay in the file too, until `settle` (a toggle: until its hand-over checkpoint
        names it, or it is dropped), so a kill in between cannot lose one without a word."""
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
            why = files.not_own(st)  # the one identity rule: it is rewritten in place below
            if why == "not a regular file":
                return self._refuse((st.st_dev, st.st_ino, "kind"), why)
            if why is not None:  # a hard link (the rewrite would cut another file), another user's, loose mode
                return self._refuse((st.st_dev, st.st_ino, "owner"), f"{why}; removed unread", remove=True)
            if st.st_size > READ_CAP:
                return self._refuse((st.st_dev, st.st_ino, "size"), f"{st.st_size} bytes, over {READ_CAP}; removed unread",
                                    remove=True)  # fmt: skip
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return []  # a sender is writing: next step
            data = os.pread(fd, READ_CAP + 1, 0)
            if len(data) > READ_CAP:
                return self._refuse((0, 0, "grew"), f"over {READ_CAP} bytes; removed unread", remove=True)
            start = self._start if self._start and self._start[:2] == (st.st_dev, st.st_ino) else None
            taken: list[tuple[bytes, Request]] = []
            at = 0
            for raw in data.splitlines(keepends=True):
                line = raw.decode("utf-8", errors="replace")
                if line.strip():
                    r = parse(line.strip("\r\n"))
                    if start is not None and start[2] <= at < start[3] and r.problem is None:
                        r = replace(r, old=True)
                    taken.append((raw.rstrip(b"\r\n"), r))
                at += len(raw)
            self._start = None  # what was there at the start is taken now
            keep = [line for line, r in taken if r.problem is None and not r.old and r.kind in defer + hold]
            out = [r for line, r in taken if not (r.problem is None and not r.old and r.kind in defer)]
            if keep:  # under the lock: rewritten in place, a sender appends after it
                kept = b"".join(line + b"\n" for line in keep)
                os.pwrite(fd, kept, 0)
                os.ftruncate(fd, len(kept))
            else:
                os.unlink(self.path)  # under the lock: a sender waiting on it sees the file gone and retries
        finally:
            os.close(fd)
        return out

    def settle(self, ids: set[str]) -> None:
        """Remove the held requests `ids` from the mailbox (Mailbox.take's `hold`): they are settled."""
        import fcntl

        if not ids:
            return
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return  # gone or refused since the take: nothing of ours is left there
        try:
            st = os.fstat(fd)
            if files.not_own(st) is not None or st.st_size > READ_CAP:
                return  # the next take refuses it
            fcntl.flock(fd, fcntl.LOCK_EX)  # a sender appends in a moment: wait for it
            data = os.pread(fd, READ_CAP + 1, 0)
            keep = [raw for raw in data.splitlines(keepends=True)
                    if raw.strip() and parse(raw.decode("utf-8", errors="replace").strip("\r\n")).id not in ids]  # fmt: skip
            if keep:
                kept = b"".join(line.rstrip(b"\r\n") + b"\n" for line in keep)
                os.pwrite(fd, kept, 0)
                os.ftruncate(fd, len(kept))
            else:
                os.unlink(self.path)
        finally:
            os.close(fd)

    def _refuse(self, key: tuple[int, int, str], why: str, remove: bool = False) -> list[Request]:
        if remove:
            try:
                files.remove(self.path)  # a run's own directory: its requests are never obeyed later
            except OSError:
                pass
        if key in self._refused:
            return []
        self._refused.add(key)
        return [Request(kind="mailbox", id="-", problem=f"{self.path} refused ({why}); requests to this run "
                                                        f"are not read until it is a small regular file of its own")]  # fmt: skip


def post(run_dir: Path, request: Request) -> None:
    """Append `request` to a run's mailbox (any process may, the run takes it at its next step
    boundary). OSError if the mailbox cannot be written; UserError if it is not a regular file
    or it is full (stop and resume have a reserve of their own: a run can always be let go)."""
    import fcntl

    from engine.errors import UserError

    path = Path(run_dir) / MAILBOX
    line = (json.dumps(request.to_json()) + "\n").encode()
    cap = READ_CAP if request.kind in ALWAYS else MAX_BYTES
    for _ in range(50):
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
        try:
            st = os.fstat(fd)
            why = files.not_own(st)  # what take() would refuse unread: say so now
            if why is not None:
                raise UserError(f"{path} is {why}; remove it to steer this run")
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                same = os.lstat(path).st_ino == st.st_ino
            except FileNotFoundError:
                same = False  # the run took the file while we waited for the lock
            if same:
                size = os.fstat(fd).st_size
                if size + len(line) > cap:
                    pending = os.pread(fd, READ_CAP + 1, 0).count(b"\n")
                    raise UserError(f"the run's mailbox is full ({pending} requests pending); wait for it to take them")
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
        data = files.read_bounded(Path(run_dir) / MAILBOX, READ_CAP)
    except OSError:
        return []
    out = []
    for line in data.decode("utf-8", errors="replace").splitlines():
        if line.strip():
            r = parse(line)
            if r.problem is None and r.kind == "toggle" and r.switches:
                out.append(dict(r.switches))
    return out
