"""A run directory is a trust boundary (issue 21): nothing a file in it does (moved, swapped,
planted, torn, filled) loses steps, writes outside it, or reaches the terminal raw.

Each test is one item of the issue, on the real CLI (`gpt2-tui` in its own process), real
files, FIFOs, symlinks and, where the test runs as root, a small tmpfs for a full disk.
They are written against behaviour (exit codes, output, files, events.jsonl), not internals.
Request acknowledgements are `request` events {id, kind, status: applied|dropped, reason};
warnings are the existing `warning` event. Every child process runs under a memory limit
(a /dev/zero link must fail the test, not the machine) and a timeout (a FIFO must not hang it).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
GPT2_TUI = str(Path(sys.executable).parent / "gpt2-tui")
IS_ROOT = os.geteuid() == 0
MEM_LIMIT = 6 * 2**30  # address space of each child: torch fits, a read of /dev/zero does not
MICRO = ["--preset", "micro", "--device", "cpu", "--precision", "fp32", "--eval-batches", "1"]
QUIET = ["--eval-interval", "100000", "--ckpt-interval", "100000", "--sample-tokens", "0"]
LONG = 1_000_000  # steps: a run that trains until the test stops it
CONTROL = ("\x1b", "\x07", "\x9b")  # ESC, BEL, CSI: none may reach a terminal raw
MAILBOX = "requests.jsonl"  # a run's requests (engine/run/requests.py; issue 19 made it toggle.json's successor)


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEM_LIMIT, MEM_LIMIT))


def cli(*argv: str, timeout: float = 120, cwd: Path | None = None, **kw) -> subprocess.CompletedProcess[str]:
    """Run `gpt2-tui ARGV` to its end; a hang past `timeout` fails the test (the child is killed)."""
    try:
        return subprocess.run([GPT2_TUI, *argv], capture_output=True, text=True, timeout=timeout,
                              preexec_fn=_limit, cwd=cwd or ROOT, errors="surrogateescape", **kw)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"`gpt2-tui {' '.join(argv)}` hung for {timeout} s")


def one_line_refusal(res: subprocess.CompletedProcess[str], *words: str) -> None:
    err = res.stderr.strip()
    assert res.returncode == 2, (res.returncode, res.stdout[-2000:], err[-2000:])
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, err


class Run:
    """A `gpt2-tui train` in its own process (console to a file, so a full pipe never blocks it)."""

    def __init__(self, run_dir: Path, argv: list[str], log: Path):
        self.dir, self.log = run_dir, log
        self._out = open(log, "w")
        self.proc = subprocess.Popen([GPT2_TUI, "train", *argv], stdout=self._out, stderr=subprocess.STDOUT,
                                     cwd=ROOT, preexec_fn=_limit, start_new_session=True)  # fmt: skip

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def events(self) -> list[dict]:
        return read_events(self.dir)

    def step(self) -> int:
        return max((e["step"] for e in self.events() if e.get("event") == "step"), default=0)

    def wait_step(self, n: int, timeout: float = 90) -> int:
        """Block until the run logged step >= n; fail if it ended or took too long."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            s = self.step()
            if s >= n:
                return s
            if self.proc.poll() is not None:
                pytest.fail(f"the run ended (exit {self.proc.returncode}) before step {n}:\n{self.output()[-3000:]}")
            time.sleep(0.05)
        pytest.fail(f"the run did not reach step {n} in {timeout} s:\n{self.output()[-3000:]}")

    def alive_after(self, seconds: float) -> bool:
        try:
            self.proc.wait(seconds)
        except subprocess.TimeoutExpired:
            return True
        return False

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait(self, timeout: float = 60) -> int:
        """The exit status; a run that does not end in `timeout` s fails the test."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"the run did not end within {timeout} s:\n{self.output()[-3000:]}")

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM (saves a checkpoint and stops), then the exit status."""
        self.signal(signal.SIGTERM)
        return self.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        self._out.close()


def read_events(run_dir: Path) -> list[dict]:
    """The whole lines of events.jsonl that parse (a regular file only: the tests plant FIFOs)."""
    path = run_dir / "events.jsonl"
    try:
        if not path.is_file() or path.is_symlink():
            return []
        raw = path.read_bytes()
    except OSError:
        return []
    out = []
    for line in raw.split(b"\n"):
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if isinstance(e, dict):
            out.append(e)
    return out


def saved_steps(run_dir: Path) -> list[int]:
    ck = run_dir / "checkpoints"
    return sorted(int(p.name[5:11]) for p in ck.glob("step_*.pt")) if ck.is_dir() else []


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[Callable[..., Run]]:
    """Factory: runs(run_dir, data, *flags, max_steps=LONG) starts a micro run; all are killed at the end.
    Consoles go to tmp_path/logs: never onto a tmpfs a test fills."""
    started: list[Run] = []
    logs = tmp_path / "logs"
    logs.mkdir()

    def make(run_dir: Path, data: Path, *flags: str, max_steps: int = LONG, resume: bool = False) -> Run:
        if resume:
            argv = ["--resume", str(run_dir), "--max-steps", str(max_steps), *flags]
        else:
            argv = [*MICRO, *QUIET, "--data", str(data), "--out", str(run_dir), "--max-steps", str(max_steps), *flags]
        r = Run(run_dir, argv, logs / f"{run_dir.name}-{len(started)}.log")
        started.append(r)
        return r

    yield make
    for r in started:
        r.kill()


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """Factory: tmpfs("256k") mounts a tmpfs that small (root only; the test skips otherwise)."""
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        mnt = tmp_path / f"mnt{len(mounted)}"
        mnt.mkdir()
        if not IS_ROOT or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                                         capture_output=True).returncode != 0:  # fmt: skip
            pytest.skip("needs root with mount rights for a small tmpfs")
        mounted.append(mnt)
        return mnt

    yield mount
    for mnt in reversed(mounted):
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def fill(directory: Path, name: str = "filler") -> Path:
    """Write zeros into `directory` until its file system is full."""
    path = directory / name
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    return path


def trained(tmp_path: Path, data: Path, name: str = "run", steps: int = 2, *flags: str) -> Path:
    """A finished micro run."""
    run = tmp_path / name
    res = cli("train", *MICRO, "--data", str(data), "--out", str(run), "--max-steps", str(steps), *flags)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return run


def killed(runs: Callable[..., Run], tmp_path: Path, data: Path, name: str = "dead", at: int = 3) -> Path:
    """A run whose writer died (kill -9) at step `at` or so: writer.pid left behind, no ending."""
    r = runs(tmp_path / name, data)
    r.wait_step(at)
    r.kill()
    assert (r.dir / "writer.pid").exists()
    return r.dir


def deep_json(n: int = 100_000) -> str:
    return "[" * n


def steer(run_dir: Path, kind: str) -> None:
    """Ask a live run to pause or resume through its mailbox (signals only stop a run)."""
    from engine.run.requests import Request, post

    post(run_dir, Request(kind))


def requests(events: list[dict]) -> list[dict]:
    return [e for e in events if e.get("event") == "request"]


def warnings(events: list[dict]) -> list[str]:
    return [str(e.get("message")) for e in events if e.get("event") == "warning"]


# ================================================================ data loss


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_01_events_file_moved_mid_run_loses_no_steps(tmp_path, tiny_dataset, runs):
    """Log rotation moves events.jsonl: the run re-creates it and trains on (or saves and stops)."""
    r = runs(tmp_path / "run", tiny_dataset)
    moved_at = r.wait_step(20)
    (r.dir / "events.jsonl").rename(tmp_path / "events.jsonl.1")
    still = r.alive_after(3)
    code = r.stop() if still else r.wait()
    out = r.output()
    assert "nothing could be saved" not in out, out[-2000:]
    assert saved_steps(r.dir) and saved_steps(r.dir)[-1] >= moved_at, (code, saved_steps(r.dir), out[-2000:])
    if still:
        assert code == 0 and (r.dir / "events.jsonl").is_file(), (code, out[-2000:])


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_02_toggle_whose_save_fails_is_refused_and_the_run_trains_on(tmp_path, tiny_dataset, runs, tmpfs):
    """A nearly full disk: the toggle's save fails; the toggle is dropped, the run goes on, words are true."""
    mnt = tmpfs("192k")  # room for config and events, none for a checkpoint (~400 kB)
    r = runs(mnt / "run", tiny_dataset)
    r.wait_step(5)
    res = cli("toggle", str(r.dir), "--no-fused-adamw", timeout=60)
    assert res.returncode == 0, res.stderr
    time.sleep(1)
    at = r.step()
    assert r.alive_after(4), f"the run died on the toggle (exit {r.proc.returncode}):\n{r.output()[-3000:]}"
    assert r.step() > at  # it trains on
    r.stop()
    out = r.output()
    if not saved_steps(r.dir):
        assert "previous checkpoints are intact" not in out, out[-3000:]
    acks = [q for q in requests(r.events()) if q.get("kind") == "toggle"]
    assert len(acks) == 1 and acks[0]["status"] == "dropped" and acks[0].get("reason"), acks


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("plant", ["deep", "fifo", "devzero"])
def test_03_a_hostile_toggle_request_is_refused_in_one_warning(tmp_path, tiny_dataset, runs, plant):
    """The request mailbox (requests.jsonl, which took toggle.json's place in issue 19) that is deep
    JSON, a FIFO or a link to /dev/zero: one warning, training goes on, and SIGTERM still saves."""
    r = runs(tmp_path / "run", tiny_dataset)
    r.wait_step(3)
    req = r.dir / MAILBOX
    tmp = tmp_path / "planted"
    if plant == "deep":
        tmp.write_text(deep_json())
        os.replace(tmp, req)
    elif plant == "fifo":
        os.mkfifo(tmp)
        os.replace(tmp, req)
    else:
        tmp.symlink_to("/dev/zero")
        os.replace(tmp, req)
    time.sleep(1)
    at = r.step()
    assert r.alive_after(3), f"exit {r.proc.returncode}:\n{r.output()[-3000:]}"
    assert r.step() > at, "the trainer is stuck (blocked in open() or reading without bound)"
    code = r.stop(timeout=30)
    assert code == 0, r.output()[-3000:]
    assert saved_steps(r.dir), "SIGTERM did not save"
    about = [w for w in warnings(r.events()) if MAILBOX in w]
    assert len(about) == 1, warnings(r.events())


@pytest.mark.timeout(180)
def test_04a_one_invalid_utf8_byte_does_not_make_compare_refuse_the_run(tmp_path, trained_runs):
    run = trained_runs.copy("micro-3", tmp_path / "run")
    with open(run / "events.jsonl", "ab") as f:
        f.write(b'{"event": "warning", "message": "caf\xe9"}\n')
    res = cli("compare", str(run))
    assert res.returncode == 0, res.stderr
    assert run.name in res.stdout and "Traceback" not in res.stderr


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_04b_events_on_a_full_disk_are_whole_lines_or_none(tmp_path, tiny_dataset, runs, tmpfs):
    """The disk fills mid-run (a write is cut at a page boundary), then space comes back: every
    line in events.jsonl is still a whole event; none is torn or glued to the next."""
    mnt = tmpfs("4m")
    r = runs(mnt / "run", tiny_dataset)
    r.wait_step(3)
    filler = fill(mnt)
    size, stable_since = -1, time.monotonic()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and time.monotonic() - stable_since < 2:  # the log stopped growing
        now = (r.dir / "events.jsonl").stat().st_size
        if now != size:
            size, stable_since = now, time.monotonic()
        time.sleep(0.1)
    filler.unlink()
    at = r.step()
    deadline = time.monotonic() + 30
    while r.step() <= at + 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    r.stop()
    raw = (r.dir / "events.jsonl").read_bytes()
    bad = []
    for n, line in enumerate(raw.split(b"\n"), 1):
        if not line:
            continue
        try:
            e = json.loads(line)
            assert isinstance(e, dict) and "event" in e
        except (ValueError, AssertionError):
            bad.append((n, line[:80], line[-80:]))
    assert not bad, bad


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_05_deleting_writer_lock_does_not_let_a_second_writer_in(tmp_path, tiny_dataset, runs):
    r = runs(tmp_path / "run", tiny_dataset, "--ckpt-interval", "5")
    r.wait_step(6)
    (r.dir / "writer.lock").unlink()
    second = subprocess.Popen([GPT2_TUI, "train", "--resume", str(r.dir), "--max-steps", str(LONG)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                              preexec_fn=_limit)  # fmt: skip
    try:
        out, err = second.communicate(timeout=40)
    except subprocess.TimeoutExpired:
        second.kill()
        out, err = second.communicate()
        pytest.fail(f"a second writer got in while the first trains:\n{out[-1500:]}")
    assert second.returncode == 2 and "is being written by" in err, (second.returncode, out[-1500:], err)
    assert r.proc.poll() is None


# a dataset whose loss spikes now and then: mostly one token (learned at once), random stretches
# (on this seed the micro model's guard skips a spike at step 114 of 120)
def _spiky(make_dataset: Callable[..., Path]) -> Path:
    rng = np.random.default_rng(0)
    train = np.zeros(40_000, dtype=np.int64)
    for a in range(0, 40_000, 4_000):
        train[a : a + 400] = rng.integers(0, 4096, 400)
    val = np.zeros(2_000, dtype=np.int64)
    return make_dataset("gpt2-tui", train=train, val=val, vocab_size=4096, name="spiky")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_06_resume_is_exact_across_a_loss_spike(tmp_path, make_dataset):
    """The guard's loss level and bad-step streak are saved: a spike right after a resume is
    skipped as it is in a straight run, so the resumed curve equals the straight one."""
    data = _spiky(make_dataset)
    flags = ["--log-interval", "1", "--max-bad-steps", "50", "--sample-tokens", "0", "--eval-interval", "1000",
             "--decay-steps", "150"]  # the lr schedule does not depend on --max-steps  # fmt: skip
    straight = trained(tmp_path, data, "straight", 120, *flags)
    events = read_events(straight)
    spikes = [e for e in events if e.get("event") == "warning" and "skipped" in str(e.get("message"))]
    losses = {e["step"]: e["loss"] for e in events if e.get("event") == "step"}
    skipped_steps = sorted({int(s) for w in spikes for s in _numbers_after(str(w["message"]), "step ")})
    skipped_steps = [s for s in skipped_steps if s > 10]
    if not skipped_steps:
        pytest.skip(f"no loss spike in 120 steps on this build: {warnings(events)[:3]}")
    s = skipped_steps[0]
    split = trained(tmp_path, data, "split", s - 1, *flags, "--ckpt-interval", "1000")
    res = cli("train", "--resume", str(split), "--max-steps", str(s + 3))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr
    resumed = {e["step"]: e["loss"] for e in read_events(split) if e.get("event") == "step"}
    assert [resumed[k] for k in range(1, s)] == [losses[k] for k in range(1, s)]  # exact up to the split
    assert [resumed[k] for k in range(s, s + 4)] == [losses[k] for k in range(s, s + 4)], f"spike at step {s}"


def _numbers_after(text: str, word: str) -> list[int]:
    out = []
    for part in text.split(word)[1:]:
        digits = "".join(c for c in part[:12] if c.isdigit() or c == " ").split()
        if digits:
            out.append(int(digits[0]))
    return out


# ================================================================ security


@pytest.mark.timeout(180)
@pytest.mark.parametrize("link", [".writer.pid.tmp", "checkpoints/.step_000004.pt.tmp", "events.jsonl"])
def test_07_resume_never_writes_through_a_planted_link(tmp_path, trained_runs, link):
    run = trained_runs.copy("micro-2", tmp_path / "run")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    planted = run / link
    if planted.exists():
        keep = planted.read_bytes()
        planted.unlink()
        if link == "events.jsonl":
            victim.write_bytes(keep)  # the run's log, moved out: appending to it writes outside the run
    before = victim.read_bytes()
    planted.symlink_to(victim)
    res = cli("train", "--resume", str(run), "--max-steps", "4", "--ckpt-interval", "4")
    assert victim.read_bytes() == before, f"--resume wrote through {link} (exit {res.returncode})"
    if res.returncode != 0:
        one_line_refusal(res)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_08_a_reused_pid_in_writer_pid_is_not_a_live_run(tmp_path, tiny_dataset, runs):
    """A dead run's writer.pid names a pid now used by an unrelated process: runs and toggle
    ask the lock's holder, and nobody holds it."""
    (tmp_path / "root").mkdir()
    dead = killed(runs, tmp_path / "root", tiny_dataset)
    other = subprocess.Popen(["sleep", "120"])
    try:
        host, _pid, since = (dead / "writer.pid").read_text().split()
        (dead / "writer.pid").write_text(f"{host} {other.pid} {since}\n")
        listing = cli("runs", str(dead.parent))
        assert listing.returncode == 0, listing.stderr
        (row,) = [ln for ln in listing.stdout.splitlines() if ln.startswith(dead.name)]
        assert "running" not in row, row
        res = cli("toggle", str(dead), "--no-fused-adamw")
        one_line_refusal(res, "no live run")
        assert not (dead / MAILBOX).exists()
    finally:
        other.kill()
        other.wait()


@pytest.mark.timeout(180)
def test_09a_runs_and_compare_show_names_and_fields_printable(tmp_path, trained_runs):
    root = tmp_path / "root"
    root.mkdir()
    evil = "run\x1b]0;pwned\x07\x1b[2J"
    run = trained_runs.copy("micro-2", root / evil)
    lines = (run / "events.jsonl").read_text().splitlines()
    out = []
    for line in lines:
        e = json.loads(line)
        if e["event"] == "run_started":
            e["device_name"] = "cpu\x1b]0;owned\x07"
            e["config"]["preset"] = "micro\x1b[2J"
        if e["event"] == "segment":
            e["switches"] = {k: ("x\x1b[31m" if isinstance(v, str) else v) for k, v in e["switches"].items()}
        out.append(json.dumps(e))
    out.append(json.dumps({"event": "warning", "message": "disk \x1b]0;gone\x07 full", "time": time.time()}))
    (run / "events.jsonl").write_text("\n".join(out) + "\n")
    for argv in (["runs", str(root)], ["compare", str(run)]):
        res = cli(*argv)
        assert res.returncode == 0, res.stderr
        shown = res.stdout + res.stderr
        assert not any(c in shown for c in CONTROL), (argv[0], shown[-1500:])


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_09b_a_hand_written_toggle_request_reaches_the_console_printable(tmp_path, tiny_dataset, runs):
    r = runs(tmp_path / "run", tiny_dataset)
    r.wait_step(3)
    tmp = tmp_path / "req"
    hand_written = {"id": "byhand1", "time": time.time(), "kind": "toggle", "switches": {"\x1b]0;pwned\x07\x1b[2J": True}}
    tmp.write_text(json.dumps(hand_written) + "\n")
    os.replace(tmp, r.dir / MAILBOX)
    deadline = time.monotonic() + 20
    while (r.dir / MAILBOX).exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1)
    r.stop()
    out = r.output()
    assert "toggle" in out, out[-2000:]
    assert not any(c in out for c in CONTROL), [ln for ln in out.splitlines() if "toggle" in ln]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_09c_sample_on_a_terminal_writes_printable_text(tmp_path, tiny_dataset):
    """`sample` with stdout a tty: the model's text passes the printable rule (a pipe gets it raw)."""
    import pty

    data = tmp_path / "ds"
    data.mkdir()
    _control_tokenizer(data / "tokenizer.json")
    from harness import random_tokens, write_gpt2tui

    write_gpt2tui(data, random_tokens(20_000, 64, 1), random_tokens(4_000, 64, 2), 64, tokenizer="tokenizer.json")
    run = trained(tmp_path, data, steps=2)
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen([GPT2_TUI, "sample", str(run), "--max-new-tokens", "64", "--seed", "1"],
                                stdout=slave, stderr=subprocess.PIPE, cwd=ROOT, preexec_fn=_limit)  # fmt: skip
        os.close(slave)
        chunks = []
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        proc.wait(60)
    finally:
        os.close(master)
    text = b"".join(chunks).decode(errors="replace")
    assert proc.returncode == 0, text[-1000:]
    assert not any(c in text for c in CONTROL), repr(text[-300:])


def _control_tokenizer(path: Path) -> Path:
    """A word-level tokenizer of 64 tokens, every one an escape sequence: any sample holds them."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"\x1b]0;t{i}\x07\x1b[2J": i for i in range(63)}
    vocab["<|endoftext|>"] = 63
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(path))
    return path


# ================================================================ crashes and hangs


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_10_toggle_no_pad_vocab_on_an_odd_vocab_is_refused_or_carried(tmp_path, make_dataset, runs):
    data = make_dataset("gpt2-tui", vocab_size=100, name="v100")
    r = runs(tmp_path / "run", data)
    r.wait_step(3)
    res = cli("toggle", str(r.dir), "--no-pad-vocab", timeout=60)
    if res.returncode != 0:
        one_line_refusal(res, "vocab")
        assert r.alive_after(2)
    else:  # accepted: the hand-over carries the weights across the padding change
        at = r.step()
        assert r.alive_after(5), f"the run died after an accepted toggle:\n{r.output()[-2000:]}"
        assert r.step() > at
    assert r.stop() == 0, r.output()[-2000:]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("where", ["events", "config"])
def test_11_deep_nesting_in_one_run_does_not_break_runs_for_all(tmp_path, trained_runs, where):
    root = tmp_path / "root"
    root.mkdir()
    good = trained_runs.copy("micro-2", root / "good")
    bad = trained_runs.copy("micro-2", root / "bad")
    if where == "events":
        with open(bad / "events.jsonl", "a") as f:
            f.write(deep_json() + "\n")
    else:
        (bad / "config.toml").write_text("x = " + "[" * 100_000 + "\n")
    res = cli("runs", str(root))
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-1500:]
    names = [ln.split()[0] for ln in res.stdout.splitlines()[1:] if ln.strip()]
    assert good.name in names, res.stdout


@pytest.mark.timeout(120)
@pytest.mark.parametrize("plant", ["events-fifo", "events-devzero", "config-devzero"])
def test_12_runs_is_bounded_on_fifos_and_endless_files(tmp_path, trained_runs, plant):
    root = tmp_path / "root"
    root.mkdir()
    good = trained_runs.copy("micro-2", root / "good")
    bad = trained_runs.copy("micro-2", root / "bad")
    what, how = plant.split("-")
    target = bad / ("events.jsonl" if what == "events" else "config.toml")
    target.unlink()
    if how == "fifo":
        os.mkfifo(target)
    else:
        target.symlink_to("/dev/zero")
    res = cli("runs", str(root), timeout=30)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-1500:]
    assert good.name in res.stdout, res.stdout


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_13_eval_batches_that_do_not_fit_are_refused_before_the_run_dir(tmp_path, tiny_dataset):
    """nano with --eval-batches 1000000 holds ~65 GB of val batches: refused in one line, no run dir."""
    out = tmp_path / "run"
    res = cli("train", "--preset", "nano", "--device", "cpu", "--precision", "fp32", "--data", str(tiny_dataset),
              "--out", str(out), "--max-steps", "2", "--warmup-steps", "0", "--eval-batches", "1000000",
              timeout=120)  # fmt: skip
    one_line_refusal(res, "eval")
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_13b_a_new_run_that_fails_in_set_up_leaves_no_run_dir(tmp_path, tiny_dataset):
    """gpt2-xl past the memory check (--force) under the 6 GiB limit: the model's allocation
    fails in set-up, after the run directory was made. One line, exit 2, and the directory
    (config, tokenizer, checkpoints/, lock file) is gone: a refusal leaves the disk as it was."""
    out = tmp_path / "run"
    res = cli("train", "--preset", "gpt2-xl", "--device", "cpu", "--precision", "fp32", "--data", str(tiny_dataset),
              "--out", str(out), "--max-steps", "2", "--force", timeout=150)  # fmt: skip
    one_line_refusal(res, "out of memory")
    assert not out.exists(), sorted(p.name for p in out.iterdir())
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_14_toggle_on_a_full_disk_is_one_line(tmp_path, tiny_dataset, runs, tmpfs):
    mnt = tmpfs("1m")
    r = runs(mnt / "run", tiny_dataset)
    r.wait_step(3)
    fill(mnt)
    res = cli("toggle", str(r.dir), "--no-fused-adamw", timeout=60)
    one_line_refusal(res)
    assert "Traceback" not in res.stdout


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_15_train_bin_truncated_under_a_no_preload_run(tmp_path, make_dataset, runs):
    data = make_dataset("gpt2-tui", name="cut")
    r = runs(tmp_path / "run", data, "--no-preload", "--ckpt-interval", "5")
    r.wait_step(6)
    with open(data / "train.bin", "r+b") as f:
        f.truncate(1000)
    code = r.wait(60) if not r.alive_after(5) else r.stop()
    out = r.output()
    assert "Traceback" not in out and "mmap length" not in out, out[-3000:]
    assert code in (0, 2), (code, out[-2000:])
    if code == 2:
        last = [ln for ln in out.strip().splitlines() if ln.startswith("error:")]
        assert len(last) == 1 and "train.bin" in last[0], out[-2000:]
    assert saved_steps(r.dir), "the steps trained before the truncation were not saved"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_16_prepare_on_one_long_word_stops_on_ctrl_c(tmp_path):
    """1 MB of one letter: prepare either finishes quickly (the word is bounded) or Ctrl-C stops it."""
    src = tmp_path / "src"
    src.mkdir()
    for c in "abc":  # three: the train/val split holds one out, so a long word is always trained on
        (src / f"long_{c}.txt").write_text(c * 1_000_000)
    (src / "short.txt").write_text("some ordinary words here\n" * 100)
    proc = subprocess.Popen([GPT2_TUI, "prepare", str(src), "--out", str(tmp_path / "ds"), "--vocab-size", "300"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, preexec_fn=_limit)  # fmt: skip
    deadline = time.monotonic() + 60  # until the BPE training has begun (its temp dir is made just before)
    while proc.poll() is None and time.monotonic() < deadline:
        if [p for p in tmp_path.iterdir() if p.name.startswith(".ds.tmp-")]:
            break
        time.sleep(0.05)
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("prepare ignored Ctrl-C for 15 s (BPE training on one long word)")
    assert proc.returncode in (0, 130), (proc.returncode, err[-1500:])
    assert "Traceback" not in err


# ================================================================ wrong words


@pytest.mark.timeout(180)
@pytest.mark.parametrize("plant", ["fifo", "devzero"])
def test_17_resume_skips_what_is_not_a_regular_checkpoint(tmp_path, trained_runs, plant):
    run = trained_runs.copy("micro-30", tmp_path / "run")
    ck = run / "checkpoints"
    (ck / "latest").unlink()
    bogus = ck / "step_000040.pt"
    if plant == "fifo":
        os.mkfifo(bogus)
    else:
        bogus.symlink_to("/dev/zero")
    res = cli("train", "--resume", str(run), "--max-steps", "32", timeout=90)
    assert res.returncode == 0, res.stderr[-1500:]
    assert "from step 30" in res.stdout, res.stdout[-1500:]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_18_a_garbage_writer_pid_follows_the_one_liveness_rule(tmp_path, tiny_dataset, runs):
    """Dead run + garbage writer.pid: not "running". Live run + garbage writer.pid: toggle reaches it."""
    root = tmp_path / "root"
    root.mkdir()
    dead = killed(runs, root, tiny_dataset, "dead")
    (dead / "writer.pid").write_text("\x00garbage \xff\n", errors="surrogateescape")
    listing = cli("runs", str(root))
    assert listing.returncode == 0, listing.stderr
    (row,) = [ln for ln in listing.stdout.splitlines() if ln.startswith("dead")]
    assert "running" not in row, row
    live = runs(root / "live", tiny_dataset)
    live.wait_step(3)
    (live.dir / "writer.pid").write_text("garbage\n")
    res = cli("toggle", str(live.dir), "--no-fused-adamw")
    assert res.returncode == 0, res.stderr


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_19a_two_toggles_before_one_step_are_each_acknowledged(tmp_path, tiny_dataset, runs):
    r = runs(tmp_path / "run", tiny_dataset)
    r.wait_step(3)
    steer(r.dir, "pause")  # both requests land before the next step boundary
    deadline = time.monotonic() + 20
    while not any(e.get("event") == "paused" for e in r.events()) and time.monotonic() < deadline:
        time.sleep(0.05)
    first = cli("toggle", str(r.dir), "--no-fused-adamw", timeout=60)
    second = cli("toggle", str(r.dir), "--no-prefetch", timeout=60)
    asked = [res for res in (first, second) if res.returncode == 0]
    for res in (first, second):
        if res.returncode != 0:
            one_line_refusal(res)
    steer(r.dir, "resume")
    deadline = time.monotonic() + 40
    while len([q for q in requests(r.events()) if q.get("kind") == "toggle"]) < len(asked) and time.monotonic() < deadline:
        if r.proc.poll() is not None:
            break
        time.sleep(0.1)
    r.stop()
    acks = [q for q in requests(r.events()) if q.get("kind") == "toggle"]
    assert asked and len(acks) == len(asked), (len(asked), acks)
    assert all(q["status"] in ("applied", "dropped") and q.get("id") for q in acks), acks
    assert len({q["id"] for q in acks}) == len(acks)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_19b_a_toggle_left_by_a_dead_run_is_not_applied_by_a_later_resume(tmp_path, tiny_dataset, runs):
    r = runs(tmp_path / "run", tiny_dataset, "--ckpt-interval", "2")
    r.wait_step(4)
    steer(r.dir, "pause")  # paused: the request stays pending when the writer dies
    deadline = time.monotonic() + 20
    while not any(e.get("event") == "paused" for e in r.events()) and time.monotonic() < deadline:
        time.sleep(0.05)
    res = cli("toggle", str(r.dir), "--no-fused-adamw", timeout=60)
    assert res.returncode == 0, res.stderr
    r.kill()  # kill -9
    before = len(r.events())
    resumed = cli("train", "--resume", str(r.dir), "--max-steps", str(r.step() + 4), timeout=120)
    assert resumed.returncode == 0, resumed.stderr[-1500:]
    after = r.events()[before:]
    toggled = [e for e in after if e.get("event") == "segment" and e.get("reason") == "toggle"]
    assert not toggled, toggled
    stale = [q for q in requests(after) if q.get("kind") == "toggle" and q.get("status") == "dropped"]
    assert stale or any("toggle" in w for w in warnings(after)), "the stale request was discarded without a line"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_20_sigterm_during_prepare_leaves_no_hidden_temp_directory(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta", "iota", "kappa"]
    for i in range(4):
        (src / f"doc{i}.txt").write_text(" ".join(rng.choice(words, 400_000)))
    out = tmp_path / "ds"
    proc = subprocess.Popen([GPT2_TUI, "prepare", str(src), "--out", str(out), "--vocab-size", "2000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, preexec_fn=_limit)  # fmt: skip
    deadline = time.monotonic() + 60
    while not [p for p in tmp_path.iterdir() if p.name.startswith(".ds.tmp-")] and time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail("prepare ended before its temp directory was seen")
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    try:
        proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("prepare did not stop on SIGTERM")
    left = [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert not left, left


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_19c_a_toggle_saved_for_but_never_opened_is_reported_on_resume(tmp_path, tiny_dataset):
    """A kill -9 between a toggle's save and its new segment (simulated: the toggle's checkpoint
    names it, config.toml still has the old switches): the resume says it was dropped."""
    import torch

    run = trained(tmp_path, tiny_dataset, "run", 4, "--ckpt-interval", "2")
    latest = max((run / "checkpoints").glob("step_*.pt"))
    state = torch.load(latest, weights_only=True)
    state["pending_toggles"] = [{"id": "t0ggle1d", "switches": {"data.prefetch": False}}]
    torch.save(state, latest)
    before = len(read_events(run))
    res = cli("train", "--resume", str(run), "--max-steps", "6")
    assert res.returncode == 0, res.stdout[-1500:] + res.stderr[-1500:]
    after = read_events(run)[before:]
    lost = [q for q in requests(after) if q.get("id") == "t0ggle1d"]
    assert len(lost) == 1 and lost[0]["status"] == "dropped" and lost[0].get("reason"), lost
    assert any("t0ggle1d" in w for w in warnings(after)), warnings(after)
