"""The default ladder on a CPU teaches something (issue: nano's baseline took ~10 s a step at
B32, every other rung was skipped for the budget, nothing was printed for minutes): the batch
and steps are picked from a measured first step so every applicable rung runs within the
budget, the ladder says how it picked them, and prints each rung as it starts and lands."""

from __future__ import annotations

import json
import os
import time

import pytest

from bench import ladder as bench
from engine import device
from gpt2_tui import main


@pytest.mark.slow
@pytest.mark.skipif(os.getloadavg()[0] > 2 * (os.cpu_count() or 1), reason="a timed budget means nothing on a machine "
                    "this loaded: the rungs' own step times swing 5x")  # fmt: skip
def test_a_small_budget_measures_every_applicable_rung(tmp_path, tiny_dataset, capsys) -> None:
    out = tmp_path / "ladder"
    began = time.monotonic()
    # nano's preset batch (32) with 5 + 20 steps a rung outlasts this budget on a small CPU
    code = main(["bench", "--preset", "nano", "--data", str(tiny_dataset), "--device", "cpu", "--vocab-size", "64",
                 "--budget", "45", "--skip", "compile", "--out", str(out)])  # fmt: skip
    took = time.monotonic() - began
    printed = capsys.readouterr().out
    assert code == 0
    result = bench.LadderResult.model_validate_json((out / "ladder.json").read_text())
    not_run = {r.name: r.reason for r in result.rungs if r.status != "ran"}
    emulated = set() if device.cpu_native("bf16") else {"amp"}  # either side forced by --cpu-native
    assert set(not_run) == {"tf32", "compile", "pad_vocab"} | emulated, not_run  # said why: this device, --skip, the vocab
    assert all("no native bf16" in not_run[r] for r in emulated), not_run
    assert "CUDA" in not_run["tf32"] and "--skip" in not_run["compile"] and "multiple of 64" in not_run["pad_vocab"]
    assert took < 45 * 1.5, took  # the budget, give or take a rung's overshoot
    assert result.shape_note.startswith("a measured baseline step took") and result.batch_size < 32
    assert f"shape: {result.shape_note}" in printed
    lines = printed.splitlines()
    for r in result.rungs:  # each rung said as it started (when it ran) and as it landed
        if r.status == "ran":
            (i,) = [i for i, x in enumerate(lines) if x.startswith(f"  {r.label}: measuring {r.warmup} + {r.steps} steps")]
            assert lines[i + 1].startswith(f"  {r.label}: ") and "ms/step" in lines[i + 1]
    assert json.loads((out / "ladder.json").read_text())["shape_note"] == result.shape_note


def test_fit_shape_halves_the_batch_then_the_steps() -> None:
    start = bench.Shape(32, 5, 20)
    assert bench.fit_shape(start, 0.01, 0.5, 8, 480, fit_steps=True) == (start, True)  # fits as it is
    assert bench.fit_shape(start, 100.0, 0.5, 8, 480, fit_steps=False) == (bench.Shape(1, 5, 20), False)
    got, fits = bench.fit_shape(start, 100.0, 0.5, 8, 480, fit_steps=True)
    assert fits and got.steps == bench.MIN_STEPS and got.warmup == 1 and got.batch_size < 32
    assert 8 * (0.5 + 4 * 100.0 * got.batch_size / 32) <= bench.FIT_SHARE * 480
    assert bench.fit_shape(start, 1.0, 0.5, 8, 480, fit_steps=True)[0].batch_size == 32  # 1 s at B32
    assert bench.fit_shape(start, 1.0, 0.5, 8, 480, fit_steps=True, probe_batch=4)[0].batch_size == 4  # 1 s at B4
