"""Live toggles (issue 14) on the real engine, micro preset on CPU: a switch that does not
change the math leaves the loss curve as it was, the run goes on in the same directory from
the same step as a new segment, and a toggle refused (memory, tokens per step) changes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import device

from engine.train import memory
from engine.run import toggle
from engine import rundir
from engine.config import resolve
from engine.errors import UserError
from engine.run.preflight import open_data
from harness import QUIET, run_events, train

STEPS = 10


def _run(tmp_path: Path, data: Path, name: str, at: int | None = None, switch: dict | None = None, **overrides):
    """Train STEPS steps; with `switch`, ask for it (as any UI does: toggle.json) after step `at`."""
    run_dir = tmp_path / name

    def ask(e):
        if switch is not None and e.event == "step" and e.step == at:
            toggle.request(run_dir, switch)

    assert train(run_dir, data, on_event=ask, **(QUIET | {"train.max_steps": STEPS} | overrides)) == "completed"
    return run_events(run_dir)


def _losses(events) -> dict[int, float]:
    return {e.step: e.loss for e in events if e.event == "step"}


@pytest.mark.slow
@pytest.mark.parametrize("switch", [{"data.preload": False, "data.vectorized": False}, {"optim.fused": False}])
def test_a_toggle_that_keeps_the_math_keeps_the_curve(tmp_path, tiny_dataset, switch):
    plain = _losses(_run(tmp_path, tiny_dataset, "plain"))
    events = _run(tmp_path, tiny_dataset, "toggled", at=4, switch=switch)
    toggled = _losses(events)
    assert sorted(toggled) == list(range(1, STEPS + 1))  # every step once: it went on from step 4
    assert toggled == pytest.approx(plain, rel=1e-5, abs=1e-6)  # fused vs foreach AdamW: float tolerance
    segments = [e for e in events if e.event == "segment"]
    assert [(s.step, s.reason) for s in segments] == [(0, "start"), (4, "toggle")]
    assert set(segments[1].changed) == set(switch)
    assert [e.event for e in events].count("run_finished") == 1  # one run, two segments
    assert not (tmp_path / "toggled" / rundir.MAILBOX).exists()


@pytest.mark.slow
def test_a_toggle_refused_for_memory_changes_nothing(tmp_path, tiny_dataset, monkeypatch):
    small = {"train.batch_size": 2, "train.grad_accum": 2}
    bound, _ = open_data(resolve("micro", None, {"data.path": str(tiny_dataset)} | small))
    now = memory.estimate(bound).peak_bytes
    wide = bound.model_copy(update={"train": bound.train.model_copy(update={"batch_size": 4, "grad_accum": 1})})
    bigger = memory.estimate(wide).peak_bytes
    assert bigger > now
    monkeypatch.setattr(device, "budget", lambda kind, held=None: ((now + bigger) // 2, "RAM available"))
    plain = _losses(_run(tmp_path, tiny_dataset, "plain", **small))
    events = _run(tmp_path, tiny_dataset, "refused", at=4, switch={"train.batch_size": 4, "train.grad_accum": 1}, **small)
    assert _losses(events) == plain
    assert [e.step for e in events if e.event == "segment"] == [0]
    (warning,) = [e.message for e in events if e.event == "warning"]
    assert warning.startswith("toggle refused at step 4:") and "memory" in warning
    assert rundir.load_config(tmp_path / "refused").train.batch_size == 2


def test_a_toggle_must_keep_the_tokens_per_step_and_name_a_switch(tmp_path, tiny_dataset):
    config = resolve("micro", None, {"data.path": str(tiny_dataset)})
    with pytest.raises(UserError, match="keeps the tokens per optimizer step"):
        toggle.check(config, {"train.batch_size": 8})
    with pytest.raises(UserError, match="cannot change on a live run"):
        toggle.request(tmp_path, {"optim.lr": 1.0})
    assert not (tmp_path / rundir.MAILBOX).exists()


@pytest.mark.slow
def test_gpt2_tui_toggle_switches_a_detached_run(tmp_path, tiny_dataset):
    """The headless way: `gpt2-tui toggle RUN --no-prefetch` on a run training in another process."""
    import json
    import subprocess
    import sys
    import time

    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "engine.cli"]
    train = subprocess.Popen([*cmd, "train", "--preset", "micro", "--device", "cpu", "--data", str(tiny_dataset),
                              "--out", str(run), "--max-steps", "100000", "--eval-interval", "100000"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip

    def events() -> list[dict]:
        path = run / rundir.EVENTS
        return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []

    def wait(pred, what: str) -> list[dict]:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if pred(got := events()):
                return got
            time.sleep(0.2)
        raise AssertionError(f"no {what} within 120 s: {train.stderr.read() if train.poll() is not None else ''}")

    try:
        wait(lambda es: any(e["event"] == "step" for e in es), "first step")
        asked = subprocess.run([*cmd, "toggle", str(run), "--no-prefetch"], capture_output=True, text=True, timeout=60)
        assert asked.returncode == 0, asked.stderr
        assert "prefetch on -> off" in asked.stdout
        got = wait(lambda es: any(e["event"] == "segment" and e["reason"] == "toggle" for e in es), "toggle segment")
        seg = next(e for e in got if e["event"] == "segment" and e["reason"] == "toggle")
        assert seg["changed"] == {"data.prefetch": [True, False]}
        wait(lambda es: any(e["event"] == "step" and e["step"] > seg["step"] for e in es), "a step after the toggle")
        assert rundir.load_config(run).data.prefetch is False
    finally:
        train.terminate()
        train.wait(timeout=60)
    refused = subprocess.run([*cmd, "toggle", str(run), "--compile"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and refused.stderr.startswith("error: no live run writes")
    assert f"gpt2-tui train --resume {run} --compile" in refused.stderr
