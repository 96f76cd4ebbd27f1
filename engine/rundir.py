"""The run directory: config.toml, events.jsonl, checkpoints/, tokenizer.json.

A run directory describes itself: `attach`, `--resume` and `sample` need nothing else.
It has one writer at a time: an OS lock (flock on the run directory itself, which no one can
delete from under it; writer.lock is flock'ed too, for older versions) held for the run's life,
so a second `train --resume` or a second new run racing on one `--out` is refused. Whether a
run is live, and who writes it, comes from that lock's holder, never from writer.pid alone.
Every file here is opened through engine.files (no links followed, bounded reads).
Output paths of every command (runs, datasets, benchmark tables) are checked here too.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import time
import tomllib
from pathlib import Path

from engine import files, text
from engine.config import RunConfig, build, check_file_types
from engine.errors import UserError
from engine.text import program

CONFIG, EVENTS, CHECKPOINTS, TOKENIZER = "config.toml", "events.jsonl", "checkpoints", "tokenizer.json"
WRITER = "writer.pid"  # "host pid since" of the process writing the run, while it runs
WRITER_LOCK = "writer.lock"  # flock'ed too (older versions lock only this); the run dir's own flock is the lock
LAUNCH_LOG = "console.log"  # the app's detached launch writes the run's console here before it starts
MAILBOX = "requests.jsonl"  # engine.run.requests's; named here for the link check
METRICS_CSV, TENSORBOARD, WANDB = "metrics.csv", "tensorboard", "wandb"  # engine.run.loggers' (--log csv|tensorboard|wandb)
# where a run writes: a link at any of these names is refused before anything is written
WRITTEN = (CONFIG, EVENTS, WRITER, WRITER_LOCK, TOKENIZER, MAILBOX, LAUNCH_LOG, CHECKPOINTS, f"{CHECKPOINTS}/latest",
           f"{CHECKPOINTS}/best.pt", METRICS_CSV, TENSORBOARD, WANDB)  # fmt: skip
PID_CAP = 4096  # writer.pid is one short line
# written or appended in place (not renamed over): each is held to files.not_own (regular, one link, ours)
IN_PLACE = (EVENTS, METRICS_CSV, LAUNCH_LOG, WRITER_LOCK)
_NOT_CONTENT = frozenset({LAUNCH_LOG, WRITER, WRITER_LOCK})  # what a fresh --out may already hold
# kernel file systems that look like directories but hold no files of ours
_PSEUDO_FS = frozenset(
    "proc sysfs devtmpfs devpts cgroup cgroup2 debugfs tracefs securityfs pstore bpf configfs "
    "fusectl mqueue efivarfs binfmt_misc autofs nsfs selinuxfs hugetlbfs".split()
)


def default_path(preset: str | None) -> Path:
    return Path("runs") / f"{preset or 'run'}-{time.strftime('%Y%m%d-%H%M%S')}"


def holds_run(path: Path) -> bool:
    return (path / CONFIG).exists() or (path / EVENTS).exists()


def check_new(path: Path, flag: str = "--out") -> None:
    """Refuse, before a single byte is written, an output path that would overwrite anything or
    cannot be made: every command's output (a run's, a dataset's, a benchmark's) is a new path,
    or an empty directory, on storage this process can write."""
    path = Path(path)
    if path.is_symlink() and not path.exists():
        raise UserError(f"{flag} {path} is a symbolic link that leads nowhere (a loop or a missing target); "
                        "choose a new directory path")  # fmt: skip
    try:
        st: os.stat_result | None = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        st = None  # a new path (or one under a file: found below)
    except OSError as err:
        raise UserError(f"{flag} {path} cannot be used ({err.strerror}); choose a new directory path") from None
    if st is None:
        parent = path.absolute().parent
        while not os.path.lexists(parent):
            parent = parent.parent
        if not parent.is_dir():
            what = "a file" if parent.is_file() else "not a directory (a broken or looping link?)"
            raise UserError(f"{flag} {path} cannot be made: {parent} is {what}; choose a path under a directory")
        _check_writable(parent, path, flag)
        return
    if not stat.S_ISDIR(st.st_mode):
        raise UserError(f"{flag} {path} is a file; choose a new directory path")
    if holds_run(path):
        raise UserError(f"{path} already holds a run; continue it with --resume {path} or choose another {flag}")
    try:
        names = [p.name for p in path.iterdir()]
    except OSError as err:
        raise UserError(f"{flag} {path} cannot be read ({err.strerror}); choose a new directory path") from None
    if any(n not in _NOT_CONTENT for n in names):
        raise UserError(f"{flag} {path} is not empty; choose a new or empty directory so nothing is overwritten")
    _check_writable(path, path, flag)


def _mount_of(path: str) -> tuple[str, str] | None:
    """(mount point, file system type) that holds `path` (Linux: /proc/self/mounts), or None."""
    try:
        lines = files.read_text("/proc/self/mounts", files.PROC_CAP).splitlines()
    except OSError:
        return None
    best: tuple[str, str] | None = None
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        mnt = parts[1].replace("\\040", " ")
        inside = path == mnt or path.startswith(mnt.rstrip("/") + "/")
        if inside and (best is None or len(mnt) >= len(best[0])):  # the last mount on a point wins
            best = (mnt, parts[2])
    return best


def _check_writable(directory: Path, path: Path, flag: str) -> None:
    """`directory` (the output itself or its nearest existing ancestor) must be real, writable storage."""
    real = os.path.realpath(directory)
    mount = _mount_of(real)
    if mount and mount[1] in _PSEUDO_FS:
        raise UserError(f"{flag} {path} is on {mount[0]}, the kernel's {mount[1]} file system, not storage; "
                        "choose a directory on a disk")  # fmt: skip
    try:
        read_only = bool(os.statvfs(real).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    if read_only:
        raise UserError(f"{flag} {path} is on a read-only file system ({mount[0] if mount else real}); "
                        "choose a writable directory")  # fmt: skip
    if not os.access(real, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {path}: {directory} cannot be written here (permission denied or immutable); "
                        "choose a directory you can write to")  # fmt: skip


def make_dir(path: Path, flag: str = "--out") -> None:
    """Create a checked output directory (and its parents); a failure is one line."""
    try:
        files.make_dir(path)
    except OSError as err:
        raise UserError(f"{flag} {path} could not be created ({err.strerror}); choose another path") from None


def claim_new(path: Path) -> None:
    """A new run's directory: checked, made, locked, and checked again under the lock, so of
    two runs racing on one path exactly one gets it."""
    check_new(path)
    make_dir(path)
    lock(path)
    try:
        check_new(path)  # another run may have filled it between the first check and the lock
    except BaseException:
        unlock(path)
        raise
    claim_writer(path)


def create(path: Path, config: RunConfig, tokenizer: str | None) -> bool:
    """Make a new run directory (claimed by this process), then config.toml and the tokenizer;
    whether the directory itself was made here (else it was an empty one given as --out)."""
    made = not os.path.lexists(path)
    claim_new(path)
    try:
        files.make_dir(path / CHECKPOINTS, parents=False)
        write_config(path, config)
        if tokenizer:
            files.copy_file(tokenizer, path / TOKENIZER, files.TOKENIZER_CAP, follow_links=True)  # never a torn copy
    except BaseException:
        discard_new(path, made)
        raise
    return made


def discard_new(path: Path, made: bool) -> None:
    """Undo create() for a new run refused before its first step, so a refusal leaves the file
    system as it was: what create() wrote goes (unlink never follows a link), then the
    directory if this process made it and nothing else is in it (the app's console.log, say,
    keeps it), then the lock."""
    for name in (CONFIG, TOKENIZER, WRITER_LOCK):
        with contextlib.suppress(OSError):
            files.remove(path / name)
    _drop_record(path)
    with contextlib.suppress(OSError):
        files.remove_dir(path / CHECKPOINTS)  # only when empty
        if made:
            files.remove_dir(path)
    unlock(path)


def write_config(path: Path, config: RunConfig) -> None:
    files.atomic_write_bytes(path / CONFIG, config.to_toml().encode())


def require_dir(path: Path) -> None:
    """UserError unless `path` is a directory, saying what it is instead."""
    if path.is_dir():
        return
    if path.exists():
        raise UserError(f"{path} is a file, not a run directory; give the directory a run wrote (its --out)")
    raise UserError(f"run directory {path} does not exist; check the path")


def load_config(path: Path) -> RunConfig:
    require_dir(path)
    if not os.path.lexists(path / CONFIG):
        raise UserError(f"{path} is not a run directory (no {CONFIG}); give the --out of a run")
    try:
        data = files.read_toml(path / CONFIG)
    except OSError as err:
        raise UserError(f"cannot read {path / CONFIG} ({err.strerror or err}); give the --out of a run") from None
    except tomllib.TOMLDecodeError as err:
        raise UserError(f"config file {path / CONFIG} is not valid TOML: {err}; fix the file") from None
    except ValueError as err:  # nested too deeply, not UTF-8
        raise UserError(f"config file {path / CONFIG} cannot be read ({str(err)[:200]}); fix the file") from None
    return build(check_file_types(data, f"config file {path / CONFIG}"))


def tokenizer_of(path: Path) -> Path | None:
    p = path / TOKENIZER
    return p if files.is_regular(p) else None


# ---------------------------------------------------------------- the one writer

_held: dict[str, tuple[int, int]] = {}  # run dir (resolved) -> fds of it and its writer.lock, held here
_identities: dict[str, dict[str, object]] = {}  # run dir -> its identity, for writer.lock once the run writes
_recorded: set[str] = set()  # run dirs whose writer.pid this process wrote


def _key(path: Path) -> str:
    return str(Path(path).resolve())


def _held_by_ancestor(path: Path) -> bool:
    """Under `--nproc` the launcher holds the run's lock for its ranks (its descendants through
    torchrun), which must not refuse each other. Who holds it comes from the lock itself
    (lock_holder), not from anything a process could set for itself (an environment variable)."""
    holder = lock_holder(path)
    pid = os.getppid()
    for _ in range(64):  # a process tree is shallow; a loop in it is not followed forever
        if holder is None or pid <= 1:
            return False
        if pid == holder:
            return True
        pid = _parent_pid(pid)
    return False


def _parent_pid(pid: int) -> int:
    """The parent of `pid` from /proc/PID/stat (0 when it cannot be read)."""
    try:
        stat = files.read_bounded(f"/proc/{pid}/stat", 4096)
        return int(stat[stat.rindex(b")") + 2:].split()[1])  # "pid (comm) state ppid ...": comm may hold spaces
    except (OSError, ValueError, IndexError):
        return 0


def lock(path: Path) -> None:
    """Take the run's writer lock: flock on the run directory itself (the kernel drops it when
    the process dies, kill -9 included; deleting a file cannot free it). Idempotent in the
    process that holds it; anyone else is refused in one line, and so is a run directory that
    holds links where the run writes."""
    import fcntl

    key = _key(path)
    if key in _held or _held_by_ancestor(path):
        return
    files.check_no_links(path, WRITTEN)
    try:
        dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        raise UserError(f"cannot lock run directory {path} ({err.strerror}); check its permissions") from None
    try:
        fcntl.flock(dir_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(dir_fd)
        raise UserError(
            f"{path} is being written by {holder(path)}; wait for it, stop it, or watch it with "
            f"`{program()} attach {path}`"
        ) from None
    try:
        here = _check_own(path, os.fstat(dir_fd))  # a clone by hard links, a planted FIFO: refused, nothing written
    except BaseException:
        os.close(dir_fd)
        raise
    try:  # older versions lock writer.lock: hold it too, so they are refused as well
        file_fd = files.open_own(path / WRITER_LOCK, os.O_RDWR)
    except OSError as err:
        os.close(dir_fd)
        raise UserError(f"cannot lock run directory {path} ({err.strerror}); check its permissions") from None
    except BaseException:
        os.close(dir_fd)
        raise
    try:
        fcntl.flock(file_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(file_fd)
        os.close(dir_fd)
        raise UserError(f"{path} is being written by {holder(path)}; wait for it or stop it") from None
    _held[key] = (dir_fd, file_fd)
    _identities[key] = here  # recorded by claim_writer, once the run writes: a refusal leaves writer.lock as it was


def open_to_others(path: Path) -> str | None:
    """Why a resume should say that others can change what it loads, or None: the run directory
    or its checkpoints/ belongs to another user or is writable by others (a 0777 run directory
    resumed without a word; group-writable is left alone: a umask of 002 makes every directory
    so). Read with lstat: a link is judged, not followed."""
    for where in (Path(path), Path(path) / CHECKPOINTS):
        try:
            st = os.lstat(where)
        except OSError:
            continue
        shown = text.path_text(str(where))
        if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
            return (f"{shown} belongs to another user (uid {st.st_uid}): what it holds was not written by this user, "
                    "and the resume loads it; resume a copy of your own (`cp -a`)")  # fmt: skip
        if st.st_mode & stat.S_IWOTH:
            return (f"{shown} is writable by others (mode {stat.S_IMODE(st.st_mode):o}): anyone on this machine can "
                    f"replace the checkpoints a resume loads; `chmod go-w {shown}`")  # fmt: skip
    return None


def _identity(path: Path, st: os.stat_result) -> dict[str, object]:
    return {"dev": st.st_dev, "ino": st.st_ino, "path": str(Path(path).absolute())}


def _recorded_identity(path: Path) -> dict[str, object] | None:
    """The run directory's identity as writer.lock records it (the last writer's), or None."""
    try:
        record = files.read_json(Path(path) / WRITER_LOCK, PID_CAP, max_depth=2)
    except (OSError, ValueError):
        return None
    kinds = (("dev", int), ("ino", int), ("path", str))
    ok = isinstance(record, dict) and all(isinstance(record.get(k), t) for k, t in kinds)
    return record if ok else None


def _check_own(path: Path, st: os.stat_result) -> dict[str, object]:
    """Under the directory's lock, before anything is written: each file the run writes in place
    (IN_PLACE) is its own by files.not_own. A directory whose writer.lock records another
    directory's identity and whose files are hard links is a clone (`cp -al RUN CLONE`): its
    files ARE the other run's, so it is refused in one line that says how to copy it for real.
    Returns this directory's identity (recorded once the lock is held)."""
    here = _identity(path, st)
    bad = files.not_own_names(path, IN_PLACE)
    if not bad:
        return here
    linked = [name for name, why in bad if why.startswith("a hard link")]
    record = _recorded_identity(path)
    shown = text.path_text(str(path))
    if linked and record is not None and (record["dev"], record["ino"]) != (here["dev"], here["ino"]):
        source = text.path_text(str(record["path"]))
        raise UserError(f"{shown} is a copy of the run {source} made with hard links (cp -al): its "
                        f"{', '.join(linked)} {'is' if len(linked) == 1 else 'are'} that run's own file"
                        f"{'' if len(linked) == 1 else 's'}, and writing here would write there; make a real "
                        f"copy with `cp -a {shown} NEW` and resume NEW")  # fmt: skip
    name, why = (linked[0], next(w for n, w in bad if n == linked[0])) if linked else bad[0]
    fix = (f"make a real copy with `cp -a {shown} NEW` and resume NEW" if linked else
           "remove it (or give it back to this user, writable by no one else) and try again")  # fmt: skip
    raise UserError(f"{text.path_text(str(Path(path) / name))} is {why}; a run writes only its own files: {fix}")


def _record_identity(fd: int, identity: dict[str, object]) -> None:
    """writer.lock (held, our own file) records which directory this run is, so a copy of it by
    hard links is told apart from it (_check_own). Written in place: the lock stays on its inode."""
    import json

    data = (json.dumps(identity) + "\n").encode()
    try:
        if os.pread(fd, PID_CAP, 0) != data:
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
    except OSError:
        pass  # a full disk: the record is a guard, not the lock


def unlock(path: Path) -> None:
    """Drop the lock (not the record): for a check that refused after locking."""
    fds = _held.pop(_key(path), None)
    _identities.pop(_key(path), None)
    for fd in fds or ():
        os.close(fd)  # closing the last descriptor drops the flock


def holder(path: Path) -> str:
    """Who holds the run's lock, in words: pid, host and since when (writer.pid, when it names
    the lock's holder), else the kernel's table."""
    locker = lock_holder(path) or _flock_pid(Path(path) / WRITER_LOCK)
    record = writer_record(path)
    if record is not None and (locker is None or record[1] == locker):
        host, pid, since = record
        return f"pid {pid} on {text.path_text(host)}" + (f" since {text.path_text(since)}" if since else "")
    return f"pid {locker} on this host (starting up)" if locker else "another process (starting up)"


def lock_holder(path: Path) -> int | None:
    """The pid holding the run directory's writer lock (Linux), or None: who writes a run, and
    whether anyone does, comes from the lock, never from writer.pid alone."""
    return _flock_pid(Path(path))


def _flock_pid(locked: Path) -> int | None:
    """The pid holding a flock on the file or directory `locked`, from /proc/locks (Linux), or
    None. A row is this file's only when its device (major:minor, hex) and inode both match:
    an inode number alone is shared by files on other file systems."""
    try:
        st = os.stat(locked)
        lines = files.read_text("/proc/locks", files.PROC_CAP).splitlines()
    except OSError:
        return None
    mine = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    for line in lines:
        f = line.split()  # "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"
        if len(f) > 5 and f[1] == "FLOCK" and f[4].isdigit() and _lock_file_id(f[5]) == mine:
            return int(f[4])
    return None


def _lock_file_id(field: str) -> tuple[int, int, int] | None:
    """/proc/locks' "MAJOR:MINOR:INODE" (device numbers in hex, the inode in decimal)."""
    parts = field.split(":")
    if len(parts) != 3:
        return None
    try:
        return int(parts[0], 16), int(parts[1], 16), int(parts[2])
    except ValueError:
        return None


def claim_writer(path: Path) -> None:
    """Hold the run's lock (idempotent) and record who writes it ("host pid since"), so `attach`
    and `gpt2-tui runs` can tell a live run from one whose writer died."""
    if _held_by_ancestor(path):
        return  # the launcher's record names the holder of the lock
    lock(path)
    key = _key(path)
    if key in _held and key in _identities:
        _record_identity(_held[key][1], _identities[key])
    since = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    files.atomic_write_bytes(path / WRITER, f"{socket.gethostname()} {os.getpid()} {since}\n".encode())
    _recorded.add(_key(path))


def release_writer(path: Path) -> None:
    """Drop our record, then the lock (in that order: a new writer never loses its record to us)."""
    _drop_record(path)
    unlock(path)


def _drop_record(path: Path) -> None:
    """Remove writer.pid if this process wrote it."""
    key = _key(path)
    if key in _recorded:
        files.remove(path / WRITER)
        _recorded.discard(key)


def writer_alive(path: Path) -> bool | None:
    """Whether a process writes this run: someone holds its lock. The one liveness rule (runs,
    toggle, attach): writer.pid may be stale, garbage or name a reused pid. None (unknown) only
    when nobody here holds the lock and writer.pid names another host: a lock taken there (a
    shared file system) is not visible from here."""
    if lock_holder(path) is not None:
        return True
    record = writer_of(path)
    return None if record is not None and record[0] != socket.gethostname() else False


def writer_record(path: Path) -> tuple[str, int, str] | None:
    """writer.pid as (host, pid, since), or None without a readable record (a label only)."""
    try:
        host, pid, *since = files.read_bounded(Path(path) / WRITER, PID_CAP).decode().split()
        return host, int(pid), since[0] if since else ""
    except (OSError, ValueError):
        return None


def writer_of(path: Path) -> tuple[str, int] | None:
    """The host and pid recorded as this run's writer, or None without a readable record."""
    record = writer_record(path)
    return None if record is None else (record[0], record[1])
