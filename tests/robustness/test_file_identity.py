"""Files by identity, not by kind (issue 38): every file the product writes in place is its own
plain file (engine.files.not_own: regular, one link, this user's, writable by no one else),
a copy of a run by hard links is seen as one, the compile cache torch unpickles from is
private or not used, a library never reads an untrusted path past its cap, and no open
anywhere blocks on a FIFO.

Each test is a property over a class (every in-place writer x every kind of planted thing;
every name a run directory holds x every command that reads one), on real files and the
real CLI (tests/harness.py's warm runner, with a timeout: a hang is a failure, not a stall).
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from engine import files, rundir
from engine.errors import UserError
from tests.harness import (  # noqa: I001
    TRAIN_FAST, make_work, python_c, refusal_problems, run_cli, tree_diff, tree_state, write_tokenizer,
)  # fmt: skip

IS_ROOT = os.geteuid() == 0
# a file outside the run (a request line in it: a mailbox rewrite would keep it, and cut the rest)
OUTSIDE = b'{"id": "a1", "time": 1.0, "kind": "toggle", "switches": {"speed.compile": true}}\nnot to be touched\n'


@contextmanager
def no_hang(seconds: int = 10) -> Iterator[None]:
    """A blocking open (a FIFO) is interrupted and fails the test instead of hanging it."""

    def fire(*_: object) -> None:
        raise TimeoutError(f"blocked for {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# ---------------------------------------------------------------- every in-place writer x every plant


def _plant(kind: str, path: Path, outside: Path) -> None:
    outside.write_bytes(OUTSIDE)
    if kind == "hardlink":
        os.link(outside, path)
    elif kind == "symlink":
        path.symlink_to(outside)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "group-writable":
        path.write_bytes(b"")
        os.chmod(path, 0o664)
    elif kind == "other-owner":
        path.write_bytes(b"")
        os.chown(path, 12345, 12345)


def _append_log(path: Path) -> None:
    log = files.AppendLog(path)
    log.write(b"line\n")
    log.close()


def _open_append(path: Path) -> None:
    with files.open_append(path) as f:
        f.write(b"line\n")


def _jsonl_sink(path: Path) -> None:
    from engine import events as ev

    sink = ev.JsonlSink(path)
    sink.emit(ev.Eval(step=1, val_loss=2.0))
    sink.close()


def _csv_sink(path: Path) -> None:
    from engine import events as ev
    from engine.run.loggers import CsvSink

    assert path.name == rundir.METRICS_CSV
    sink = CsvSink(path.parent)
    sink.emit(ev.Eval(step=1, val_loss=2.0))
    sink.close()


def _mailbox_take(path: Path) -> None:
    """The outside file's toggle, deferred while paused, would be kept by rewriting the mailbox
    in place (cut to it): what a hard link would do to the file it names."""
    from engine.run import requests

    assert path.name == rundir.MAILBOX
    taken = requests.Mailbox(path.parent).take(defer=("toggle",))
    if any(r.kind == "mailbox" for r in taken):
        raise UserError("refused: " + "; ".join(r.problem or "" for r in taken))


def _mailbox_post(path: Path) -> None:
    from engine.run import requests

    requests.post(path.parent, requests.Request("pause"))


def _truncate(path: Path) -> None:
    files.truncate(path, 0)


WRITERS: dict[str, tuple[str, Callable[[Path], None]]] = {
    "AppendLog": ("events.jsonl", _append_log),
    "open_append": ("console.log", _open_append),
    "JsonlSink": ("events.jsonl", _jsonl_sink),
    "CsvSink": (rundir.METRICS_CSV, _csv_sink),
    "Mailbox.take": (rundir.MAILBOX, _mailbox_take),
    "post": (rundir.MAILBOX, _mailbox_post),
    "truncate": ("train.bin", _truncate),
}
PLANTS = ["hardlink", "symlink", "fifo", "group-writable", "other-owner"]


@pytest.mark.parametrize("plant", PLANTS)
@pytest.mark.parametrize("writer", list(WRITERS))
def test_every_in_place_writer_refuses_a_file_not_its_own(tmp_path: Path, writer: str, plant: str) -> None:
    """Planted at the name a writer writes in place: refused in one line (or, for the mailbox,
    one warning), never blocking, and the file outside the directory keeps every byte."""
    if plant == "other-owner" and not IS_ROOT:
        pytest.skip("chown to another user needs root")
    name, write = WRITERS[writer]
    d = tmp_path / "run"
    d.mkdir()
    outside = tmp_path / "outside"
    _plant(plant, d / name, outside)
    with no_hang():
        with pytest.raises((UserError, OSError)) as refused:
            write(d / name)
    assert "\n" not in str(refused.value), refused.value
    assert outside.read_bytes() == OUTSIDE, "written through to a file outside the run"


def test_the_rule_has_one_home(tmp_path: Path) -> None:
    """prepare's .partial check and the openers read the same rule (files.not_own)."""
    own = tmp_path / "own"
    own.write_bytes(b"")
    assert files.not_own(os.lstat(own)) is None and files.not_own_files(tmp_path) == []
    os.link(own, tmp_path / "other")
    assert files.not_own(os.lstat(own)).startswith("a hard link")
    assert files.not_own_files(tmp_path) == ["other (a hard link)", "own (a hard link)"]


# ---------------------------------------------------------------- a moved log swapped for what is not ours


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("plant", ["fifo", "symlink", "hardlink"])
def test_a_log_swapped_mid_run_saves_before_the_run_stops(tmp_path: Path, tiny_dataset: Path, plant: str) -> None:
    """events.jsonl moved away and something not the run's own put at its name: the run saves a
    checkpoint at the step it reached (no step lost) and stops in one line saying so."""
    from engine.train.checkpoint import CheckpointDir
    from tests.harness import QUIET, open_run

    run_dir = tmp_path / "run"
    swapped = []

    def swap(e) -> None:
        if e.event == "step" and e.step == 3 and not swapped:
            log = run_dir / rundir.EVENTS
            log.rename(tmp_path / "moved.jsonl")
            _plant(plant, log, tmp_path / "outside")
            swapped.append(e.step)

    run = open_run(run_dir, tiny_dataset, on_event=swap, **QUIET, **{"train.max_steps": 50})
    with no_hang(120), pytest.raises(UserError) as stopped:
        run.run()
    assert "checkpoint at step 3" in str(stopped.value) and "\n" not in str(stopped.value), stopped.value
    assert CheckpointDir(run_dir / rundir.CHECKPOINTS).latest_step() == 3
    assert (tmp_path / "outside").read_bytes() == OUTSIDE


# ---------------------------------------------------------------- a clone by hard links


@pytest.fixture(scope="module")
def good_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real 2-step micro run with --log csv (so metrics.csv is among its files), and a tokenizer."""
    w = make_work(tmp_path_factory.mktemp("good"))
    res = w.run(["train", *TRAIN_FAST, "--data", "ds", "--out", "good", "--log", "csv", "--ckpt-interval", "2"],
                timeout=180)  # fmt: skip
    assert res.rc == 0, res.summary()
    return w.dir / "good"


def _work(tmp_path: Path, good: Path) -> tuple[Path, Path]:
    cwd, cache = tmp_path / "work", tmp_path / "cache"
    cwd.mkdir()
    cache.mkdir()
    shutil.copytree(good.parent / "ds", cwd / "ds", symlinks=True)
    shutil.copytree(good, cwd / "good", symlinks=True)
    return cwd, cache


@pytest.mark.slow
def test_a_clone_by_hard_links_is_refused_and_a_real_copy_resumes(tmp_path: Path, good_run: Path) -> None:
    """`cp -al RUN CLONE; train --resume CLONE`: one line (exit 2) naming `cp -a`, nothing written
    to either; the original with a snapshot beside it is refused the same way; `cp -a` resumes."""
    cwd, cache = _work(tmp_path, good_run)
    subprocess.run(["cp", "-al", "good", "clone"], cwd=cwd, check=True)
    for target in ("clone", "good"):
        before = tree_state(cwd / "good", cwd / "clone")
        res = run_cli(["train", "--resume", target, "--max-steps", "3"], cwd, cache, timeout=120)
        assert refusal_problems(res, tree_diff(before, tree_state(cwd / "good", cwd / "clone"))) == [], res.summary()
        assert "cp -a" in res.err and "hard link" in res.err, res.err
    assert "copy of the run" in run_cli(["train", "--resume", "clone", "--max-steps", "3"], cwd, cache).err
    subprocess.run(["cp", "-a", "clone", "copy"], cwd=cwd, check=True)
    events = (cwd / "good" / rundir.EVENTS).read_bytes()
    res = run_cli(["train", "--resume", "copy", "--max-steps", "3"], cwd, cache, timeout=120)
    assert res.rc == 0, res.summary()
    assert (cwd / "good" / rundir.EVENTS).read_bytes() == events, "a real copy's resume wrote into the original"
    assert os.stat(cwd / "copy" / rundir.EVENTS).st_nlink == 1


# ---------------------------------------------------------------- the compile cache torch unpickles from


def _other_owner(d: Path) -> None:
    os.chown(d, 12345, 12345)


CACHE_PLANTS: dict[str, Callable[[Path], None]] = {
    "world-writable": lambda d: os.chmod(d, 0o777),
    "group-writable": lambda d: os.chmod(d, 0o770),
    "other-owner": _other_owner,
    "parent-world-writable": lambda d: os.chmod(d.parent, 0o777),
    "a-symlink": lambda d: (d.rename(d.with_name("real")), d.symlink_to(d.with_name("real"))),
}


@pytest.mark.parametrize("plant", list(CACHE_PLANTS))
def test_a_compile_cache_others_can_write_is_not_used(tmp_path: Path, monkeypatch, plant: str) -> None:
    """Whatever makes the cache directory not ours and private: one warning, and torch is
    pointed at a fresh private directory instead (the run compiles uncached)."""
    if plant == "other-owner" and not IS_ROOT:
        pytest.skip("chown to another user needs root")
    from engine.train import compile_cache

    monkeypatch.setattr(compile_cache, "_fallback", None, raising=False)
    monkeypatch.setenv(compile_cache.ENV, "unset")
    root = tmp_path / "root"
    hostile = compile_cache.default_dir(root)
    hostile.mkdir(parents=True)
    CACHE_PLANTS[plant](hostile)
    with pytest.warns(UserWarning, match="compile cache is not used") as caught:
        used = compile_cache.enable(root)
    assert len(caught) == 1
    assert used.resolve() != hostile.resolve() and Path(os.environ[compile_cache.ENV]) == used.resolve()
    st = os.lstat(used)
    assert st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o700


def test_our_cache_is_made_private_and_used(tmp_path: Path, monkeypatch) -> None:
    from engine.train import compile_cache

    monkeypatch.setenv(compile_cache.ENV, "unset")
    root = tmp_path / "root"
    made = compile_cache.default_dir(root)
    made.mkdir(parents=True, mode=0o755)  # what an older version made
    assert compile_cache.enable(root) == made and stat.S_IMODE(os.stat(made).st_mode) == 0o700
    assert compile_cache.enable(tmp_path / "fresh") == compile_cache.default_dir(tmp_path / "fresh")


# ---------------------------------------------------------------- library reads under the cap

RSS = """
import resource, sys
from pathlib import Path
{setup}
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    {call}
    print("LOADED")
except Exception as err:
    print("REFUSED", type(err).__name__, str(err).replace("\\n", " ")[:300])
print("GREW_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
"""


def _sparse(path: Path, size: int) -> Path:
    with open(path, "wb") as f:
        f.truncate(size)
    return path


@pytest.mark.slow
def test_a_sparse_giant_tokenizer_is_refused_before_it_is_read(tmp_path: Path) -> None:
    """tokenizer.json one byte over the cap, all holes: refused in one line at once; the process
    does not grow by the file's size (the library is given bytes, never the path)."""
    big = _sparse(tmp_path / "tokenizer.json", files.TOKENIZER_CAP + 1)
    res = python_c(RSS.format(setup="from engine.prep.tokenizer import load_tokenizer\nimport tokenizers",
                              call=f"load_tokenizer(Path({str(big)!r}))"))  # fmt: skip
    assert "REFUSED UserError" in res.stdout, res.stdout + res.stderr[-2000:]
    grew = int(res.stdout.split("GREW_KB")[1])
    assert grew < 64 * 1024, f"grew {grew} KiB reading a tokenizer it refused"
    small = tmp_path / "ok.json"
    write_tokenizer(small)
    from engine.prep.tokenizer import load_tokenizer

    assert load_tokenizer(small).get_vocab_size() == 64


def test_a_model_file_over_what_its_shape_needs_is_refused_unread(tmp_path: Path) -> None:
    from engine.config import ModelConfig
    from engine.prep import hf

    model = ModelConfig(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=64)
    _sparse(tmp_path / hf.WEIGHTS, hf.weights_cap(model) + 1)
    with pytest.raises(UserError, match="refused"):
        hf.load_state(tmp_path, model)


# ---------------------------------------------------------------- a FIFO at every name a run holds

FILE_NAMES = [n for n in rundir.WRITTEN if n not in (rundir.CHECKPOINTS, rundir.TENSORBOARD, rundir.WANDB)]
FIFO_NAMES = [*FILE_NAMES, rundir.CHECKPOINTS, rundir.TENSORBOARD, rundir.WANDB, "checkpoints/step_000002.pt"]
COMMANDS = {
    "resume": ["train", "--resume", "case", "--max-steps", "3"],
    "compare": ["compare", "case"],
    "compare-json": ["compare", "case", "--json"],
    "export": ["export", "case", "--hf", "exported"],
    "sample": ["sample", "case", "--max-new-tokens", "4", "--seed", "1"],
    "runs": ["runs", "."],
}


def _fifo_case(tmp_path: Path, good: Path, name: str) -> tuple[Path, Path]:
    cwd, cache = _work(tmp_path, good)
    (cwd / "good").rename(cwd / "case")
    target = cwd / "case" / name
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    elif os.path.lexists(target):
        target.unlink()
    os.mkfifo(target)
    return cwd, cache


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", FIFO_NAMES)
def test_a_fifo_at_any_name_never_hangs_a_command(tmp_path: Path, good_run: Path, name: str) -> None:
    """A FIFO planted at `name`: resume, compare, export, sample, runs each finish within their
    timeout, with one line (exit 2) or working (exit 0), never a traceback; attach's reading
    (the config, the events tail) returns at once."""
    cwd, cache = _fifo_case(tmp_path, good_run, name)
    bad = []
    for what, argv in COMMANDS.items():
        res = run_cli(argv, cwd, cache, timeout=90)
        if res.rc == "timeout":
            bad.append(f"{what}: hung")
        elif "Traceback" in res.err + res.out:
            bad.append(f"{what}: {res.summary()}")
        elif res.rc != 0 and refusal_problems(res):
            bad.append(f"{what}: {res.summary()}")
        shutil.rmtree(cwd / "exported", ignore_errors=True)
    with no_hang(20):
        from tui.session import attach

        try:
            session = attach(cwd / "case")
            session.tail.read_new()
        except UserError:
            pass  # one line before the screen opens
    assert not bad, f"a FIFO at {name}: " + "; ".join(bad)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_fifo_metrics_csv_at_resume_is_one_line_not_a_hang(tmp_path: Path, good_run: Path) -> None:
    """The fast loop's member of the class above: last round's case (a resume blocked on it past SIGTERM)."""
    cwd, cache = _fifo_case(tmp_path, good_run, rundir.METRICS_CSV)
    before = tree_state(cwd / "case")
    res = run_cli(COMMANDS["resume"], cwd, cache, timeout=90)
    assert refusal_problems(res, tree_diff(before, tree_state(cwd / "case"))) == [], res.summary()
