"""A run directory has one writer (issue 12 item 4): an OS lock held for the run's life.

The holder is a real second process (it takes the lock through engine.rundir and sleeps);
the refused command is the real CLI, in-process, on real files.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import tree_snapshot
from gpt2_tui import main

MICRO = ["--preset", "micro", "--device", "cpu", "--precision", "fp32", "--eval-batches", "1"]
ROOT = Path(__file__).resolve().parents[2]

HOLD = """
import sys, time
from pathlib import Path
from engine import rundir
path = Path(sys.argv[1])
{take}
print("held", flush=True)
time.sleep(120)
"""


def _holder(path: Path, take: str = "rundir.claim_writer(path)", **env: str) -> subprocess.Popen[str]:
    """A second process that holds `path`'s writer lock until killed."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD.format(take=take), str(path)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=os.environ | env)  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != "held":
        proc.kill()
        pytest.fail(f"the holder did not start: {line!r} {proc.stderr.read() if proc.stderr else ''}")
    return proc


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait(10)


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.fixture
def run(tmp_path: Path, tiny_dataset: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    run = tmp_path / "run"
    assert main(["train", *MICRO, "--data", str(tiny_dataset), "--out", str(run), "--max-steps", "2"]) == 0
    capsys.readouterr()
    return run


@pytest.mark.slow
def test_a_second_resume_is_refused_naming_the_holder(run: Path, capsys) -> None:
    holder = _holder(run)
    try:
        before = tree_snapshot(run)
        err = _refused(capsys, ["train", "--resume", str(run), "--max-steps", "4"])
        assert f"pid {holder.pid}" in err and socket.gethostname() in err and "since" in err, err
        assert tree_snapshot(run) == before  # nothing written, not even events
    finally:
        _stop(holder)
    assert main(["train", "--resume", str(run), "--max-steps", "4"]) == 0  # the kernel dropped the lock
    assert "run completed at step 4" in capsys.readouterr().out


@pytest.mark.slow
def test_a_holder_without_a_record_yet_is_still_named(run: Path, capsys) -> None:
    """Between taking the lock and writing writer.pid (a resume in set-up): the kernel's lock table names it."""
    holder = _holder(run, take="rundir.lock(path)")
    try:
        err = _refused(capsys, ["train", "--resume", str(run), "--max-steps", "4"])
        assert f"pid {holder.pid}" in err, err
    finally:
        _stop(holder)


@pytest.mark.slow
def test_a_new_run_on_a_directory_being_written_is_refused(tmp_path: Path, tiny_dataset: Path, capsys) -> None:
    out = tmp_path / "racing"
    out.mkdir()
    holder = _holder(out)  # another run claimed the (still empty) directory first
    try:
        err = _refused(capsys, ["train", *MICRO, "--data", str(tiny_dataset), "--out", str(out), "--max-steps", "2"])
        assert f"pid {holder.pid}" in err, err
        assert sorted(p.name for p in out.iterdir()) == ["writer.lock", "writer.pid"]
    finally:
        _stop(holder)


RACE = """
import sys, time
from pathlib import Path
from engine import rundir
from engine.config import RunConfig
from engine.errors import UserError
path, go = Path(sys.argv[1]), float(sys.argv[2])
time.sleep(max(0.0, go - time.time()))
try:
    rundir.create(path, RunConfig(), None)
    print("won", flush=True)
    time.sleep(3)  # a real run holds it while it trains
except UserError as err:
    print("refused:", err, flush=True)
"""


@pytest.mark.slow
def test_of_runs_racing_on_one_new_out_exactly_one_gets_it(tmp_path: Path) -> None:
    for attempt in range(3):
        out = tmp_path / f"race{attempt}" / "run"
        go = time.time() + 4  # all start at once, after their imports
        procs = [subprocess.Popen([sys.executable, "-c", RACE, str(out), str(go)], cwd=ROOT,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(6)]  # fmt: skip
        results = [p.communicate(timeout=60) for p in procs]
        outs = [o.strip() for o, _ in results]
        assert all(not e.strip() for _, e in results), [e for _, e in results]
        assert sum(o == "won" for o in outs) == 1, outs
        assert all(o == "won" or o.startswith("refused:") for o in outs), outs


@pytest.mark.slow
def test_claim_is_idempotent_and_release_removes_the_record(tmp_path: Path) -> None:
    from engine import rundir

    d = tmp_path / "r"
    d.mkdir()
    rundir.claim_writer(d)
    rundir.claim_writer(d)  # the Trainer claims again what start() took: no refusal
    host, pid, since = (d / rundir.WRITER).read_text().split()
    assert (host, int(pid)) == (socket.gethostname(), os.getpid()) and since[:2] == "20"
    assert rundir.writer_alive(d) is True and rundir.writer_of(d) == (host, os.getpid())
    rundir.release_writer(d)
    assert not (d / rundir.WRITER).exists()
    assert rundir.writer_alive(d) is False  # nobody holds the lock: the one liveness rule (issue 21)
    holder = _holder(d)  # released: another process may take it now
    _stop(holder)


@pytest.mark.slow
def test_the_launchers_ranks_do_not_refuse_each_other(tmp_path: Path) -> None:
    """Under --nproc the launcher holds the lock and its descendants (the ranks) are let in;
    who holds it comes from the lock, so no other process gets in by its environment (the old
    GPT2_TUI_RUN_LOCKED variable let any process that set it write the run)."""
    from engine import rundir
    from engine.errors import UserError

    d = tmp_path / "r"
    d.mkdir()
    holder = _holder(d)  # another process holds the run: a sibling of ours is no rank of it
    try:
        with pytest.raises(subprocess.CalledProcessError) as err:
            subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; from engine import rundir; "
                            "rundir.lock(Path(sys.argv[1]))", str(d)], cwd=ROOT, check=True, capture_output=True,
                           text=True, env=os.environ | {"GPT2_TUI_RUN_LOCKED": str(d.resolve())})  # fmt: skip
        assert "is being written by" in err.value.stderr and UserError.__name__ in err.value.stderr
    finally:
        _stop(holder)
    rundir.claim_writer(d)  # now this process is the launcher: its child is a rank, let in
    try:
        rank = _holder(d, take="rundir.claim_writer(path); rundir.lock(path)")
        _stop(rank)
    finally:
        rundir.release_writer(d)
