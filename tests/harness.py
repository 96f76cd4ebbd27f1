"""The shared test harness: what many test files need to set up and drive a run, in one place.

Not a test file (pytest collects nothing here; tests/conftest.py turns its asserts into
pytest's rewritten ones). Sections:
  - paths and flags: ROOT, DATA (recorded runs), CPU / QUIET settings, MICRO command-line flags;
  - datasets on disk, written the way gpt2-tui, nanoGPT and llm.c write them;
  - in-process runs on the real engine: micro_config, open_run, train, run_events;
  - the command line: cli_fails (in-process), cli_process / python_c (a child process);
  - file trees: tree_snapshot, tree_state, tree_diff;
  - Pilot waits: until, launch_in_app;
  - recorded run directories for the screens: write_run, write_gpu_run, gpu_rounds, runs_app;
  - hostile input: the warm fork runner of the console script (run_cli), Work dirs, refusal_problems;
  - the table of trained runs: named micro runs trained once a session, handed out as copies;
  - tables read from the config: the model's recipe switches (model_switches), a setting's
    strict type check (accepts), the estimator's test shapes (MEMORY_SHAPES), a recorded chart
    state (recorded_state).
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# ----------------------------------------------------------------------------- paths and flags

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"  # recorded run directories: tui-run (30 nano steps), nano-150
ENGINE_CLI = "engine.cli"  # `python -m ENGINE_CLI ARGS`: the headless commands in a child process
CPU = {"speed.device": "cpu", "speed.precision": "fp32"}
QUIET = {"train.eval_interval": 100, "train.ckpt_interval": 100, "train.sample_tokens": 0}  # steps only
MICRO = ["--preset", "micro", "--device", "cpu", "--precision", "fp32"]  # the same on the command line


def force_cpu_native(monkeypatch, native: str) -> None:
    """Take this CPU to do `native` ("none", "bf16", "bf16,fp16") in hardware, whatever it is
    (engine.device.CPU_NATIVE_ENV, child processes included): a test of a branch that depends
    on the CPU forces each side, so it passes on any x86-64 CPU."""
    from engine.device import CPU_NATIVE_ENV

    monkeypatch.setenv(CPU_NATIVE_ENV, native)

# ----------------------------------------------------------------------------- datasets

LLMC_MAGIC = 20240520


def write_gpt2tui(
    root: Path,
    train: np.ndarray,
    val: np.ndarray,
    vocab_size: int,
    eot_id: int | None = None,
    tokenizer: str | None = None,
) -> Path:
    """A gpt2-tui dataset dir: dataset.json + train.bin + val.bin (dtype from the vocab)."""
    root.mkdir(parents=True, exist_ok=True)
    dtype = "uint16" if vocab_size <= 65536 else "uint32"
    on_disk = {"uint16": "<u2", "uint32": "<u4"}[dtype]
    np.asarray(train).astype(on_disk).tofile(root / "train.bin")
    np.asarray(val).astype(on_disk).tofile(root / "val.bin")
    sidecar = {
        "format": "gpt2-tui",
        "version": 1,
        "dtype": dtype,
        "vocab_size": vocab_size,
        "train_tokens": int(len(train)),
        "val_tokens": int(len(val)),
        "tokenizer": tokenizer,
        "eot_id": eot_id,
    }
    (root / "dataset.json").write_text(json.dumps(sidecar))
    return root


def write_nanogpt(root: Path, train: np.ndarray, val: np.ndarray) -> Path:
    """nanoGPT's layout: raw uint16 train.bin / val.bin, nothing else."""
    root.mkdir(parents=True, exist_ok=True)
    np.asarray(train).astype("<u2").tofile(root / "train.bin")
    np.asarray(val).astype("<u2").tofile(root / "val.bin")
    return root


def write_llmc_shard(path: Path, tokens: np.ndarray, magic: int = LLMC_MAGIC, version: int = 1,
                     count: int | None = None) -> Path:  # fmt: skip
    """One llm.c shard: 256 int32 header (magic, version, token count) + uint16 tokens."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = np.zeros(256, dtype="<i4")
    header[:3] = [magic, version, len(tokens) if count is None else count]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens).astype("<u2").tobytes())
    return path


def write_llmc(root: Path, shards: dict[str, np.ndarray]) -> Path:
    """A directory of llm.c shards, e.g. {"x_train_000001.bin": ids, "x_val_000000.bin": ids}."""
    for name, tokens in shards.items():
        write_llmc_shard(root / name, tokens)
    return root


def random_tokens(n: int, vocab_size: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab_size, size=n, dtype=np.int64)


def bigram_tokens(n: int, vocab_size: int, seed: int = 0, keep: float = 0.9) -> np.ndarray:
    """A noisy bigram chain: next = (5 * t + 1) % V with probability `keep`, else uniform.
    Its best loss is far below ln V, so "the loss falls" is a real claim, not a coin flip."""
    rng = np.random.default_rng(seed)
    noise = rng.integers(0, vocab_size, size=n)
    follow = rng.random(n) < keep
    out = np.empty(n, dtype=np.int64)
    out[0] = noise[0]
    for i in range(1, n):
        out[i] = (5 * out[i - 1] + 1) % vocab_size if follow[i] else noise[i]
    return out


# ----------------------------------------------------------------------------- in-process runs


def micro_config(data: Path, **flags):
    """The micro preset on CPU in fp32 over `data`, with dotted overrides: a run's config for
    tests that build the engine directly."""
    from engine.config import resolve

    return resolve("micro", None, {"data.path": str(data)} | CPU | flags)


def built_parts(data: Path, run_dir: Path, overrides: dict[str, Any]):
    """The micro preset over `data` with `overrides`, bound to its dataset, built into a
    segment's parts and finished (compiled where asked, attention picked) without a run."""
    from engine.config import resolve
    from engine.run.preflight import open_data
    from engine.train import build, distributed

    config, dataset = open_data(resolve("micro", None, {"data.path": str(data)} | overrides))
    parts = build.parts(config, dataset, distributed.Context(), None)
    build.finish(parts, config, run_dir)
    return parts


def open_run(run_dir: Path, data: Path | None = None, *, resume: bool = False, sinks: Iterable = (),
             control=None, on_event: Callable | None = None, force: bool = False, **flags):  # fmt: skip
    """A run opened by its owner (engine.run.owner.start), not yet trained: micro_config(data,
    **flags), or with resume=True the run's own config with `flags` on top, as `--resume` reads
    it. on_event(e) is called for every event (a CallbackSink after `sinks`)."""
    from engine.events import CallbackSink
    from engine.run.preflight import resumed_config
    from engine.run.owner import start

    config = resumed_config(run_dir, flags) if resume else micro_config(data, **flags)  # type: ignore[arg-type]
    sinks = [*sinks, CallbackSink(on_event)] if on_event else list(sinks)
    return start(config, run_dir, resume=resume, sinks=sinks, control=control, force=force)


def train(run_dir: Path, data: Path | None = None, **kw) -> str:
    """open_run(...) trained to its end; its outcome ("completed", "stopped", ...)."""
    return open_run(run_dir, data, **kw).run()


def run_events(run_dir: Path) -> list:
    """A run's events, every line readable (a test run writes no bad line)."""
    from engine import rundir
    from engine.events import read_events

    events, problems = read_events(run_dir / rundir.EVENTS)
    assert problems == []
    return events


def trained(run_dir: Path, data: Path | None = None, **kw) -> list:
    """train(...) and the run's events."""
    train(run_dir, data, **kw)
    return run_events(run_dir)


def stopped_at(run_dir: Path, data: Path, step: int, **flags) -> list:
    """A run stopped (Control.stop, as a UI's stop) when step `step` is done; its events."""
    from engine.run.requests import Control

    control = Control()
    stop = lambda e: e.event == "step" and e.step == step and control.stop()  # noqa: E731
    assert train(run_dir, data, control=control, on_event=stop, **flags) == "stopped"
    return run_events(run_dir)


def losses(events) -> list[tuple[int, float]]:
    """(step, loss) of each step event."""
    return [(e.step, e.loss) for e in events if e.event == "step"]


# ----------------------------------------------------------------------------- the command line


def cli_fails(capsys, argv: list[str], *words: str) -> str:
    """Run the in-process CLI: it must exit 2 with one stderr line naming the problem."""
    from gpt2_tui import main

    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, err
    return err


def cli_process(*argv: Any, cwd: Path = ROOT, env: dict[str, str] | None = None, timeout: float | None = 300,
                **kw) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """`python -m engine.cli ARGV` in a child process (its own environment, as a user's shell
    gives it), run to its end with its output captured."""
    return subprocess.run([sys.executable, "-m", ENGINE_CLI, *map(str, argv)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, **kw)  # fmt: skip


def python_c(code: str, *argv: Any, cwd: Path = ROOT, env: dict[str, str] | None = None,
             timeout: float = 120) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """`python -c CODE ARGV` in a fresh interpreter: what a module imports, seen from outside."""
    return subprocess.run([sys.executable, "-c", code, *map(str, argv)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


# ----------------------------------------------------------------------------- file trees


def tree_snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """{relative path: (size, mtime_ns)} of everything under root: to assert nothing changed."""
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
    }


def tree_state(*roots: Path) -> dict[str, tuple[int, int, int, int]]:
    """{path: (file type, mode, size, mtime_ns)} of every entry under the roots (lstat: links
    are not followed, so a symlink loop is one entry)."""
    out: dict[str, tuple[int, int, int, int]] = {}

    def visit(p: str) -> None:
        try:
            s = os.lstat(p)
        except OSError:
            return
        out[p] = (
            stat.S_IFMT(s.st_mode),
            stat.S_IMODE(s.st_mode),
            s.st_size,
            s.st_mtime_ns,
        )
        if stat.S_ISDIR(s.st_mode):
            try:
                names = sorted(os.listdir(p))
            except OSError:
                return
            for n in names:
                visit(os.path.join(p, n))

    for r in roots:
        visit(str(r))
    return out


def tree_diff(before: dict, after: dict) -> str:
    """'' when equal, else a short account: +added -removed ~changed (what changed)."""
    added = sorted(set(after) - set(before))
    removed = sorted(set(before) - set(after))
    changed = []
    for p in sorted(set(before) & set(after)):
        if before[p] != after[p]:
            what = [
                w
                for w, a, b in zip(
                    ("type", "mode", "size", "mtime"), before[p], after[p]
                )
                if a != b
            ]
            changed.append(f"{p} ({','.join(what)})")
    parts = []
    for sign, items in (("+", added), ("-", removed), ("~", changed)):
        if items:
            parts.append(
                " ".join(f"{sign}{i}" for i in items[:6])
                + (f" (+{len(items) - 6} more)" if len(items) > 6 else "")
            )
    return "; ".join(parts)



# ----------------------------------------------------------------------------- Pilot waits

WAIT_S = 180.0  # generous bound for a loaded 2-core machine; the poll ends as soon as it holds


async def until(pilot, predicate: Callable[[], object], what: str, timeout: float = WAIT_S) -> None:
    """Poll until predicate() holds, or fail naming what never came."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not predicate():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for: {what}")
        await pilot.pause(0.05)


async def launch_in_app(pilot, app, run_dir: Path, steps: int):
    """Name the run directory on the setup form, F6 (the run on the app's thread), and wait for
    the dashboard and `steps` trained steps; the dashboard screen."""
    from tui.screens.dashboard import DashboardScreen

    await pilot.pause()
    app.screen.query_one("#run-dir").value = str(run_dir)
    await pilot.pause()
    await pilot.press("f6")
    await until(pilot, lambda: isinstance(app.screen, DashboardScreen), "the dashboard")
    await until(pilot, lambda: app.session.state.step >= steps, "a few steps")
    return app.screen


# ----------------------------------------------------------------------------- recorded run directories

_claimed: list[Path] = []  # runs whose writer lock this process holds (write_run(alive=True))


def write_run(root: Path, name: str, t0: float, *, end: str | None = None, alive: bool = False) -> Path:
    """A nano run's directory as the Runs screen lists it: started at t0, one eval, maybe ended;
    alive: this process holds its writer lock (release_claimed() lets go)."""
    from engine import events as ev
    from engine import rundir

    d = root / name
    d.mkdir(parents=True)
    (d / rundir.CONFIG).write_text('preset = "nano"\n')
    cfg = {"preset": "nano", "model": {"vocab_size": 8192}, "train": {"max_steps": 10}}
    lines = [ev.RunStarted(time=t0, config=cfg, n_params=1_858_304, device="cpu", device_name="CPU", precision="fp32",
                           flops_per_token=1)]  # fmt: skip
    lines.append(ev.Eval(time=t0 + 1, step=0, val_loss=5.5))
    if end:
        lines.append(ev.RunFinished(time=t0 + 2, step=10, reason=end))
    (d / rundir.EVENTS).write_text("".join(e.model_dump_json() + "\n" for e in lines))
    if alive:  # this process holds the run's lock: the one liveness rule (issue 21)
        rundir.claim_writer(d)
        _claimed.append(d)
    return d


def release_claimed() -> None:
    """Let go of every writer lock write_run(alive=True) took."""
    from engine import rundir

    while _claimed:
        rundir.release_writer(_claimed.pop())


def gpu_rounds(n: int = 4) -> list:
    """n rounds of recorded readings of one H100."""
    from engine.gpu_monitor import GpuSample

    return [[GpuSample(t=1000.0 + k, index=0, name="NVIDIA H100", util_pct=90.0 + k, mem_used_bytes=(40 + k) * 2**30,
                       mem_total_bytes=80 * 2**30, power_w=600.0, temp_c=60.0, sm_clock_mhz=1980)]
            for k in range(n)]  # fmt: skip


def write_gpu_run(root: Path, gpus: bool) -> Path:
    """A finished 10-step run an attached dashboard can show: with gpu_rounds() in its events
    (gpu-run) or none (cpu-run)."""
    from engine import events as ev
    from engine import rundir
    from engine.gpu_monitor import GpuEvent

    d = root / ("gpu-run" if gpus else "cpu-run")
    d.mkdir(parents=True)
    (d / rundir.CONFIG).write_text('preset = "nano"\n')
    cfg = {"preset": "nano", "model": {"vocab_size": 8192}, "train": {"max_steps": 10, "batch_size": 1, "grad_accum": 1,
           "block_size": 8}, "optim": {"grad_clip": 1.0}}  # fmt: skip
    lines = [ev.RunStarted(time=1000.0, config=cfg, n_params=1, device="cuda" if gpus else "cpu",
                           device_name="GPU" if gpus else "CPU", precision="bf16", flops_per_token=1).model_dump_json()]
    if gpus:
        lines += [GpuEvent(time=1000.0 + k, gpus=r).model_dump_json() for k, r in enumerate(gpu_rounds())]
    lines.append(ev.RunFinished(time=1010.0, step=10).model_dump_json())
    (d / rundir.EVENTS).write_text("\n".join(lines) + "\n")
    return d


def runs_app(root: Path):
    """A minimal App showing only the Runs screen over `root`; the Open messages it posts are
    kept in app.opened (Textual loads here, not when a test of the engine imports this)."""
    from textual.app import App

    from tui.screens.runs import RunsScreen

    class RunsApp(App):
        def __init__(self) -> None:
            super().__init__()
            self.opened: list[RunsScreen.Open] = []

        def on_mount(self) -> None:
            self.push_screen(RunsScreen(root, refresh_s=0))

        def on_runs_screen_open(self, message: RunsScreen.Open) -> None:
            self.opened.append(message)

    return RunsApp()


# ----------------------------------------------------------------------------- hostile input: the warm runner
# How the console script is run by run_cli: `import torch` alone takes ~4 s on the 2-core dev box, and
# tests/robustness/test_hostile_inputs.py's table has ~200 rows, so each row runs the console script in a
# child forked from a warm interpreter that has imported torch/numpy/tokenizers/pydantic (nothing of this
# project: the child imports `engine`/`tui` fresh from disk, runs `.venv/bin/gpt2-tui` with runpy as
# `__main__`, in its own cwd, environment and process group, stdout/stderr to files, and its exit status is
# the process's). GPT2TUI_REAL_EXEC=1 runs every row as a plain `.venv/bin/gpt2-tui` subprocess (slow).

GPT2TUI = Path(sys.executable).parent / "gpt2-tui"

_SERVER = r"""
import json, os, sys, time, traceback
proto_in = os.fdopen(os.dup(0), "r")
proto_out = os.fdopen(os.dup(1), "w")
null = os.open(os.devnull, os.O_RDWR)
os.dup2(null, 0); os.dup2(null, 1)
import numpy, torch, tokenizers, pydantic  # the slow imports, once; nothing of the project
proto_out.write("ready\n"); proto_out.flush()
for line in proto_in:
    req = json.loads(line)
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setpgid(0, 0)
            proto_in.close(); proto_out.close()
            os.chdir(req["cwd"])
            os.environ.clear(); os.environ.update(req["env"])
            for fd, name, flags in ((0, os.devnull, os.O_RDONLY),
                                    (1, req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                                    (2, req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
                f = os.open(name, flags, 0o644); os.dup2(f, fd); os.close(f)
            script = req["script"]
            sys.argv = [script, *req["argv"]]
            sys.path[0] = os.path.dirname(script)  # as when the script itself is exec'd
            import runpy
            try:
                runpy.run_path(script, run_name="__main__")
                code = 0
            except SystemExit as e:
                c = e.code
                if c is None:
                    code = 0
                elif isinstance(c, int):
                    code = c
                else:
                    print(c, file=sys.stderr); code = 1
            except BaseException:
                traceback.print_exc(); code = 1
            try:
                import threading, atexit
                threading._shutdown()
                atexit._run_exitfuncs()
            except BaseException:
                pass
        finally:
            try:
                sys.stdout.flush(); sys.stderr.flush()
            finally:
                os._exit(code)
    deadline = time.monotonic() + req["timeout"]
    rc = None
    while True:
        wpid, status = os.waitpid(pid, os.WNOHANG)
        if wpid:
            rc = os.waitstatus_to_exitcode(status)
            break
        if time.monotonic() > deadline:
            try:
                os.killpg(pid, 9)
            except OSError:
                pass
            os.waitpid(pid, 0)
            rc = "timeout"
            break
        time.sleep(0.01)
    try:
        os.killpg(pid, 9)  # what the child left running (threads die with it; processes not)
    except OSError:
        pass
    proto_out.write(json.dumps({"rc": rc}) + "\n"); proto_out.flush()
"""


@dataclass
class Result:
    argv: list[str]
    rc: int | str
    out: str
    err: str

    def summary(self) -> str:
        lines = self.err.strip().splitlines()
        if not lines:
            first = "<empty stderr>"
        elif "Traceback" in self.err:
            first = f"TRACEBACK ... {lines[-1][:200]}"
        else:
            first = lines[0][:220] + (
                f" (+{len(lines) - 1} more lines)" if len(lines) > 1 else ""
            )
        return f"exit {self.rc}; stderr: {first}"


class _Server:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.proc: subprocess.Popen[str] | None = None
        self.io = Path(tempfile.mkdtemp(prefix="gpt2tui-runner-"))

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1)  # fmt: skip
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline()
        assert ready.strip() == "ready", f"runner failed to start: {ready!r}"

    def run(
        self, argv: list[str], cwd: Path, env: dict[str, str], timeout: float
    ) -> Result:
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                self.start()
            assert self.proc is not None and self.proc.stdin and self.proc.stdout
            out, err = self.io / "stdout", self.io / "stderr"
            req = {"argv": argv, "cwd": str(cwd), "env": env, "script": str(GPT2TUI),
                   "stdout": str(out), "stderr": str(err), "timeout": timeout}  # fmt: skip
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
            reply = json.loads(self.proc.stdout.readline())
            return Result(
                argv,
                reply["rc"],
                out.read_text(errors="replace"),
                err.read_text(errors="replace"),
            )

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()  # type: ignore[union-attr]
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        shutil.rmtree(self.io, ignore_errors=True)


_server = _Server()
atexit.register(_server.close)


def cli_env(cache: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTEST_", "HYPOTHESIS"))
    }
    env["GPT2_TUI_CACHE"] = str(cache)
    env.update(extra)
    return env


def run_cli(argv: list[str], cwd: Path, cache: Path, timeout: float = 60, real: bool | None = None,
            **env: str) -> Result:  # fmt: skip
    """`gpt2-tui ARGV` in cwd with GPT2_TUI_CACHE=cache (forked from the warm runner unless
    real=True or GPT2TUI_REAL_EXEC=1: then a plain subprocess of the console script)."""
    real = os.environ.get("GPT2TUI_REAL_EXEC") == "1" if real is None else real
    environ = cli_env(cache, **env)
    if not real:
        return _server.run([str(a) for a in argv], cwd, environ, timeout)
    try:
        p = subprocess.run([str(GPT2TUI), *map(str, argv)], cwd=cwd, env=environ, stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, errors="replace", timeout=timeout,
                           start_new_session=True, check=False)  # fmt: skip
        return Result(list(argv), p.returncode, p.stdout, p.stderr)
    except subprocess.TimeoutExpired as e:
        return Result(list(argv), "timeout", str(e.stdout or ""), str(e.stderr or ""))


def refusal_problems(res: Result, fs_change: str = "") -> list[str]:
    """What breaks the house rule for a refused input (empty = a proper refusal)."""
    problems = []
    if res.rc != 2:
        problems.append(f"exit status {res.rc}, not 2")
    lines = res.err.splitlines()
    if "Traceback" in res.err or "Traceback" in res.out:
        problems.append("a traceback")
    if len(lines) != 1 or not lines[0].strip():
        problems.append(f"stderr has {len(lines)} lines, not one")
    if fs_change:
        problems.append(f"file system changed: {fs_change}")
    return problems


# ----------------------------------------------------------------------------- hostile input: the work dir

WORDS = [f"w{i}" for i in range(63)]


def write_tokenizer(path: Path) -> None:
    """A 64-entry word-level tokenizer (w0..w62 + <|endoftext|> = 63), fast to load."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(WORDS)} | {"<|endoftext|>": 63}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path))


def make_dataset_dir(root: Path, n_train: int = 20_000, n_val: int = 4_000, **sidecar) -> Path:
    """A tiny gpt2-tui dataset (vocab 64, random ids) with write_tokenizer's tokenizer."""
    sidecar.setdefault("tokenizer", "tokenizer.json")
    sidecar.setdefault("eot_id", 63)
    write_gpt2tui(root, random_tokens(n_train, 64, 1), random_tokens(n_val, 64, 2), 64, **sidecar)
    if sidecar["tokenizer"] == "tokenizer.json":
        write_tokenizer(root / "tokenizer.json")
    return root


TRAIN_FAST = ["--preset", "micro", "--device", "cpu", "--max-steps", "2", "--eval-batches", "1"]


@dataclass
class Work:
    dir: Path  # the cwd of the command
    cache: Path  # GPT2_TUI_CACHE

    def run(self, argv: list[str], timeout: float = 60, **kw) -> Result:
        return run_cli(argv, self.dir, self.cache, timeout=timeout, **kw)

    def state(self, *extra: Path) -> dict:
        return tree_state(self.dir, self.cache, *extra)


def make_work(base: Path, good_run: Path | None = None) -> Work:
    """cwd with: ds/ (tiny gpt2-tui dataset + tokenizer), text/*.txt (10 documents), notes.txt, and good/ (a
    real 2-step micro run on ds, when given); an empty cache dir beside it."""
    d, cache = base / "work", base / "cache"
    d.mkdir(parents=True)
    cache.mkdir()
    make_dataset_dir(d / "ds")
    (d / "text").mkdir()
    for i in range(10):
        line = f"document {i}: the quick brown fox jumps over the lazy dog. " * 30
        (d / "text" / f"{i}.txt").write_text((line + "\n") * 5)
    (d / "notes.txt").write_text("my notes\n")
    if good_run is not None:
        shutil.copytree(good_run, d / "good", symlinks=True)
    return Work(d, cache)


def train_good_run(base: Path) -> Path:
    """A real run: `gpt2-tui train --preset micro --data ds --out good --max-steps 2` (with a tokenizer)."""
    w = make_work(base)
    res = w.run(["train", *TRAIN_FAST, "--data", "ds", "--out", "good"], timeout=120)
    assert res.rc == 0, res.summary()
    return w.dir / "good"



# ----------------------------------------------------------------------------- a busy machine

BURNERS_PER_CPU = 1  # beside a CPU run's own threads (one a CPU): each gets about half a CPU


def busy_machine(per_cpu: int = BURNERS_PER_CPU) -> Any:
    """A context: `per_cpu` busy-looping Python processes per CPU this process may use (a
    machine busy on purpose, issue 39), each killed by its own id and reaped after the block."""
    import contextlib
    import time

    @contextlib.contextmanager
    def burning() -> Any:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(per_cpu * cpus)]
        try:
            time.sleep(0.5)  # running before the timing starts
            yield procs
        finally:
            for p in procs:
                p.kill()
            for p in procs:
                p.wait()

    return burning()


# ----------------------------------------------------------------------------- tables read from the config

# A numeric recipe switch's value when the tables turn it on (a bool flips, a choice takes its other
# value): the tables' sequences are 16-64 tokens, so a window of 5 bands them.
SWITCH_VALUES: dict[str, Any] = {"model.logit_softcap": 30.0, "model.attn_window": 5}


def model_switches(model_config: Any = None) -> dict[str, Any]:
    """{"model.X": its value turned on} for every recipe switch `model_config` (ModelConfig unless
    given) declares (form section Recipe) that the switch matrix does not refuse on CPU: the tests'
    tables of switches, read from the config, so a new switch is in every table without an edit (a
    numeric one fails here until SWITCH_VALUES gives it a value)."""
    import typing

    from engine import switch_matrix
    from engine.config import RECIPE, ModelConfig

    out: dict[str, Any] = {}
    for name, info in (model_config or ModelConfig).model_fields.items():
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        if extra.get("form") != RECIPE:
            continue
        dotted, ann = f"model.{name}", info.annotation
        if ann is bool:
            value: Any = not info.default
        elif typing.get_origin(ann) is typing.Literal:
            value = next(c for c in typing.get_args(ann) if c != info.default)
        else:
            assert dotted in SWITCH_VALUES, f"{dotted}: a new numeric recipe switch; give it a value in SWITCH_VALUES"
            value = SWITCH_VALUES[dotted]
        if not switch_matrix.refusals({dotted: value}, switch_matrix.CPU):
            out[dotted] = value
    return out


def accepts(dotted: str, value: Any) -> bool:
    """Whether the setting `dotted` takes `value` as it is (strict: no coercion)."""
    from pydantic import TypeAdapter, ValidationError

    from engine.config import RunConfig

    section, name = dotted.split(".")
    info = RunConfig.model_fields[section].annotation.model_fields[name]  # type: ignore[union-attr]
    try:
        TypeAdapter(info.annotation).validate_python(value, strict=True)
    except ValidationError:
        return False
    return True


# three small shapes that differ in every dimension the estimator's formulas use (heads, width, layers
# even and odd, vocab padding, bias, T vs B): tests/config's memory tests
MEMORY_SHAPES: dict[str, dict[str, Any]] = {
    "s1": {"model.n_layer": 2, "model.n_head": 2, "model.n_embd": 32, "model.block_size": 32,
           "model.vocab_size": 100, "train.batch_size": 3},
    "s2": {"model.n_layer": 3, "model.n_head": 4, "model.n_embd": 64, "model.block_size": 64,
           "model.vocab_size": 300, "model.bias": False, "train.batch_size": 2},
    "s3": {"model.n_layer": 1, "model.n_head": 3, "model.n_embd": 48, "model.block_size": 48,
           "model.vocab_size": 64, "model.pad_vocab": False, "train.batch_size": 4, "train.block_size": 40},
}  # fmt: skip


def recorded_state():
    """A dashboard's RunState fed a loss falling from ~10 to ~3 (under one decade), a warmup lr
    6e-5..6e-4, and a slow first step then 0.1 s steps: the chart shapes once found broken."""
    import math

    from engine import events as ev
    from tui.models.runstate import RunState

    s = RunState()
    cfg = {"train": {"max_steps": 100, "batch_size": 1, "grad_accum": 1}, "optim": {"grad_clip": 1.0}}
    s.feed(ev.RunStarted(config=cfg, n_params=1, device="cpu", device_name="CPU", precision="fp32", flops_per_token=1))
    for i in range(1, 60):
        s.feed(ev.Step(step=i, loss=9.0 * math.exp(-i / 40) + 1, lr=6e-4 * min(1.0, i / 10), grad_norm=0.5,
                       step_time_s=1.0 if i < 3 else 0.1, tokens_per_s=1000.0, mfu=None, mem_bytes=None,
                       tokens=100 * i))  # fmt: skip
    return s


# ----------------------------------------------------------------------------- the table of trained runs

# Named runs trained once per pytest session (on first use) by the real command line, in process,
# on the table's own dataset (tiny_dataset's tokens: vocab 64, random ids, seeds 1 and 2): the
# `gpt2-tui train` flags after MICRO. A test that only needs a finished run takes a copy
# (`trained_runs.copy(name, dest)`, the fixture in conftest) instead of training its own.
TRAINED_RUNS: dict[str, list[str]] = {
    "micro-2": ["--max-steps", "2"],  # two steps, a final checkpoint, one eval
    "micro-3": ["--max-steps", "3"],
    "micro-30": ["--max-steps", "30", "--ckpt-interval", "10", "--keep-last", "5"],  # checkpoints 10, 20, 30
    "muon-wsd": ["--max-steps", "6", "--optimizer", "muon", "--schedule", "wsd", "--ckpt-interval", "3"],
}


class TrainedRuns:
    """The table of trained runs (TRAINED_RUNS), trained lazily into `root`; every test gets its own
    copy, so what one test plants or resumes never reaches another."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "data"
        self._lock = threading.Lock()

    def original(self, name: str) -> Path:
        """The table's own run `name`, trained the first time it is asked for."""
        run = self.root / name
        with self._lock:
            if not run.exists():
                from gpt2_tui import main

                if not self.data.exists():
                    write_gpt2tui(self.data, random_tokens(20_000, 64, 1), random_tokens(4_000, 64, 2), 64)
                code = main(["train", *MICRO, "--data", str(self.data), "--out", str(run), *TRAINED_RUNS[name]])
                assert code == 0, f"the table's run {name} did not train (exit {code})"
        return run

    def copy(self, name: str, dest: Path) -> Path:
        """A copy of run `name` at `dest` (links kept as links), the test's own to change."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(self.original(name), dest, symlinks=True)
        return dest
