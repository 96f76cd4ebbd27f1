"""Issue 12's input rules, as classes rather than examples: every integer bounded, every output
path checked in one place, one line for what the file system or the machine cannot do.

Bad input = one line on stderr naming the problem and the fix, exit 2, no traceback, and the
file system as it was. Commands run through the real CLI (in-process main(), real files) or,
where the process itself matters, as real subprocesses.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine import files
from gpt2_tui import main
from harness import ROOT, cli_process

MICRO = ["--preset", "micro", "--device", "cpu", "--precision", "fp32", "--eval-batches", "1"]
HUGE = str(2**63)


def tree_snapshot(root: Path) -> dict[str, tuple[int, int, int]]:
    """{path: (mode, size, mtime_ns)} of everything under root, links not followed (a loop is one entry)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [".", *dirnames, *filenames]:
            st = os.lstat(os.path.join(dirpath, name))
            out[os.path.join(dirpath, name)] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


def refused(capsys: pytest.CaptureFixture[str], argv: list[str], *words: str) -> str:
    """main(argv) exits 2 with one stderr line (argparse's refusals exit by SystemExit)."""
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for w in words:
        assert w.lower() in err.lower(), err
    return err


# ----------------------------------------------------------------------------- integers


def _parsers() -> dict[str, argparse.ArgumentParser]:
    from gpt2_tui import build_parser

    _, sub = build_parser()
    return dict(sub.choices)


def test_every_integer_flag_has_an_upper_bound() -> None:
    """Config settings are bounded in engine.config (the flags are generated from it), bench's
    numbers in BenchOptions; every other integer flag parses with cli.Bounded. A bare `type=int`
    with no bound behind it lets 2**63 through to torch or numpy."""
    from engine import cli, settings
    from bench.common import BenchOptions

    for s in settings.all_settings():
        if s.kind == "int":
            assert "<" in s.bounds, f"{s.dotted} has no upper bound ({s.bounds})"
    setting_dests = {s.dotted for s in settings.flags()}
    bench_bounded = {
        name for name, f in BenchOptions.model_fields.items() if any(getattr(m, "le", None) for m in f.metadata)
    }
    for name, parser in _parsers().items():
        for action in parser._actions:
            flag = f"`{name} {action.option_strings[0] if action.option_strings else action.dest}`"
            if isinstance(action.type, cli.Bounded):
                assert action.type.hi < 2**63, flag
            elif action.type is int:
                checked = action.dest in setting_dests or (name == "bench" and action.dest in bench_bounded)
                assert checked, f"{flag} is an unbounded int"


def _int_flags() -> list[tuple[str, str]]:
    """Every integer flag that is not a config setting (those: test_..._for_config_settings)."""
    from engine import cli, settings

    setting_dests = {s.dotted for s in settings.flags()}
    out = []
    for name, parser in _parsers().items():
        for action in parser._actions:
            if (isinstance(action.type, cli.Bounded) or action.type is int) and action.dest not in setting_dests:
                out.append((name, action.option_strings[-1]))
    return out


@pytest.mark.parametrize("command,flag", _int_flags())
def test_past_int64_is_refused_for_every_non_config_integer_flag(command, flag, tmp_path, capsys) -> None:
    os.chdir(tmp_path)
    before = tree_snapshot(tmp_path)
    refused(capsys, [command, *(["x"] if command in ("sample", "prepare") else []), flag, HUGE], flag)
    assert tree_snapshot(tmp_path) == before


@pytest.mark.parametrize("argv", [
    ["estimate", "--preset", "micro", "--device", "cpu", "--context", HUGE],
    ["estimate", "--preset", "micro", "--device", "cpu", "--batch-size", HUGE],
    ["train", *MICRO, "--max-steps", HUGE],
    ["train", *MICRO, "--sample-tokens", HUGE],
])  # fmt: skip
def test_past_int64_is_refused_for_config_settings(argv, tmp_path, capsys) -> None:
    os.chdir(tmp_path)
    refused(capsys, [*argv, "--out", "run"] if argv[0] == "train" else argv, "less than or equal")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("argv", [
    ["prepare", "text", "--out", "ds", "--seed", "-1"],
    ["prepare", "text", "--out", "ds", "--seed", str(2**32)],
    ["sample", "run", "--seed", "-1"],
    ["sample", "run", "--seed", str(2**64)],
    ["bench-data", "--seed", "-1"],
    ["bench-data", "--seed", str(2**32)],
    ["train", *MICRO, "--out", "run", "--seed", str(2**32)],
])  # fmt: skip
def test_seeds_are_0_to_2_32_everywhere(argv, tmp_path, capsys) -> None:
    os.chdir(tmp_path)
    refused(capsys, argv, "seed")
    assert list(tmp_path.iterdir()) == []


def test_bench_data_refuses_in_one_line(tmp_path, tiny_dataset, capsys) -> None:
    base = ["bench-data", "--data", str(tiny_dataset), "--iters", "1", "--warmup", "0"]
    refused(capsys, [*base, "--bogus"], "unrecognized")
    refused(capsys, [*base, "--batch-size", "abc"], "--batch-size")
    refused(capsys, [*base, "--block-size", "0"], "--block-size")
    assert main([*base, "--batch-size", "2", "--block-size", "8"]) == 0  # and a good one runs
    assert "Batch construction" in capsys.readouterr().out


def test_deeply_nested_toml_is_one_line(tmp_path, capsys) -> None:
    bad = tmp_path / "deep.toml"
    bad.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    refused(capsys, ["estimate", "--config", str(bad)], "deep")
    refused(capsys, ["train", "--config", str(bad), "--out", str(tmp_path / "run")], "deep")
    assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------- output paths


def _bad_outs(tmp_path: Path) -> dict[str, tuple[str, str]]:
    """name -> (--out value, a word the refusal must say)."""
    (tmp_path / "notes.txt").write_text("mine\n")
    os.symlink("loop", tmp_path / "loop")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("keep\n")
    return {
        "under-a-file": (str(tmp_path / "notes.txt" / "run"), "file"),
        "a-file": (str(tmp_path / "notes.txt"), "file"),
        "proc": ("/proc/gpt2-tui-test/run", "proc"),
        "sys": ("/sys/gpt2-tui-test", "sysfs"),
        "symlink-loop": (str(tmp_path / "loop"), "link"),
        "under-a-symlink-loop": (str(tmp_path / "loop" / "run"), "link"),
        "root": ("/", "not empty"),
        "not-empty": (str(tmp_path / "full"), "not empty"),
    }


OUT_CASES = ["under-a-file", "a-file", "proc", "sys", "symlink-loop", "under-a-symlink-loop", "root", "not-empty"]


@pytest.mark.parametrize("case", OUT_CASES)
@pytest.mark.parametrize("command", ["train", "prepare", "bench"])
def test_every_command_refuses_a_bad_out_the_same_way(command, case, tmp_path, tiny_dataset, capsys) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "text").mkdir()
    for i in range(3):
        (work / "text" / f"{i}.txt").write_text(f"document {i}\n" * 50)
    out, word = _bad_outs(work)[case]
    argv = {
        "train": ["train", *MICRO, "--data", str(tiny_dataset), "--max-steps", "1", "--out", out],
        "prepare": ["prepare", str(work / "text"), "--vocab-size", "300", "--out", out],
        "bench": ["bench", "--plain", "--rounds", "1", "--preset", "micro", "--data", str(tiny_dataset),
                  "--device", "cpu", "--steps", "1", "--warmup", "1", "--out", out],
    }[command]  # fmt: skip
    before, top = tree_snapshot(work), sorted(os.listdir("/"))
    refused(capsys, argv, word)
    assert tree_snapshot(work) == before and sorted(os.listdir("/")) == top


@pytest.mark.slow
def test_a_read_only_file_system_is_refused(tmp_path, tiny_dataset, capsys) -> None:
    """A read-only bind mount: EROFS even for root (chmod does not stop root)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    mounted = subprocess.run(["mount", "--bind", str(ro), str(ro)], capture_output=True).returncode == 0
    if not mounted:
        pytest.skip("cannot bind-mount here")
    try:
        if subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], capture_output=True).returncode:
            pytest.skip("cannot remount read-only here")
        for argv in (["train", *MICRO, "--data", str(tiny_dataset), "--out", str(ro / "run")],
                     ["prepare", str(tiny_dataset), "--out", str(ro / "ds")]):  # fmt: skip
            refused(capsys, argv, "read-only")
    finally:
        subprocess.run(["umount", str(ro)], capture_output=True)


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes anyway")
def test_a_directory_without_write_permission_is_refused(tmp_path, tiny_dataset, capsys) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    refused(capsys, ["train", *MICRO, "--data", str(tiny_dataset), "--out", str(locked / "run")], "cannot be written")


def test_bench_on_a_missing_gpu_refuses_before_its_out_dir(tmp_path, tiny_dataset, capsys) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    out = tmp_path / "bench"
    refused(capsys, ["bench", "--plain", "--preset", "micro", "--data", str(tiny_dataset), "--device", "cuda",
                     "--steps", "1", "--out", str(out)], "cuda")  # fmt: skip
    assert not out.exists()


# ----------------------------------------------------------------------------- the machine


@pytest.mark.slow
def test_compile_without_a_working_compiler_is_one_line(tmp_path, tiny_dataset) -> None:
    """Inductor compiles with $CXX (else g++): pointed at nothing, --compile used to fail at the
    first step with ~100 lines. A real subprocess: the environment is read as Inductor reads it."""
    run = tmp_path / "run"
    env = os.environ | {"CXX": str(tmp_path / "no-such-g++")}
    p = cli_process("train", *MICRO, "--compile", "--data", tiny_dataset, "--out", run, "--max-steps", "1", env=env)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, p.stderr[-2000:]
    assert "no-such-g++" in lines[0] and "CXX" in lines[0] and "--no-compile" in lines[0], lines[0]
    assert not run.exists()


@pytest.mark.slow
def test_compile_reason_names_a_compiler_that_does_not_run(tmp_path, monkeypatch) -> None:
    from engine import device

    broken = tmp_path / "g++"
    broken.write_text("#!/bin/sh\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("CXX", str(broken))
    assert "does not run" in (device.compile_reason(False) or "")
    monkeypatch.setenv("CXX", str(tmp_path / "missing"))
    assert "not found" in (device.compile_reason(False) or "")


SITE = """
import importlib.abc, os, sys
class _Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            sys.meta_path.remove(self)
            with open(os.environ["MKL_PROBE"], "w") as f:
                f.write(os.environ.get("MKL_DYNAMIC", "<unset>"))
        return None
sys.meta_path.insert(0, _Watch())
"""


GPT2TUI = str(Path(sys.executable).parent / "gpt2-tui")


@pytest.mark.slow
@pytest.mark.parametrize("entry,user", [(["-m", "engine.cli"], None), ([GPT2TUI], None), (["-m", "engine.cli"], "TRUE")])
def test_mkl_dynamic_is_off_before_torch_loads_in_a_training_process(entry, user, tmp_path, tiny_dataset) -> None:
    """Issue 12 item 10: MKL's dynamic threading made identical CPU runs drift on a busy
    machine. A sitecustomize records MKL_DYNAMIC at the moment torch is first imported."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITE)
    probe = tmp_path / "probe"
    env = {k: v for k, v in os.environ.items() if k != "MKL_DYNAMIC"}
    env |= {"PYTHONPATH": str(site), "MKL_PROBE": str(probe)} | ({"MKL_DYNAMIC": user} if user else {})
    p = subprocess.run([sys.executable, *entry, "train", *MICRO, "--data", str(tiny_dataset), "--out", str(tmp_path / "run"),
                        "--max-steps", "1"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    assert probe.read_text() == (user or "FALSE")


# ----------------------------------------------------------------------------- the dataset builder


@pytest.mark.slow
def test_prepare_sweeps_its_own_dead_temp_folders(tmp_path, capsys) -> None:
    text = tmp_path / "text"
    text.mkdir()
    for i in range(3):
        (text / f"{i}.txt").write_text(f"document {i}: some words here\n" * 40)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left = files.build_dir_name(tmp_path / "ds", dead.pid)  # what a kill -9 mid-build leaves
    live = files.build_dir_name(tmp_path / "ds")  # a build still running (this process)
    other = files.build_dir_name(tmp_path / "other", dead.pid)  # another dataset's: not ours to judge
    for d in (left, live, other):
        d.mkdir()
        (d / "train.bin").write_bytes(b"\0" * 10)
    assert main(["prepare", str(text), "--vocab-size", "300", "--out", str(tmp_path / "ds")]) == 0
    capsys.readouterr()
    assert not left.exists() and live.exists() and other.exists()
    assert (tmp_path / "ds" / "dataset.json").is_file()


# ----------------------------------------------------------------------------- checkpoints


@pytest.mark.slow
def test_resume_refuses_optimizer_state_that_would_not_load(tmp_path, tiny_dataset, capsys) -> None:
    """The optimizer's groups and shapes are checked against the run's optimizer (a state that
    torch would refuse with ValueError, or accept and crash with at the first step)."""
    from engine.train import checkpoint as ckpt
    from engine.errors import UserError

    run = tmp_path / "run"
    assert main(["train", *MICRO, "--data", str(tiny_dataset), "--out", str(run), "--max-steps", "2"]) == 0
    capsys.readouterr()
    path = ckpt.CheckpointDir(run / "checkpoints").latest()
    assert path is not None
    state = ckpt.load(path)
    ckpt.check_resumable(state, path)
    p = torch.nn.Parameter(torch.zeros(3, 4))
    one_group = torch.optim.AdamW([p])
    with pytest.raises(UserError, match="param_groups do not match"):
        ckpt.check_resumable(state, path, one_group)
    assert "optimizer" in (ckpt._malformed(state | {"optimizer": "adam"}) or "")
    bad = {"state": {0: {"exp_avg": "x"}}, "param_groups": [{"params": [0]}]}
    betas = {"state": {}, "param_groups": [{"params": [0], "betas": "fast"}]}
    for optimizer, words in (({"state": {}, "param_groups": []}, "empty"), (bad, "malformed"), ({}, "param_groups"),
                             (betas, "hyper-parameters")):  # fmt: skip
        with pytest.raises(UserError, match=words) as err:
            ckpt.check_resumable(state | {"optimizer": optimizer}, path)
        assert len(str(err.value).splitlines()) == 1
    shapes = {"state": {0: {"step": torch.tensor(1.0), "exp_avg": torch.zeros(5), "exp_avg_sq": torch.zeros(5)}},
              "param_groups": [{"params": [0]}]}  # fmt: skip
    with pytest.raises(UserError, match="another shape"):
        ckpt.check_resumable(state | {"optimizer": shapes}, path, one_group)
