"""Issue 23: what torch.compile compiles (model | blocks), the compile artifacts a run carries,
and a cold measurement that is cold (issue 20, finding 11).

Compiles are few and slow here (~40 s each on 2 cores): one test trains both scopes against
eager, one round-trips the artifacts across two processes (judged by torch's own cache
counters, recorded in the run's `compiled` events, never by timing).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from engine.train import compiling
from engine import events as ev
from gpt2_tui import main
from engine.run.owner import start
from harness import cli_process, micro_config, run_events


_config, _events = micro_config, run_events


# ---------------------------------------------------------------- issue 20, finding 11


@pytest.mark.slow
def test_11_compile_cache_cold_compiles_in_a_fresh_process(tmp_path, tiny_dataset, monkeypatch, capsys):
    """Triton pins its cache directory at a process's first autotune, so a second 'cold'
    compile in the same process reads the first one's kernels. Cold is only cold in a
    process that has compiled nothing: the measurement must not run torch.compile here.
    (Counted with a stand-in torch.compile in this process; a fresh process has the real one.)"""
    compiled: list[object] = []

    def fake_compile(model, *args, **kwargs):
        compiled.append(model)
        return model

    monkeypatch.setattr(torch, "compile", fake_compile)
    toml = tmp_path / "run.toml"
    toml.write_text(_config(tiny_dataset, **{"speed.compile": True}).to_toml())
    out = tmp_path / "t"
    code = main(["bench", "--config", str(toml), "--steps", "1", "--compile-cache", "cold", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    assert compiled == [], "the cold measurement compiled inside the calling process"
    first = json.loads((out / "timeline.json").read_text())["first_steps"]
    assert [f["cache"] for f in first] == ["cold"] and first[0]["cache_files"] > 0


# ---------------------------------------------------------------- the two scopes


def _losses(config, run_dir: Path) -> tuple[list[float], list[ev.Compiled]]:
    from engine.train.trainer import measuring  # no evals: only the training graph is compiled

    seen: list = []
    start(config, run_dir, sinks=[ev.CallbackSink(seen.append)], force=True, components=measuring).run()
    return [e.loss for e in seen if isinstance(e, ev.Step)], [e for e in seen if isinstance(e, ev.Compiled)]


@pytest.mark.slow
def test_both_compile_scopes_train_to_eager_losses(tmp_path, tiny_dataset):
    base = {"train.max_steps": 3, "train.log_interval": 1, "train.batch_size": 2}
    eager, none = _losses(_config(tiny_dataset, **base), tmp_path / "eager")
    assert none == [] and len(eager) == 3
    for scope in ("model", "blocks"):
        compiling.reset()
        losses, warm = _losses(_config(tiny_dataset, **base, **{"speed.compile": True, "speed.compile_scope": scope}),
                               tmp_path / scope)  # fmt: skip
        assert losses == pytest.approx(eager, rel=1e-4, abs=1e-5), scope
        assert len(warm) == 1 and warm[0].scope == scope and warm[0].compiled
        if scope == "blocks":  # the micro preset's 2 blocks share one graph; the loss head is the other
            assert warm[0].graphs == 2


# ---------------------------------------------------------------- artifacts that travel with the run


def _train(args: list[str], cache: Path) -> None:
    env = {**os.environ, "GPT2_TUI_CACHE": str(cache)}  # another cache: a machine that never compiled this
    proc = cli_process("train", *args, env=env, timeout=None)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.slow
def test_compile_artifacts_saved_by_one_process_spare_the_next_its_compile(tmp_path, tiny_dataset):
    run = tmp_path / "run"
    flags = ["--preset", "micro", "--device", "cpu", "--precision", "fp32", "--compile", "--data", str(tiny_dataset),
             "--log-interval", "1", "--eval-interval", "100", "--ckpt-interval", "100"]  # fmt: skip
    _train([*flags, "--out", str(run), "--max-steps", "2"], tmp_path / "machine-a")
    assert (run / compiling.ARTIFACTS).is_file()
    (first,) = [e for e in _events(run) if isinstance(e, ev.Compiled)]
    assert first.source == "cold" and first.cache_misses > 0

    (tmp_path / "machine-b").mkdir()  # another compile cache, this user's key: artifacts are this user's only
    key = tmp_path / "machine-b" / compiling.KEY
    key.write_bytes((tmp_path / "machine-a" / compiling.KEY).read_bytes())
    key.chmod(0o600)
    _train(["--resume", str(run), "--max-steps", "4"], tmp_path / "machine-b")
    events = _events(run)
    second = [e for e in events if isinstance(e, ev.Compiled)][1]
    assert second.source == "run artifacts"
    assert second.cache_misses == 0 and second.cache_hits > 0  # torch's own counters: nothing compiled anew
    assert not [e for e in events if isinstance(e, ev.Warning_) and "artifacts" in e.message]
    from engine.run.segments import segments_of

    segs = segments_of(events)
    assert [(s.compiled, s.compile_source) for s in segs] == [(True, "cold"), (True, "run artifacts")]


def test_foreign_or_linked_artifacts_are_ignored_in_one_line(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    path = run / compiling.ARTIFACTS
    path.write_bytes(compiling.pack({"torch": "1.0", "device": "elsewhere"}, b"x", compiling.signing_key(create=True)))
    loaded, note = compiling.load_artifacts(run, "cpu")
    assert not loaded and "torch 1.0 on elsewhere" in note and len(note.splitlines()) == 1
    path.write_bytes(b"garbage")
    loaded, note = compiling.load_artifacts(run, "cpu")
    assert not loaded and "not a signed gpt2-tui artifacts file" in note
    path.unlink()
    path.symlink_to(tmp_path / "elsewhere.bin")
    (tmp_path / "elsewhere.bin").write_bytes(b"secret")
    loaded, note = compiling.load_artifacts(run, "cpu")
    assert not loaded and "ignored" in note
    assert compiling.load_artifacts(tmp_path, "cpu") == (False, None)  # none: nothing to say
