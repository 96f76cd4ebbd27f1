"""What a red-team broke in a run's trust: compile artifacts that ran code, a lock row of
another file system taken for the run's, a full mailbox that kept a paused run paused, a
mailbox others could write, a stale stop dated in the future, a toggle applied unsaid.
Each test fails on the code before its fix."""

from __future__ import annotations

import json
import os
import pickle
import signal
import stat
import threading
import time
from pathlib import Path

import pytest
import torch

from harness import QUIET, run_events, train, tree_snapshot
from engine import rundir
from engine.errors import UserError
from engine.files import cache_root
from engine.run import requests
from engine.run.preflight import resumed_config
from engine.run.requests import Control, Request
from engine.train import compiling


def _run(run_dir: Path, data: Path, steps: int, hook=None, resume: bool = False, control=None, **flags) -> str:
    flags = {"train.max_steps": steps} if resume else QUIET | {"train.max_steps": steps} | flags
    return train(run_dir, data, resume=resume, on_event=hook, control=control, **flags)


# ---------------------------------------------------------------- compile artifacts are code


class _Boom:
    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))  # unpickling creates the marker file


def _planted_blob(tmp_path: Path) -> bytes:
    """What torch.compiler.load_cache_artifacts takes: an autotune entry whose key is an
    absolute path outside every cache, and entries whose unpickling runs code."""
    from torch.utils._appending_byte_serializer import BytesWriter

    w = BytesWriter()
    w.write_uint64(1)
    for kind, key, content in [("autotune", str(tmp_path / "written-outside"), b"planted"),
                               ("inductor", "fx", pickle.dumps(_Boom(tmp_path / "pickle-ran"))),
                               ("precompile", "pc", pickle.dumps(_Boom(tmp_path / "pickle-ran")))]:  # fmt: skip
        w.write_str(kind)
        w.write_uint64(1)
        w.write_str(key)
        w.write_bytes(content)
    return w.to_bytes()


def test_a_planted_compile_artifact_never_reaches_torch(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    stamp = json.dumps(compiling._stamp("cpu")).encode()
    cache_before = tree_snapshot(cache_root()) if cache_root().exists() else {}
    blob = _planted_blob(tmp_path)
    forged = lambda: compiling.pack(compiling._stamp("cpu"), blob, b"k" * 32)  # noqa: E731 signed, with another key
    for data in (lambda: compiling._MAGIC + stamp + b"\n" + blob, forged):
        (run / compiling.ARTIFACTS).write_bytes(data())
        loaded, note = compiling.load_artifacts(run, "cpu")
        assert not loaded and note and "ignored" in note and len(note.splitlines()) == 1, note
        assert not (tmp_path / "pickle-ran").exists() and not (tmp_path / "written-outside").exists()
    # the shared compile cache (and the key) are untouched: a load writes nothing
    assert (tree_snapshot(cache_root()) if cache_root().exists() else {}) == cache_before


@pytest.fixture
def saved(tmp_path, monkeypatch) -> tuple[Path, Path, list[bytes]]:
    """Artifacts saved into run/ and signed with this user's key in a fresh cache (torch's own
    save and load faked: nothing compiles): (run, key, what torch was given to load)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("GPT2_TUI_CACHE", str(cache))
    loaded: list[bytes] = []
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: (b"our own compiled code", None))
    monkeypatch.setattr(torch.compiler, "load_cache_artifacts", lambda body: loaded.append(body) or object())
    run = tmp_path / "run"
    run.mkdir()
    assert compiling.save_artifacts(run, "cpu")
    return run, cache / compiling.KEY, loaded


def test_artifacts_this_user_saved_load_and_an_altered_byte_does_not(saved):
    run, key, loaded = saved
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and key.stat().st_size == 32
    assert compiling.load_artifacts(run, "cpu") == (True, None) and loaded == [b"our own compiled code"]
    data = bytearray((run / compiling.ARTIFACTS).read_bytes())
    data[-1] ^= 1
    (run / compiling.ARTIFACTS).write_bytes(bytes(data))
    loaded_now, note = compiling.load_artifacts(run, "cpu")
    assert not loaded_now and "signature does not match" in note and len(loaded) == 1


def test_a_signing_key_that_is_a_link_or_readable_by_others_is_refused(tmp_path, saved):
    run, key, loaded = saved
    key.chmod(0o644)
    ok, note = compiling.load_artifacts(run, "cpu")
    assert not ok and "signing key" in note and "read or written by others" in note, note
    with pytest.raises(OSError):
        compiling.save_artifacts(run, "cpu")
    secret = tmp_path / "elsewhere.key"
    secret.write_bytes(key.read_bytes())
    secret.chmod(0o600)
    key.unlink()
    key.symlink_to(secret)
    ok, note = compiling.load_artifacts(run, "cpu")
    assert not ok and "symbolic link" in note, note
    assert loaded == []


# ---------------------------------------------------------------- the lock's row in /proc/locks


def test_a_lock_row_of_another_device_with_the_same_inode_is_not_the_runs(tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    st = os.stat(run)
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    other = f"{major + 1:02x}:{minor:02x}:{st.st_ino}"
    real_read = rundir.files.read_text
    rows = {"text": f"1: FLOCK  ADVISORY  WRITE 4242 {other} 0 EOF\n"}
    monkeypatch.setattr(rundir.files, "read_text",
                        lambda path, cap, *a, **k: rows["text"] if str(path) == "/proc/locks" else real_read(path, cap, *a, **k))  # fmt: skip
    assert rundir.lock_holder(run) is None and rundir.writer_alive(run) is False
    rows["text"] = f"1: FLOCK  ADVISORY  WRITE 4242 {major:02x}:{minor:02x}:{st.st_ino} 0 EOF\n"
    assert rundir.lock_holder(run) == 4242 and rundir.writer_alive(run) is True


# ---------------------------------------------------------------- the mailbox


@pytest.mark.slow
def test_a_paused_run_with_a_full_mailbox_still_resumes(tmp_path, tiny_dataset):
    run_dir, paused, result = tmp_path / "run", threading.Event(), {}
    control = Control()

    def hook(e):
        if e.event == "step" and e.step == 2 and not result.get("asked"):
            result["asked"] = True
            requests.post(run_dir, Request("pause"))
        if e.event == "paused":
            paused.set()

    def go():
        result["end"] = _run(run_dir, tiny_dataset, 6, hook, control=control, **{"train.log_interval": 1})

    worker = threading.Thread(target=go, daemon=True)
    worker.start()
    try:
        assert paused.wait(120), "the run never paused"
        refusal = None
        for _ in range(2000):
            try:
                requests.post(run_dir, Request("toggle", switches={"data.prefetch": False}))
            except UserError as err:
                refusal = str(err)
                break
        assert refusal and "the run's mailbox is full (" in refusal and "requests pending); wait for it to take them" in refusal
        assert len(refusal.splitlines()) == 1
        requests.post(run_dir, Request("resume"))  # the reserve: a full mailbox still takes it
        worker.join(180)
    finally:
        if worker.is_alive():
            control.stop()  # unstick the run the old code left paused
            worker.join(60)
    assert result.get("end") == "completed"
    events = run_events(run_dir)
    assert any(e.event == "resumed" for e in events) and events[-1].event == "run_finished"
    assert not (run_dir / requests.MAILBOX).exists()


def test_a_fifo_mailbox_never_blocks_the_writer_or_a_sender(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / requests.MAILBOX)

    def hung(*_):
        raise AssertionError("blocked on a FIFO")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(10)
    try:
        box = requests.Mailbox(run)
        box.mark_start()
        (refused,) = box.take()
        assert refused.kind == "mailbox" and "not a regular file" in refused.problem
        with pytest.raises((UserError, OSError)):
            requests.post(run, Request("stop"))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.slow
def test_a_mailbox_others_may_write_is_not_obeyed(tmp_path, tiny_dataset):
    run_dir = tmp_path / "run"

    def hook(e):
        if e.event == "step" and e.step == 2 and not (run_dir / "asked").exists():
            (run_dir / "asked").touch()
            requests.post(run_dir, Request("stop"))  # as another uid would, through a 0666 file
            os.chmod(run_dir / requests.MAILBOX, 0o666)

    assert _run(run_dir, tiny_dataset, 5, hook, **{"train.log_interval": 1}) == "completed"
    events = run_events(run_dir)
    warnings = [e.message for e in events if e.event == "warning"]
    assert len(warnings) == 1 and "writable by group or others" in warnings[0], warnings
    assert not [e for e in events if e.event == "request"]
    assert not (run_dir / requests.MAILBOX).exists()


@pytest.mark.slow
def test_a_future_dated_stop_left_by_a_dead_run_is_stale_at_resume(tmp_path, tiny_dataset):
    run_dir = tmp_path / "run"
    assert _run(run_dir, tiny_dataset, 3) == "completed"
    left = Request("stop", time=time.time() + 3600)  # its own clock says it is an hour from now
    requests.post(run_dir, left)
    assert _run(run_dir, tiny_dataset, 5, resume=True) == "completed"
    events = run_events(run_dir)
    (ack,) = [e for e in events if e.event == "request"]
    assert (ack.id, ack.status) == (left.id, "dropped") and ack.reason.startswith("stale")
    assert any(e.event == "warning" and f"discarded a stop request ({left.id})" in e.message for e in events)
    assert [e.step for e in events if e.event == "step"][-1] == 5


# ---------------------------------------------------------------- a toggle applied, then a kill


@pytest.mark.slow
def test_a_toggle_applied_just_before_a_kill_is_acknowledged_at_resume(tmp_path, tiny_dataset):
    """The kill came after config.toml took the toggle's switches and before the new segment's
    events (simulated: the toggle's checkpoint names it, config.toml has its switches, the log
    has no ack): the resume acknowledges it once, and a second resume says nothing more."""
    run_dir = tmp_path / "run"
    assert _run(run_dir, tiny_dataset, 4, **{"train.ckpt_interval": 2}) == "completed"
    latest = max((run_dir / "checkpoints").glob("step_*.pt"))
    state = torch.load(latest, weights_only=True)
    state["pending_toggles"] = [{"id": "t0ggle2d", "switches": {"data.prefetch": False}}]
    torch.save(state, latest)
    rundir.write_config(run_dir, resumed_config(run_dir, {"data.prefetch": False}))
    assert _run(run_dir, tiny_dataset, 5, resume=True) == "completed"
    acks = [e for e in run_events(run_dir) if e.event == "request" and e.id == "t0ggle2d"]
    assert [(a.kind, a.status) for a in acks] == [("toggle", "applied")], acks


def test_a_mailbox_larger_than_post_ever_fills_is_removed_with_one_warning(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / requests.MAILBOX).write_text("[" * (requests.READ_CAP + 1))
    (refused,) = requests.Mailbox(run).take()
    assert refused.kind == "mailbox" and "removed unread" in refused.problem
    assert not (run / requests.MAILBOX).exists()
