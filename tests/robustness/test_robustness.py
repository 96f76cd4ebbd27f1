"""Runs survive what goes wrong, in-process on the real engine (micro preset, CPU):
NaN/Inf steps, checkpoint writes that fail, torn event lines, hostile files."""

from __future__ import annotations

import contextlib
import errno
import math
import os
import pickle
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch

from engine.train import checkpoint as ckpt
from engine.train import distributed, guard
from engine import rundir
from gpt2_tui import main
from engine.events import CallbackSink, read_events
from engine.train.model import GPT
from harness import MICRO, cli_fails, force_cpu_native, open_run, run_events


def _warnings(events) -> list[str]:
    return [e.message for e in events if e.event == "warning"]


_one_line_exit_2 = cli_fails


@pytest.fixture
def poison_loss(monkeypatch):
    """Make the training loss NaN on the given 1-based training forward calls (= steps at accum 1)."""
    original = GPT.forward
    bad: set[int] = set()
    calls = [0]

    def forward(self, idx, targets=None, **kw):
        logits, loss = original(self, idx, targets, **kw)
        if self.training and loss is not None:
            calls[0] += 1
            if calls[0] in bad:
                loss = loss * float("nan")
        return logits, loss

    monkeypatch.setattr(GPT, "forward", forward)
    return bad


# ------------------------------------------------------------------------------ NaN / Inf


@pytest.mark.slow
def test_a_few_nan_steps_are_skipped_and_the_run_goes_on(tmp_path, tiny_dataset, poison_loss):
    poison_loss.update({3, 4})
    seen = {}
    snap = lambda e: e.event == "step" and e.step in (2, 4) and seen.update(
        {e.step: [p.detach().clone() for p in t.segment.parts.model.parameters()]})
    t = open_run(tmp_path / "run", tiny_dataset, sinks=[CallbackSink(snap)],
                 **{"train.max_steps": 8, "train.max_bad_steps": 3})
    assert t.run() == "completed"
    assert all(torch.equal(a, b) for a, b in zip(seen[2], seen[4]))  # steps 3-4 never reached the weights
    events = run_events(t.run_dir)  # NaN losses are written so that they read back
    nan_steps = [e.step for e in events if e.event == "step" and e.loss != e.loss]
    assert nan_steps == [3, 4]
    assert [w.split(":")[0] for w in _warnings(events)] == ["step 3", "step 4"]
    assert events[-1].event == "run_finished" and events[-1].step == 8
    assert distributed.weights_finite(t.segment.parts.model)


@pytest.mark.slow
def test_nan_for_max_bad_steps_stops_with_the_last_good_weights(tmp_path, tiny_dataset, poison_loss):
    common = {"train.ckpt_interval": 100, "train.eval_interval": 100, "optim.decay_steps": 50}  # one LR schedule for both
    good = open_run(tmp_path / "good", tiny_dataset, **common, **{"train.max_steps": 3})
    good.run()
    poison_loss.update(range(4 + 3, 100))  # the good run above made 3 training calls
    t = open_run(tmp_path / "bad", tiny_dataset, **common, **{"train.max_steps": 50, "train.max_bad_steps": 3})
    with pytest.raises(guard.Diverged, match="3 steps in a row") as err:
        t.run()
    msg = str(err.value)
    assert "\n" not in msg and "LR too high" in msg and "fp16 overflow" in msg and "bad data" in msg
    assert "step_000006.pt" in msg
    saved = ckpt.load(t.segment.ckpts.latest())
    assert saved["step"] == 6  # steps 4-6 were skipped: the weights are those after step 3
    expected = good.segment.parts.model.state_dict()
    assert all(torch.equal(saved["model"][k], expected[k]) for k in expected)
    events = run_events(t.run_dir)
    assert any("likely causes" in w for w in _warnings(events)) and events[-1].event == "run_failed"


@pytest.mark.slow
def test_nan_weights_are_never_saved_as_latest_or_best(tmp_path, tiny_dataset):
    def poison(e):
        if e.event == "step" and e.step == 3:
            with torch.no_grad():
                next(t.segment.parts.model.parameters()).fill_(float("nan"))

    t = open_run(tmp_path / "run", tiny_dataset, sinks=[CallbackSink(poison)],
                 **{"train.max_steps": 20, "train.ckpt_interval": 1, "train.eval_interval": 1})  # fmt: skip
    with pytest.raises(guard.Diverged, match="NaN/Inf"):
        t.run()
    assert [s for s, _ in t.segment.ckpts.step_files()][-1] == 2
    for name in ("best.pt", "step_000002.pt"):
        state = ckpt.load(t.segment.ckpts.path / name)
        assert all(torch.isfinite(v).all() for v in state["model"].values())
    assert t.segment.ckpts.latest().name == "step_000002.pt"


@pytest.mark.slow
def test_fp16_overflow_is_the_scalers_to_skip_not_a_bad_step(tmp_path, tiny_dataset, monkeypatch):
    """Inf gradients (a finite loss) under fp16: the GradScaler skips those steps and lowers its
    scale, as designed; the guard neither warns nor stops, though max_bad_steps is 1."""
    original = GPT.forward
    calls = [0]

    def blow_up(grad):  # the forward of steps 2 and 3 is fine; their gradients overflow
        return grad * float("inf") if calls[0] in (2, 3) else grad

    def counting_forward(self, idx, targets=None, **kw):
        logits, loss = original(self, idx, targets, **kw)
        if self.training:
            calls[0] += 1
        return logits, loss

    monkeypatch.setattr(GPT, "forward", counting_forward)
    force_cpu_native(monkeypatch, "fp16")  # the scaler's behaviour, not the emulated-fp16 warning of most CPUs
    t = open_run(tmp_path / "run", tiny_dataset, **{"train.max_steps": 5, "train.max_bad_steps": 1,
                                                    "speed.precision": "fp16", "optim.grad_clip": 0.0})  # fmt: skip
    original_setup = t.segment.setup

    def setup():
        original_setup()
        next(t.segment.parts.model.parameters()).register_hook(blow_up)

    t.segment.setup = setup
    assert t.run() == "completed"
    events = run_events(t.run_dir)
    assert _warnings(events) == [] and t.segment.parts.guard.total == 0
    norms = {e.step: e.grad_norm for e in events if e.event == "step"}
    assert not math.isfinite(norms[2]) and not math.isfinite(norms[3]) and math.isfinite(norms[4])
    assert t.segment.parts.scaler.get_scale() == 65536.0 / 4  # halved once per skipped step


@pytest.mark.slow
def test_cli_reports_divergence_in_one_line(tmp_path, tiny_dataset, capsys, poison_loss):
    poison_loss.update(range(1, 100))
    run = tmp_path / "run"
    _one_line_exit_2(capsys, ["train", *MICRO, "--data", str(tiny_dataset), "--out", str(run),
                              "--max-bad-steps", "2"], "NaN/Inf for 2 steps", "likely causes")  # fmt: skip
    assert ckpt.load(run / "checkpoints" / "step_000002.pt")["step"] == 2


# ------------------------------------------------------------------- failed checkpoint writes


@pytest.mark.slow
def test_full_disk_warns_keeps_the_old_checkpoints_and_retries(tmp_path, tiny_dataset, monkeypatch):
    """ENOSPC while writing step 4's checkpoint (injected at torch.save: a planted link to
    /dev/full is now refused by the run, issue 21; the real full disk is test_a_really_full_filesystem)."""
    real_save = torch.save

    def full_at_step_4(obj, f, *a, **k):
        if isinstance(obj, dict) and obj.get("step") == 4:
            real_save(obj, f, *a, **k)  # some bytes reach the temp file, then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, f, *a, **k)

    monkeypatch.setattr(torch, "save", full_at_step_4)
    t = open_run(tmp_path / "run", tiny_dataset, **{"train.max_steps": 6, "train.ckpt_interval": 2})
    assert t.run() == "completed"
    events = run_events(t.run_dir)
    assert [e.step for e in events if e.event == "checkpoint"] == [2, 6]
    (warning,) = _warnings(events)
    assert "step 4 could not be written (No space left on device" in warning and "retries" in warning
    assert sorted(p.name for p in t.segment.ckpts.path.iterdir()) == ["best.pt", "latest", "step_000002.pt", "step_000006.pt"]
    assert ckpt.load(t.segment.ckpts.latest())["step"] == 6


@contextlib.contextmanager
def _read_only(path: Path):
    """A directory even root cannot write: a read-only bind mount as root, chmod otherwise."""
    if os.geteuid() != 0:
        path.chmod(0o555)
        try:
            yield
        finally:
            path.chmod(0o755)
        return
    ok = subprocess.run(["mount", "--bind", str(path), str(path)], capture_output=True).returncode == 0
    if ok and subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], capture_output=True).returncode != 0:
        subprocess.run(["umount", str(path)], check=True)
        ok = False
    if not ok:
        pytest.skip("running as root without mount: cannot make a directory read-only")
    try:
        yield
    finally:
        subprocess.run(["umount", str(path)], check=True)


@pytest.mark.slow
def test_read_only_checkpoint_dir_stops_when_asked_and_keeps_the_old_ones(trained_run, capsys, file_tree):
    ckdir = trained_run / "checkpoints"
    before = file_tree(ckdir)
    with _read_only(ckdir):
        err = _one_line_exit_2(capsys, ["train", "--resume", str(trained_run), "--max-steps", "6",
                                        "--on-save-error", "stop"], "step 4 could not be written")  # fmt: skip
        assert "Read-only file system" in err or "Permission denied" in err
        assert file_tree(ckdir) == before
        # default: continue past a failed periodic save; the final one failing is an error (issue 12 item 5)
        assert main(["train", "--resume", str(trained_run), "--max-steps", "6", "--on-save-error", "continue"]) == 2
        captured = capsys.readouterr()
        assert "retries at the next checkpoint interval" in captured.out  # the save at step 4
        assert "step 6 could not be written" in captured.err and len(captured.err.strip().splitlines()) == 1
        assert file_tree(ckdir) == before
    assert main(["train", "--resume", str(trained_run), "--max-steps", "6"]) == 0  # writable again: resumes
    assert ckpt.load(ckpt.CheckpointDir(ckdir).latest())["step"] == 6


@pytest.fixture
def trained_run(capsys, tiny_dataset) -> Path:
    """A run with checkpoints at steps 1 and 2, in a temp dir a bind mount may cover."""
    with tempfile.TemporaryDirectory() as d:
        run = Path(d) / "run"
        assert main(["train", *MICRO, "--data", str(tiny_dataset), "--out", str(run), "--max-steps", "2",
                     "--ckpt-interval", "2"]) == 0  # fmt: skip
        capsys.readouterr()
        yield run


def test_failed_write_leaves_no_temp_file(tmp_path):
    target = tmp_path / "x.pt"

    class Boom:
        def __reduce__(self):
            raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        ckpt.atomic_save({"a": Boom()}, target)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------ events.jsonl


@pytest.mark.slow
def test_torn_last_line_is_skipped_and_resume_writes_whole_lines(tmp_path, tiny_dataset, capsys):
    run = tmp_path / "run"
    assert main(["train", *MICRO, "--data", str(tiny_dataset), "--out", str(run), "--max-steps", "2"]) == 0
    events_file = run / rundir.EVENTS
    with open(events_file, "a") as f:
        f.write('{"event": "step", "step": 3, "lo')  # what a kill -9 mid-write leaves
    events, problems = read_events(events_file)
    assert len(problems) == 1 and "skipped an unreadable line" in problems[0]
    assert main(["train", "--resume", str(run), "--max-steps", "3"]) == 0
    events, problems = read_events(events_file)
    assert len(problems) == 1  # only the torn line; the resumed run's first event is whole
    starts = [e for e in events if e.event == "run_started"]
    assert [s.start_step for s in starts] == [0, 2] and events[-1].event == "run_finished"


@pytest.mark.slow
def test_resume_before_the_first_checkpoint_starts_over(tmp_path, tiny_dataset, capsys):
    run = tmp_path / "run"
    assert main(["train", *MICRO, "--data", str(tiny_dataset), "--out", str(run), "--max-steps", "2"]) == 0
    for p in (run / "checkpoints").iterdir():  # as if killed before its first checkpoint
        p.unlink()
    assert main(["train", "--resume", str(run), "--max-steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "starting it again from step 0" in out and "run completed at step 2" in out


def test_latest_pointer_only_names_step_files(tmp_path):
    d = ckpt.CheckpointDir(tmp_path)
    (tmp_path / "step_000002.pt").write_bytes(b"x")
    (tmp_path / "latest").write_text("../../etc/passwd\n")
    assert d.latest() == tmp_path / "step_000002.pt"


# ------------------------------------------------------------------------------ hostile files


class _Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.mark.slow
@pytest.mark.parametrize("how", ["pickle", "torch.save"])
def test_malicious_checkpoint_is_refused_and_never_executed(tmp_path, tiny_dataset, capsys, file_tree, how):
    run = tmp_path / "run"
    assert main(["train", *MICRO, "--data", str(tiny_dataset), "--out", str(run), "--max-steps", "2"]) == 0
    marker = tmp_path / "pwned"
    evil = run / "checkpoints" / "step_000009.pt"
    state = {"model": _Payload(marker), "optimizer": {}, "step": 9, "config": {}}
    if how == "pickle":
        evil.write_bytes(pickle.dumps(state))
    else:
        torch.save(state, evil)
    (run / "checkpoints" / "latest").write_text("step_000009.pt\n")
    before = file_tree(tmp_path)
    _one_line_exit_2(capsys, ["train", "--resume", str(run)], "not a gpt2-tui checkpoint", "safe loader")
    _one_line_exit_2(capsys, ["sample", str(run)], "not a gpt2-tui checkpoint")
    assert not marker.exists()
    assert file_tree(tmp_path) == before


@pytest.mark.slow
def test_broken_tokenizer_json_in_a_run(tmp_path, make_dataset, capsys):
    data = make_dataset("gpt2-tui", tokenizer="tok.json")  # inside the dataset, as prepare writes it
    (data / "tok.json").write_text("{}")  # replaced below; the dataset must name an existing tokenizer
    run = tmp_path / "run"
    assert main(["train", *MICRO, "--data", str(data), "--out", str(run), "--max-steps", "1"]) == 0
    (run / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": ')
    _one_line_exit_2(capsys, ["sample", str(run)], "tokenizer", "cannot be read")


@pytest.mark.slow
@pytest.mark.parametrize(
    "text, words",
    [
        ("[train]\nbatch_sise = 4\n", ["train.batch_sise", "Extra inputs"]),
        ('[optim]\nlr = "fast"\n', ["optim.lr"]),
        ("[model\nn_layer = 2\n", ["not valid TOML"]),
        ("[train]\non_save_error = \"ignore\"\n", ["train.on_save_error"]),
    ],
)
def test_hostile_config_toml_for_a_new_run_and_a_resume(tmp_path, tiny_dataset, capsys, file_tree, text, words):
    bad = tmp_path / "run.toml"
    bad.write_text(text)
    _one_line_exit_2(capsys, ["train", "--config", str(bad), "--data", str(tiny_dataset),
                              "--out", str(tmp_path / "new")], *words)  # fmt: skip
    assert not (tmp_path / "new").exists()
    run = tmp_path / "run"
    assert main(["train", *MICRO, "--data", str(tiny_dataset), "--out", str(run), "--max-steps", "1"]) == 0
    (run / "config.toml").write_text(text)
    before = file_tree(run)
    _one_line_exit_2(capsys, ["train", "--resume", str(run)], *words)
    assert file_tree(run) == before


def test_token_file_with_a_bad_header_through_the_cli(tmp_path, make_dataset, writers, capsys):
    import numpy as np

    data = make_dataset("llmc", train=[np.arange(2000) % 64], val=[np.arange(500) % 64])
    writers.llmc_shard(data / "data_train_000001.bin", np.arange(2000) % 64, magic=20240521)
    _one_line_exit_2(capsys, ["train", *MICRO, "--data", str(data), "--vocab-size", "64",
                              "--out", str(tmp_path / "run")], "magic 20240521")  # fmt: skip
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------------ out of memory


@pytest.mark.slow
def test_cuda_oom_in_a_step_stops_cleanly_with_the_breakdown_and_a_batch_that_fits(tmp_path, tiny_dataset, monkeypatch):
    """The OOM itself is raised by a patched train_step (no GPU here); the rest is the real run:
    the estimator's table, the estimator's own fit for a device that holds batch 2, no new checkpoint."""
    from engine import device
    from engine.train import memory
    from engine.text import format_table
    from engine.train.trainer import Trainer as T

    original = T.train_step

    def train_step(self, lr):
        if self.step == 3:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return original(self, lr)

    monkeypatch.setattr(T, "train_step", train_step)
    seen = []
    t = open_run(tmp_path / "run", tiny_dataset, sinks=[CallbackSink(seen.append)],
                 **{"train.max_steps": 8, "train.ckpt_interval": 2, "train.batch_size": 8})  # fmt: skip
    holds_batch_2 = memory.estimate(memory.with_batch(t.config, 2, 4)).peak_bytes
    monkeypatch.setattr(device, "memory_bytes", lambda name="auto": holds_batch_2)
    with pytest.raises(guard.OutOfMemory) as err:
        t.run()
    msg = str(err.value)
    assert "\n" not in msg and "out of memory at step 4" in msg and "--batch-size 2 --grad-accum 4" in msg
    assert "step_000002.pt" in msg
    (warning,) = [e.message for e in seen if e.event == "warning"]
    assert format_table(memory.estimate(t.config), holds_batch_2) in warning
    assert [s for s, _ in t.segment.ckpts.step_files()] == [2] and not list(t.segment.ckpts.path.glob(".*"))
    assert [e.event for e in seen][-1] == "run_failed"
    assert all(p.grad is None for p in t.segment.parts.model.parameters())  # the failed step's memory is let go


@pytest.mark.slow
def test_full_disk_under_events_jsonl_drops_lines_not_the_run(tmp_path, tiny_dataset, monkeypatch):
    """ENOSPC on every write to events.jsonl (injected at os.write for that file's descriptor:
    a link to /dev/full is refused by the run, issue 21): the run trains and checkpoints."""
    real_write = os.write

    def full_for_events(fd, data):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            target = ""
        if target.endswith(rundir.EVENTS):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc/self/fd")
    seen = []
    t = open_run(tmp_path / "run", tiny_dataset, sinks=[CallbackSink(seen.append)], **{"train.max_steps": 3})
    monkeypatch.setattr(os, "write", full_for_events)
    assert t.run() == "completed"
    assert seen[-1].event == "run_finished" and ckpt.load(t.segment.ckpts.latest())["step"] == 3
    assert (t.run_dir / rundir.EVENTS).stat().st_size == 0  # every line dropped whole, none half-written


@pytest.mark.slow
def test_a_really_full_filesystem(tmp_path, tiny_dataset, capsys):
    """A 1 MiB tmpfs: saves succeed, then ENOSPC (which torch.save reports as a RuntimeError,
    unwrapped by atomic_save); the run warns, keeps what it had, and as its final checkpoint
    cannot be written either, it ends with exit 2, not "completed" (issue 12 item 5)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                                           capture_output=True).returncode != 0:  # fmt: skip
        pytest.skip("needs root with mount rights for a tiny tmpfs")
    try:
        run = mnt / "run"
        assert main(["train", *MICRO, "--data", str(tiny_dataset), "--out", str(run), "--max-steps", "8",
                     "--ckpt-interval", "1", "--keep-last", "8"]) == 2  # fmt: skip
        captured = capsys.readouterr()
        out = captured.out
        assert "(No space left on device" in out and "retries at the next checkpoint interval" in out
        assert "step 8 could not be written" in captured.err and len(captured.err.strip().splitlines()) == 1
        saved = ckpt.CheckpointDir(run / "checkpoints")
        assert 1 <= len(saved.step_files()) < 8 and not list(saved.path.glob(".*"))
        assert ckpt.load(saved.latest())["step"] == saved.step_files()[-1][0]
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
