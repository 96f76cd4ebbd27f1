"""The one way to open a file in a run directory (a trust boundary),
and the one module through which every path a user, a run directory, a dataset, a model
directory or a cache supplies is read and written: tests/robustness/test_file_boundary.py
fails on a raw open/read/write/rename/remove anywhere else in the product (short allow-list).

Anything in a run directory may have been moved, swapped, planted, torn or filled by someone
else, so every reader and writer of its files goes through here:

- read: `read_bounded` opens without following a link and without blocking (a FIFO), takes
  only a regular file of at most `cap` bytes, and says why not in a `Refused` (an OSError, so
  a caller that handles "cannot read" handles it too). `parse_json` / `parse_toml` refuse
  nesting deeper than a cap instead of recursing into a RecursionError.
- identity: `not_own` is the one rule for a file written or appended in place: a regular file
  with one link (a hard link is another file's name), this user's, writable by no one else.
  `open_own` (AppendLog, open_append, truncate, create_new) opens without following a link or
  blocking on a FIFO and holds the file to it; `private_dir` is the rule for a directory a
  library reads code back from (torch's compile caches).
- write: `atomic_write` writes a temp file made with O_CREAT|O_EXCL|O_NOFOLLOW (a random name:
  nothing planted is ever opened), fsyncs it and renames it over the target (a rename replaces
  a link, never writes through it). `AppendLog` appends whole lines or none: a write cut short
  (disk full) is truncated back to the last whole line.
- directories: `make_dir` creates one and refuses a link or a non-directory in its place;
  `remove_tree` removes a directory this process made (never following a link).
- `check_no_links`: a run directory holding links where the run writes is refused in one line.

`follow_links=True` is for inputs the user names themselves (a corpus, a dataset's token
files, a tokenizer): a link there is theirs to make, and what it reaches is still checked to be
a regular file within its cap.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import shutil
import stat
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from engine.errors import UserError

KiB, MiB = 1 << 10, 1 << 20
MAX_DEPTH = 64  # JSON/TOML nesting a run's own files never come near; json/tomllib recurse per level
TMP_SUFFIX = ".tmp"  # temp files are ".NAME.RANDOM.tmp": swept by the writer, never reused
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
TOKENIZER_CAP = 256 * MiB  # a tokenizer.json (GPT-2's is 1.4 MB; a 256k vocab's tens of MB)
PROC_CAP = 16 * MiB  # a /proc file (mounts on a busy host, cpuinfo on many cores)


class Refused(OSError):
    """A run-directory file that is not read: a link, not a regular file, or over its cap."""


def open_regular(path: Path | str, cap: int | None = None, follow_links: bool = False) -> int:
    """A read-only fd of `path` if it is a regular file (not a link, never blocking on a FIFO)
    of at most `cap` bytes; Refused (or the OSError, e.g. FileNotFoundError) otherwise."""
    try:
        fd = os.open(path, READ_FLAGS & ~os.O_NOFOLLOW if follow_links else READ_FLAGS)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise Refused(errno.ELOOP, f"{path} is a symbolic link") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(errno.EINVAL, f"{path} is not a regular file")
        if cap is not None and st.st_size > cap:
            raise Refused(errno.EFBIG, f"{path} is {st.st_size} bytes, over {cap}")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bounded(path: Path | str, cap: int, follow_links: bool = False) -> bytes:
    """The bytes of a small regular file (see open_regular); Refused if it grew past `cap`."""
    fd = open_regular(path, cap, follow_links)
    try:
        chunks, left = [], cap + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > cap:
        raise Refused(errno.EFBIG, f"{path} grew over {cap} bytes while read")
    return data


@contextlib.contextmanager
def open_read(path: Path | str, cap: int | None = None, offset: int = 0, follow_links: bool = False) -> Iterator[BinaryIO]:
    """A regular file opened for reading from `offset` (a log read line by line, a checkpoint)."""
    fd = open_regular(path, cap, follow_links)
    f = os.fdopen(fd, "rb")
    with f:
        if offset:
            f.seek(offset)
        yield f


open_log = open_read


def read_text(path: Path | str, cap: int, follow_links: bool = False) -> str:
    """A small regular file's UTF-8 text; OSError (Refused included) or UnicodeDecodeError (a ValueError)."""
    return read_bounded(path, cap, follow_links).decode("utf-8")


def is_regular(path: Path) -> bool:
    """A regular file itself, not a link to one (lstat): what a checkpoint listing keeps."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


# ---------------------------------------------------------------- parsing, bounded


def depth(text: str | bytes) -> int:
    """The deepest nesting of [ and { outside JSON strings (what json.loads recurses on)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    if "[" not in text and "{" not in text:
        return 0
    level = deepest = 0
    in_str = escaped = False
    for ch in text:
        if in_str:
            escaped, in_str = (False, True) if escaped else (ch == "\\", ch != '"')
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            level += 1
            deepest = max(deepest, level)
        elif ch in "]}":
            level -= 1
    return deepest


def parse_json(data: str | bytes, max_depth: int = MAX_DEPTH) -> Any:
    """json.loads with the nesting capped; ValueError for anything that is no such JSON."""
    if depth(data) > max_depth:
        raise ValueError(f"nested deeper than {max_depth}")
    try:
        return json.loads(data)
    except (RecursionError, MemoryError, UnicodeDecodeError) as err:
        raise ValueError(type(err).__name__) from None


def parse_toml(data: bytes, max_depth: int = MAX_DEPTH) -> dict[str, Any]:
    """tomllib.loads of bytes with nesting capped; ValueError (TOMLDecodeError is one) otherwise."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("not UTF-8") from None
    if text.count("[") + text.count("{") > max_depth and depth(text) > max_depth:
        raise ValueError(f"nested deeper than {max_depth}")
    try:
        return tomllib.loads(text)
    except (RecursionError, MemoryError) as err:
        raise ValueError(type(err).__name__) from None


def read_json(path: Path | str, cap: int, max_depth: int = MAX_DEPTH, follow_links: bool = False) -> Any:
    """A small JSON file, bounded; OSError (Refused included) or ValueError."""
    return parse_json(read_bounded(path, cap, follow_links), max_depth)


def read_toml(path: Path | str, cap: int = MiB, max_depth: int = MAX_DEPTH, follow_links: bool = False) -> dict[str, Any]:
    """A TOML file (a run's, or a config the user names), bounded; OSError (Refused included) or ValueError."""
    return parse_toml(read_bounded(path, cap, follow_links), max_depth)


# ---------------------------------------------------------------- writing, never through a link


def not_own(st: os.stat_result) -> str | None:
    """Why the file `st` describes (an lstat or an fstat) is not this process's own plain file
    to write in place, or None when it is. The one identity rule for every file written or
    appended in a run directory, a dataset, a cache or a model directory: a regular file (not a
    link, a FIFO, a device), one link (a hard link is another file's name: `cp -al` makes them,
    and writing one writes the other), owned by this user, writable by no one else."""
    if stat.S_ISLNK(st.st_mode):
        return "a symbolic link"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_nlink > 1:
        return f"a hard link ({st.st_nlink} names for one file: writing it writes the others)"
    if st.st_uid != os.geteuid():
        return "not owned by this user"
    if st.st_mode & 0o022:
        return f"writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def own_fd(fd: int, path: Path | str) -> int:
    """`fd` (just opened at `path`) if it passes the identity rule (`not_own`); else it is closed
    and the refusal is one UserError line. Non-blocking I/O is turned off again (a regular file)."""
    try:
        why = not_own(os.fstat(fd))
        if why is None:
            os.set_blocking(fd, True)
            return fd
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    raise UserError(f"{path} is {why}; gpt2-tui writes only its own files: remove it (or make a real copy of "
                    "the directory with `cp -a`) and try again")  # fmt: skip


def open_own(path: Path | str, flags: int, mode: int = 0o644) -> int:
    """An fd to write `path` in place (created if missing): opened with O_NOFOLLOW and O_NONBLOCK
    (a FIFO never blocks the open, with a reader or without), then held to the identity rule."""
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise UserError(f"{path} is a symbolic link; gpt2-tui writes only its own files: remove the link "
                            "and try again") from None  # fmt: skip
        if err.errno == errno.ENXIO:  # a FIFO no one reads (O_WRONLY|O_NONBLOCK)
            raise UserError(f"{path} is not a regular file; remove it and try again") from None
        raise
    return own_fd(fd, path)


def private_dir(path: Path | str) -> Path:
    """A directory only this user can write or list (made 0700 when missing), for what a
    library reads back as code (torch's compile caches unpickle what they find). One that is a
    link, not this user's, or writable by others is Refused; one of ours that others may only
    read (an older version made it 0755) is closed to them first."""
    path = Path(path)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except FileNotFoundError:
        make_dir(path.parent)
        os.mkdir(path, 0o700)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise Refused(errno.ELOOP, f"{path} is a symbolic link")
    if not stat.S_ISDIR(st.st_mode):
        raise Refused(errno.ENOTDIR, f"{path} is not a directory")
    if st.st_uid != os.geteuid():
        raise Refused(errno.EPERM, f"{path} is not owned by this user")
    if st.st_mode & 0o022:
        raise Refused(errno.EPERM, f"{path} may be written by others (mode {stat.S_IMODE(st.st_mode):o})")
    up = os.stat(path.absolute().parent)
    if up.st_mode & 0o022 and not up.st_mode & stat.S_ISVTX:  # they could rename ours away and put theirs
        mode = stat.S_IMODE(up.st_mode)
        raise Refused(errno.EPERM, f"{path.absolute().parent} may be written by others (mode {mode:o})")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700, follow_symlinks=False)
    return path



def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{secrets.token_hex(6)}{TMP_SUFFIX}")


def create_new(path: Path, mode: int = 0o644) -> int:
    """A new file at `path` (O_EXCL|O_NOFOLLOW: never an existing file, never through a link),
    checked by the identity rule like every file written here (`own_fd`)."""
    return own_fd(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode), path)


def atomic_write(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Write a new temp file, fsync, rename over `path`: readers see the old file or the new one,
    never half; nothing outside the directory is written whatever `path` was. A failed write
    (disk full, an interrupt) removes its temp file."""
    path = Path(path)
    _check_target(path)
    tmp = temp_name(path)
    try:
        with os.fdopen(create_new(tmp), "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        _discard(tmp)
        raise
    _publish(tmp, path)


def _check_target(path: Path) -> None:
    """What atomic_write renames over: nothing, or a regular file (or a link: the rename replaces
    the name, never writes through it) of this user. A hard link or a loose mode does not matter
    here (the rename gives `path` a new file of its own); a directory, a FIFO, a device or
    another user's file at `path` is Refused."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        return
    if not stat.S_ISREG(st.st_mode):
        raise Refused(errno.EINVAL, f"{path} is not a regular file")
    if st.st_uid != os.geteuid():
        raise Refused(errno.EPERM, f"{path} is not owned by this user")


def _discard(tmp: Path) -> None:
    with contextlib.suppress(OSError):
        tmp.unlink()


def _publish(tmp: Path, dst: Path) -> None:
    """Rename a finished temp file over `dst` (its directory synced), or remove it on failure."""
    try:
        os.replace(tmp, dst)
    except BaseException:
        _discard(tmp)
        raise
    _fsync_dir(dst.parent)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    atomic_write(path, lambda f: f.write(data))


def write_text(path: Path, text: str) -> None:
    """`text` as UTF-8, atomically (see atomic_write)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def copy_file(src: Path | str, dst: Path, cap: int, follow_links: bool = False) -> None:
    """`dst` made, atomically, a copy of the regular file `src` of at most `cap` bytes."""
    atomic_write_bytes(dst, read_bounded(src, cap, follow_links))


def open_new(path: Path) -> BinaryIO:
    """A new file to write (O_EXCL|O_NOFOLLOW: never an existing file, never through a link),
    for a file in a directory this process made (a dataset built in its temp directory)."""
    return os.fdopen(create_new(path), "wb")


def truncate(path: Path | str, size: int) -> None:
    """Cut a file of our own (`own_fd`) back to `size` bytes (a partial prepare resumed)."""
    fd = own_fd(os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC), path)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


def private_key(path: Path | str, size: int = 32, create: bool = False) -> bytes | None:
    """A secret of `size` bytes kept in `path` for this user alone: a regular file (not a link),
    owned by this user, readable by no one else (no group or other bits), of exactly `size`
    bytes; Refused otherwise. Missing: None, or (`create`) made (mode 0600, O_EXCL temp then a
    hard link, so two processes racing agree on one key) and returned."""
    path = Path(path)
    try:
        fd = open_regular(path, cap=size)  # not a link, a regular file, no larger than a key
    except FileNotFoundError:
        if not create:
            return None
        make_dir(path.parent)
        tmp = temp_name(path)
        try:
            wfd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(wfd, "wb") as f:
                os.fchmod(f.fileno(), 0o600)
                f.write(secrets.token_bytes(size))
                f.flush()
                os.fsync(f.fileno())
            with contextlib.suppress(FileExistsError):  # another process made it first: theirs is the key
                os.link(tmp, path, follow_symlinks=False)
        finally:
            _discard(tmp)
        return private_key(path, size, create=False)
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise Refused(errno.EPERM, f"{path} is not owned by this user")
        if st.st_mode & 0o077:
            raise Refused(errno.EPERM, f"{path} may be read or written by others (mode {stat.S_IMODE(st.st_mode):o})")
        data = os.pread(fd, size + 1, 0)
    finally:
        os.close(fd)
    if len(data) != size:
        raise Refused(errno.EINVAL, f"{path} is not a {size}-byte key")
    return data


# ---------------------------------------------------------------- directories, names


def make_dir(path: Path | str, parents: bool = True, exist_ok: bool = True) -> Path:
    """Create a directory (and its parents); Refused when what stands at `path` is a link or
    not a directory (mkdir's exist_ok alone takes a link to a directory for one)."""
    path = Path(path)
    path.mkdir(parents=parents, exist_ok=exist_ok)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise Refused(errno.ELOOP, f"{path} is a symbolic link, not a directory")
    if not stat.S_ISDIR(st.st_mode):
        raise Refused(errno.ENOTDIR, f"{path} is not a directory")
    return path


def make_new_dir(path: Path | str) -> Path:
    """A directory that did not exist (FileExistsError otherwise): one this process owns."""
    return make_dir(path, parents=False, exist_ok=False)


def remove(path: Path | str) -> None:
    """Remove a file if it is there (unlink removes a link itself, never what it points to)."""
    Path(path).unlink(missing_ok=True)


def remove_dir(path: Path | str) -> None:
    """Remove an empty directory (OSError if it holds anything)."""
    os.rmdir(path)


def remove_tree(path: Path | str) -> None:
    """Remove a directory this process made, and all in it; a link in its place is removed as
    a link (rmtree never follows one); errors ignored (what is left is left)."""
    path = Path(path)
    if path.is_symlink():
        remove(path)
        return
    shutil.rmtree(path, ignore_errors=True)


def rename(src: Path | str, dst: Path | str) -> None:
    """os.rename: publish a finished directory (replaces `dst` only when it is an empty one)."""
    os.rename(src, dst)


def replace(src: Path | str, dst: Path | str) -> None:
    """os.replace within one directory tree (a rename replaces a link, never writes through it)."""
    os.replace(src, dst)


def cache_root(cache_dir: Path | None = None) -> Path:
    """Where gpt2-tui keeps what it builds once and reuses (datasets, tokenizers, compiled code):
    cache_dir, else $GPT2_TUI_CACHE, else ~/.cache/gpt2-tui."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("GPT2_TUI_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "gpt2-tui"


def _pid_space() -> str:
    """8 hex digits naming this host and pid namespace: a pid means a process only within them (a
    build dir on a shared volume may come from another machine or container, whose pids are not ours)."""
    import hashlib
    import socket

    try:
        ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        ns = ""
    return hashlib.sha256(f"{socket.gethostname()}|{ns}".encode()).hexdigest()[:8]


def build_dir_name(out: Path, pid: int | None = None) -> Path:
    """The hidden `.OUT.tmp-PID-SPACE-HEX` directory a build of `out` (prepare, export) by process
    `pid` (this one's unless given) fills before renaming it into place: its pid, read in its pid
    space (host and namespace), says whether the build still lives (sweep_dead_builds)."""
    out = Path(out)
    return out.parent / f".{out.name}.tmp-{os.getpid() if pid is None else pid}-{_pid_space()}-{secrets.token_hex(4)}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's, alive
        return True
    return True


def sweep_dead_builds(out: Path) -> None:
    """A build killed midway (kill -9, power) leaves its `.NAME.tmp-PID-SPACE-HEX` folder beside
    `out` forever: remove the ones of `out` that are ours, whose process is gone. Ours: a
    directory (not a link) this user owns, named in this host's and pid namespace's space, so a
    pid means our process; anything else (another user's, another machine's on a shared volume,
    an older name without a space) is never touched."""
    import re

    out = Path(out)
    pattern = re.compile(rf"\.{re.escape(out.name)}\.tmp-(\d+)-([0-9a-f]{{8}})-[0-9a-f]+")
    try:
        entries = list(out.parent.iterdir())
    except OSError:
        return
    space, uid = _pid_space(), os.geteuid()
    for p in entries:
        m = pattern.fullmatch(p.name)
        if not m or m.group(2) != space:
            continue
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == uid and not _pid_alive(int(m.group(1))):
            remove_tree(p)


def link_or_copy(src: Path, dst: Path) -> None:
    """Make `dst` the same content as `src` atomically (a hard link costs no second write)."""
    tmp = temp_name(dst)
    try:
        os.link(src, tmp, follow_symlinks=False)
    except OSError:
        atomic_write(tmp, lambda f: f.write(read_bounded(src, 1 << 40)))
    _publish(tmp, dst)


def open_append(path: Path) -> BinaryIO:
    """A file to append to (a child's console log, metrics.csv, a dataset being streamed): never
    through a link, never blocking on a FIFO, and only this process's own plain file (`own_fd`);
    UserError in one line otherwise."""
    f = os.fdopen(open_own(path, os.O_WRONLY | os.O_APPEND), "ab")
    f.seek(0, os.SEEK_END)
    return f


class AppendLog:
    """An append-only log of lines (events.jsonl): opened without following a link, each line
    written whole or not at all. A write cut short (a full disk cuts at a page boundary) is
    truncated back to where the line began, so the next line never glues onto half of one."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.dropped = 0  # lines not written (disk full, file gone)
        self.fd = self._open()
        size = os.fstat(self.fd).st_size
        if size and os.pread(self.fd, 1, size - 1) != b"\n":
            self.write(b"\n")  # a kill -9 tore the last line: end it, so the next event stays whole

    def _open(self) -> int:
        return open_own(self.path, os.O_RDWR | os.O_APPEND)

    def moved(self) -> bool:
        """The file we write is no longer at its path (log rotation moved or deleted it)."""
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        mine = os.fstat(self.fd)
        return (st.st_dev, st.st_ino) != (mine.st_dev, mine.st_ino)

    def reopen(self) -> None:
        """Write at the path again (a new file where the old one was moved away)."""
        fd = self._open()
        os.close(self.fd)
        self.fd = fd

    def write(self, line: bytes) -> bool:
        """Append `line` whole, or nothing (False, counted in `dropped`)."""
        start = None
        try:
            start = os.fstat(self.fd).st_size
            view = memoryview(line)
            while view:
                n = os.write(self.fd, view)
                if n <= 0:
                    raise OSError(errno.ENOSPC, "short write")
                view = view[n:]
            return True
        except OSError:
            self.dropped += 1
            if start is not None:
                with contextlib.suppress(OSError):
                    os.ftruncate(self.fd, start)  # take back the half line
            return False

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


def not_own_files(directory: Path) -> list[str]:
    """What in a work directory this process resumes (a `.partial` prepare) is not its own plain
    file by the identity rule (`not_own`): the directory itself a link, or an entry that is a
    link, a directory, a special file, a hard link to a file elsewhere (writing it would write
    there), another user's or writable by others. Empty when all is plain, or when nothing is
    at `directory`."""
    directory = Path(directory)
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        return []
    if not stat.S_ISDIR(st.st_mode):
        return [directory.name + (" (a symbolic link)" if stat.S_ISLNK(st.st_mode) else " (not a directory)")]
    found = []
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        why = not_own(entry.stat(follow_symlinks=False))
        if why is not None:
            found.append(f"{entry.name} ({why.split(' (')[0]})")
    return found


def not_own_names(directory: Path, names: tuple[str, ...]) -> list[tuple[str, str]]:
    """(name, why) for each of `names` present in `directory` that fails the identity rule."""
    found = []
    for name in names:
        try:
            why = not_own(os.lstat(Path(directory) / name))
        except OSError:
            continue
        if why is not None:
            found.append((name, why))
    return found


# ---------------------------------------------------------------- the run directory itself


def links_in(run_dir: Path, names: tuple[str, ...]) -> list[str]:
    """Which of `names` (relative to run_dir) are symbolic links."""
    return [n for n in names if os.path.islink(Path(run_dir) / n)]


def check_no_links(run_dir: Path, names: tuple[str, ...]) -> None:
    """Refuse, in one line, a run directory holding links where the run writes."""
    found = links_in(run_dir, names)
    if found:
        raise UserError(f"{run_dir} holds symbolic links where a run writes ({', '.join(found)}); "
                        "a run writes only its own files: remove the links and try again")  # fmt: skip
