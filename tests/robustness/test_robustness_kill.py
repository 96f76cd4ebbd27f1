"""Real subprocesses of `gpt2-tui train`, stopped by signals and killed with SIGKILL."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.train import checkpoint as ckpt
from engine import rundir
from gpt2_tui import main
from engine.events import read_events

pytestmark = pytest.mark.slow  # see pyproject.toml's markers: not in the fast inner loop

ROOT = Path(__file__).resolve().parents[2]


def _start(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-u", "-m", "engine.cli", "train", *argv], cwd=ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def _wait_for(proc: subprocess.Popen, needle: str) -> None:
    for line in proc.stdout:
        if needle in line:
            return
    proc.wait(timeout=10)
    pytest.fail(f"the run ended (rc {proc.returncode}) before printing {needle!r}: {proc.stderr.read()[-2000:]}")


def _latest_step(run: Path) -> int:
    path = ckpt.CheckpointDir(run / rundir.CHECKPOINTS).latest()
    assert path is not None
    return ckpt.load(path)["step"]  # loadable, or this raises


# warmup 1: these runs are resumed with a small --max-steps, which a warmup must stay below
SLOW_NANO = ["--preset", "nano", "--device", "cpu", "--precision", "fp32", "--max-steps", "100000",
             "--batch-size", "16", "--grad-accum", "4", "--eval-batches", "4",
             "--warmup-steps", "1"]  # fmt: skip


def test_sigterm_stops_with_a_checkpoint_and_resumes(tmp_path, tiny_dataset, capsys):
    run = tmp_path / "run"
    proc = _start(["--preset", "micro", "--device", "cpu", "--data", str(tiny_dataset), "--out", str(run),
                   "--max-steps", "100000", "--ckpt-interval", "100000"])  # fmt: skip
    _wait_for(proc, "step      5/")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "SIGTERM: saving a checkpoint and stopping" in err
    stopped = int(out.split("run stopped at step ")[1].split(";")[0])
    assert _latest_step(run) == stopped >= 5
    events, problems = read_events(run / rundir.EVENTS)
    assert problems == [] and events[-1].event == "run_finished" and events[-1].reason == "stopped"
    assert main(["train", "--resume", str(run), "--max-steps", str(stopped + 2)]) == 0
    assert f"run completed at step {stopped + 2}" in capsys.readouterr().out


def test_second_ctrl_c_quits_at_once(tmp_path, tiny_dataset, capsys):
    """Slow steps (and a slow stop: eval + save) so the second SIGINT lands before the stop is done."""
    run = tmp_path / "run"
    proc = _start([*SLOW_NANO, "--data", str(tiny_dataset), "--out", str(run), "--ckpt-interval", "1"])
    _wait_for(proc, "checkpoint step 1")
    proc.send_signal(signal.SIGINT)
    for _ in range(50):  # the first handler has run (and re-armed SIGINT) once it has said so
        if "SIGINT: saving a checkpoint and stopping" in proc.stderr.readline():
            break
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted" in err, err
    assert "run stopped" not in out
    assert not list((run / rundir.CHECKPOINTS).glob(".*.tmp"))  # an interrupted write cleans up
    step = _latest_step(run)
    assert main(["train", "--resume", str(run), "--max-steps", str(step + 1), "--grad-accum", "1"]) == 0
    assert f"run completed at step {step + 1}" in capsys.readouterr().out


def test_kill_9_at_random_moments_then_resume(tmp_path, tiny_dataset, capsys):
    """Checkpoint every step of a model whose saves take a good share of the time; kill -9
    either the moment a checkpoint's temp file appears (mid-write) or at a random moment."""
    rng = random.Random(7)
    run = tmp_path / "run"
    ckdir = run / rundir.CHECKPOINTS
    argv = ["--preset", "nano", "--device", "cpu", "--precision", "fp32", "--data", str(tiny_dataset),
            "--out", str(run), "--max-steps", "100000", "--batch-size", "2", "--ckpt-interval", "1",
            "--eval-interval", "100000", "--eval-batches", "1", "--keep-last", "2", "--warmup-steps", "1"]  # fmt: skip
    kills, mid_write = 4, 0
    for round_ in range(kills):
        proc = _start(argv if round_ == 0 else ["--resume", str(run)])
        before = _latest_step(run) if round_ else 0
        _wait_for(proc, f"checkpoint step {before + 1}:")
        if round_ % 2 == 0:
            deadline = time.monotonic() + 20
            while not list(ckdir.glob(".step_*.tmp")) and time.monotonic() < deadline:
                time.sleep(0.0005)
        else:
            time.sleep(rng.uniform(0, 0.5))
        proc.kill()
        proc.communicate(timeout=30)
        mid_write += bool(list(ckdir.glob(".step_*.tmp")))  # a half-written temp file was left
        assert proc.returncode == -signal.SIGKILL
        assert _latest_step(run) > before  # a loadable latest checkpoint, newer than at the start
        events, problems = read_events(run / rundir.EVENTS)
        assert len(problems) <= round_ + 1  # at most a torn last line per kill, skipped
        starts = [e.start_step for e in events if e.event == "run_started"]
        assert starts[-1] == before  # each resume continued from the latest checkpoint
    assert mid_write >= 1, "no kill landed while a checkpoint was being written"
    step = _latest_step(run)
    assert main(["train", "--resume", str(run), "--max-steps", str(step + 2)]) == 0
    assert f"run completed at step {step + 2}" in capsys.readouterr().out
