"""The TUI's pure parts: form fields from pydantic, capabilities, RunState alerts, tailing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine import events as ev
from engine.config import preset_names, resolve
from engine.train.model import GPT
from engine import device as capabilities
from tui.models import form as fields
from tui.models.runstate import RunState
from tui.models.tail import EventTail
from tui.widgets.charts import thin


@pytest.mark.parametrize("name", preset_names())
def test_preset_param_count_matches_the_model(name: str) -> None:
    for bias in (True, False):
        cfg = resolve(name, overrides={"model.vocab_size": 1000, "model.bias": bias}).model
        with torch.device("meta"):
            n = GPT(cfg).num_params()
        assert cfg.n_params() == n  # the one closed form, used by the form, the estimator and the ladder


def test_fields_come_from_pydantic_and_errors_land_on_their_field() -> None:
    assert fields.setting("train.batch_size").bounds == ">= 1, <= 65536"
    assert fields.setting("speed.precision").choices == ("auto", "fp32", "tf32", "bf16", "fp16")
    assert fields.setting("optim.fused").kind == "tristate"
    assert "1.5-2.3x" in fields.setting("speed.compile").help  # the config's own description
    base = resolve("micro").model_dump(mode="json")
    config, errs, general = fields.validate(base, {"train.batch_size": "0", "optim.lr": "x"})
    assert config is None and general == []
    assert "greater than or equal to 1" in errs["train.batch_size"] and "valid number" in errs["optim.lr"]
    _, errs, _ = fields.validate(base, {"optim.lr": "1e-3", "optim.min_lr": "1e-2"})
    assert "above lr" in errs["optim.min_lr"]  # a model-level rule, blamed on its field
    _, errs, _ = fields.validate(base, {"train.block_size": "64"})
    assert "above the model's context" in errs["train.block_size"]
    config, errs, _ = fields.validate(base, {"train.block_size": "", "train.batch_size": "7"})
    assert errs == {} and config.train.block_size is None and config.train.batch_size == 7


def test_cpu_capabilities_disable_cuda_only_switches() -> None:
    caps = capabilities.Capabilities(cuda=False, mps=False, bf16=True, device="cpu", device_name="CPU", compile_reason=None)
    off = capabilities.disabled(caps)
    assert "optim.fused" not in off and "needs CUDA" in off["data.pin_memory"]  # fused AdamW runs on CPU too
    assert "accelerator" in off["data.prefetch"]  # on CPU the batch is built inline
    mps = capabilities.Capabilities(cuda=False, mps=True, bf16=True, device="mps", device_name="M2", compile_reason=None)
    assert set(capabilities.disabled(mps)) == {"data.pin_memory"}  # the prefetch thread runs beside the GPU
    assert "speed.compile" not in off
    assert "no CUDA" in capabilities.refuse({"speed.device": "cuda"}, caps)["speed.device"]
    gpu = capabilities.Capabilities(cuda=True, mps=False, bf16=False, device="cuda", device_name="T4", compile_reason="no triton")
    refused = capabilities.refuse({"speed.device": "auto", "speed.precision": "bf16", "speed.compile": True}, gpu)
    assert "no bf16" in refused["speed.precision"] and refused["speed.compile"] == "no triton"
    assert capabilities.disabled(gpu) == {"speed.compile": "no triton", "speed.compile_mode": "no triton",
                                          "speed.compile_scope": "no triton"}


def _started(clip: float = 1.0, max_steps: int = 100) -> ev.RunStarted:
    cfg = resolve("micro", overrides={"optim.grad_clip": clip, "train.max_steps": max_steps}).model_dump(mode="json")
    return ev.RunStarted(config=cfg, n_params=1, device="cpu", device_name="CPU", precision="fp32", flops_per_token=1, time=1000.0)


def _step(i: int, loss: float = 2.0, norm: float = 0.5, data: float = 0.0, t: float = 0.1) -> ev.Step:
    return ev.Step(step=i, loss=loss, lr=1e-3, grad_norm=norm, step_time_s=t, tokens_per_s=100.0, mfu=None,
                   mem_bytes=None, tokens=100 * i, data_time_s=data, time=1000.0 + i)  # fmt: skip


def alerts(s: RunState) -> list[str]:
    return [line.text for line in s.log if line.text.startswith("ALERT")]


def test_alerts_fire_once_per_episode() -> None:
    s = RunState()
    s.feed(_started())
    for i in range(1, 21):
        s.feed(_step(i))
    assert alerts(s) == []
    s.feed(_step(21, loss=float("nan")))
    s.feed(_step(22, loss=float("inf")))
    assert len(alerts(s)) == 1 and "NaN/Inf" in alerts(s)[0]
    assert len(s.series["loss"]) == 20  # non-finite points are not plotted
    s.feed(_step(23, loss=5.0))  # 2.5x the EMA
    assert "loss spike" in alerts(s)[-1]
    for i in range(24, 24 + 10):
        s.feed(_step(i, norm=3.0))
    assert "grad norm at the clip" in alerts(s)[-1]
    s.feed(_step(40, data=0.05, t=0.1))
    assert "data loading is 50%" in alerts(s)[-1]
    n = len(alerts(s))
    s.feed(_step(41, data=0.05, t=0.1))
    assert len(alerts(s)) == n  # still the same episode


def test_data_stall_alert_says_unpinned_data_time_includes_gpu_time() -> None:
    """Issue 20 (13): on CUDA with pinned memory off, .to(device) waits for the step before,
    so the data time holds GPU time: the alert says so instead of blaming the loader."""
    cfg = resolve("micro", overrides={"data.pin_memory": False}).model_dump(mode="json")
    s = RunState()
    s.feed(ev.RunStarted(config=cfg, n_params=1, device="cuda:0", device_name="H100", precision="bf16",
                         flops_per_token=1, time=1000.0))  # fmt: skip
    s.feed(_step(1, data=0.05, t=0.1))
    assert "data loading is 50%" in alerts(s)[-1] and "includes GPU time" in alerts(s)[-1]
    assert "--pin-memory" in alerts(s)[-1]


def test_eta_settled_speed_and_checkpoints(tmp_path: Path) -> None:
    s = RunState()
    s.feed(_started(max_steps=100))
    for i in range(1, 11):
        s.feed(_step(i, t=1.0 if i <= 2 else 0.2))  # compile warm-up, then settled
    assert s.settled_step_time() == pytest.approx(0.2)
    assert s.eta() == pytest.approx(90 * 0.2)
    p = tmp_path / "step_000010.pt"
    p.write_bytes(b"x")
    s.feed(ev.Checkpoint(step=5, path=str(tmp_path / "gone.pt"), val_loss=3.0, best=True))
    s.feed(ev.Checkpoint(step=10, path=str(p), val_loss=3.5, best=False))
    rows = [(r.step, r.best, latest) for r, latest in s.checkpoint_rows()]
    assert rows == [(10, False, True), (5, True, False)]  # best.pt outlives its step file
    s.feed(ev.RunFinished(step=10, reason="stopped"))
    assert s.state == "stopped" and s.eta() is None


def test_tail_reads_appends_and_skips_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    tail = EventTail(path)
    assert tail.read_new() == []  # not written yet
    a = ev.Eval(step=1, val_loss=2.0).model_dump_json()
    b = ev.Eval(step=2, val_loss=1.5).model_dump_json()
    path.write_text(a + "\n" + b[:10])  # the writer is mid-line
    got = tail.read_new()
    assert [e.step for e in got] == [1]
    with open(path, "a") as f:
        f.write(b[10:] + "\n" + "not json\n")
    got = tail.read_new()
    assert [e.step for e in got] == [2] and len(tail.problems) == 1


def test_thin_keeps_about_n_points_and_the_last() -> None:
    xs = list(range(1000))
    tx, ty = thin(xs, [float(x) for x in xs], 100)
    assert 90 <= len(tx) <= 101 and tx[-1] == 999 and ty[-1] == 999.0
    assert thin([1, 2], [3.0, 4.0], 10) == ([1, 2], [3.0, 4.0])
    assert all(y == float(x) for x, y in zip(tx, ty))  # each kept point is a real (x, y) pair


def test_elapsed_leaves_out_the_time_a_run_was_stopped_and_paused() -> None:
    """A run stopped at 1010 s and resumed at 5000 s trained 10 + 10 s, not 4010 s."""
    s = RunState()
    s.feed(_started())  # time 1000
    s.feed(_step(10))  # time 1010
    s.feed(ev.RunFinished(step=10, reason="stopped", time=1010.0))
    assert s.elapsed(now=3000.0) == pytest.approx(10.0)
    s.feed(_started().model_copy(update={"time": 5000.0}))  # resumed, much later
    assert s.elapsed(now=5004.0) == pytest.approx(14.0)
    s.feed(ev.Paused(step=10, time=5005.0))
    s.feed(ev.Resumed(step=10, time=5105.0))
    s.feed(ev.RunFinished(step=20, reason="completed", time=5110.0))
    assert s.elapsed(now=9999.0) == pytest.approx(10.0 + 5.0 + 5.0)


@pytest.mark.slow
def test_a_launched_process_building_the_dataset_shows_each_phase(tmp_path: Path) -> None:
    """F5's run is a child process: its console says each phase of the default dataset's build
    as it starts, and the dashboard's status says it too (not only that something is built)."""
    import subprocess
    import sys

    from tui.screens.dashboard import state_label
    from tui.session import BUILD_LINE, CONSOLE_LOG, RunSession

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        session = RunSession(run_dir=run_dir, mode="detached", process=child, tail=EventTail(run_dir / "events.jsonl"))
        said = []
        for line in (f"{BUILD_LINE} in /cache/stdlib (once)...", "training a 8192-token BPE on 571 documents...",
                     "training a 8192-token BPE on 571 documents: done in 3.1 s", "encoding..."):  # fmt: skip
            with open(run_dir / CONSOLE_LOG, "a") as f:
                f.write(line + "\n")
            for e in session.poll():
                session.state.feed(e)
            said.append(state_label(session.state))
        assert all(s.startswith("BUILDING DATASET") for s in said), said
        assert "training a 8192-token BPE on 571 documents)" in said[1] and said[3].endswith(": encoding)"), said
    finally:
        child.kill()
        child.wait()


def test_every_form_label_fits_its_column_and_muons_momentum_is_in_the_form() -> None:
    """Issue 47 minor: the Recipe row `muon momentum warmup` was cut to read `muon momentum 0` (the
    warm-up in steps read as the momentum), and Muon's momentum itself was not in the form."""
    import re

    from engine.settings import all_settings

    css = (Path(__file__).resolve().parents[2] / "tui" / "app.tcss").read_text()
    width, pad = map(int, re.search(r"\.row \.name \{ width: (\d+); padding: 0 (\d+) 0 0;", css).groups())
    cut = [s.label for s in all_settings() if s.form and len(s.label) > width - pad]
    assert not cut, cut
    assert "optim.muon_momentum" in fields.ALL_FIELDS and "optim.muon_momentum_warmup" in fields.ALL_FIELDS
