"""One timed run in a fresh Python process, for compile measurements that must start cold.

Triton and inductor pin their cache directories at a process's first compile, and a process
keeps what it has loaded; so a cold (or a warm-from-disk) measurement in a process that has
compiled before is neither. `time_fresh` runs common.time_config in a child process
(`python -m bench.fresh`) with torch.compile's caches in a given directory, relays its step
events to `on_step` as they come, forwards a stop (SIGTERM: the child stops at its next step
boundary), and returns its Timing. With `artifacts_from`, the child first hot-loads the
compile artifacts that run directory holds (engine.train.compiling), as a resume would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from engine import child
from engine import console
from engine import events as ev
from engine.config import RunConfig
from engine.run.requests import Control
from engine.dataset import Dataset

from bench.common import CacheMode, FirstStep, Timing, time_config

_STEP, _TIMING = "@@step ", "@@timing "


def time_fresh(
    config: RunConfig, run_dir: Path, cache_dir: Path, control: Control | None = None,
    on_step: Callable[[ev.Step], None] | None = None, artifacts_from: Path | None = None,
) -> Timing:  # fmt: skip
    """common.time_config(config) in a new process whose compile caches live in cache_dir."""
    job = {"config": config.model_dump(mode="json"), "run_dir": str(run_dir), "cache": str(cache_dir),
           "artifacts_from": str(artifacts_from) if artifacts_from else None}  # fmt: skip
    proc = child.popen([sys.executable, "-m", "bench.fresh", json.dumps(job)], stdout=subprocess.PIPE, text=True,
                       env={**os.environ, "PYTHONUNBUFFERED": "1"})  # its own group, killed with us (engine.child)
    done = threading.Event()

    def forward_stop() -> None:
        while not done.wait(0.2):
            if control is not None and control.stop_requested:
                proc.send_signal(signal.SIGTERM)
                return

    threading.Thread(target=forward_stop, daemon=True).start()
    timing = None
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(_STEP) and on_step is not None:
                on_step(ev.Step.model_validate_json(line[len(_STEP) :]))
            elif line.startswith(_TIMING):
                timing = Timing.model_validate_json(line[len(_TIMING) :])
            else:
                console.out.line(line.rstrip("\n"))
        code = proc.wait()
    finally:
        done.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if timing is None:
        raise RuntimeError(f"the measuring process ended (exit {code}) before its first step")
    return timing


def time_compile_cache(
    mode: CacheMode | None,
    config: RunConfig,
    dataset: Dataset,
    run_dir: Path,
    control: Control | None = None,
    on_step: Callable[[ev.Step], None] | None = None,
) -> tuple[Timing, list[FirstStep]]:
    """time_config, with torch.compile's caches in a fresh directory of their own, each run in
    a fresh process (a process that compiled before is never cold again: bench.fresh):

        cold  the run compiles from nothing
        warm  a one-step run of the same config fills the directory, then the run reads it
        both  the run compiles from nothing, then a one-step run reads what it left
        all   as both, then a one-step run with an empty directory and the first run's
              compile artifacts (what a resume on a new machine has)

    and each run's first step, cold first. No mode, or compile off: time_config as it is
    (the user's compile cache, as any run)."""
    if mode is None or not config.speed.compile:
        return time_config(config, dataset, run_dir, control, on_step), []
    one = config.model_copy(update={"train": config.train.model_copy(update={"max_steps": 1, "log_interval": 1})})
    plan = {"cold": [(config, "cold")], "warm": [(one, "cold"), (config, "warm")],
            "both": [(config, "cold"), (one, "warm")],
            "all": [(config, "cold"), (one, "warm"), (one, "artifacts")]}[mode]  # fmt: skip
    firsts, timing = [], None
    with tempfile.TemporaryDirectory(prefix="gpt2-tui-compile-cache-") as tmp:
        disk, empty = Path(tmp) / "disk", Path(tmp) / "empty"
        for cfg, state in plan:
            cache = empty if state == "artifacts" else disk
            if cfg is config:  # the timed run
                t = timing = time_fresh(config, run_dir, cache, control, on_step)
            else:
                t = time_fresh(one, run_dir.with_name(f"{run_dir.name}-{state}-1step"), cache,
                               artifacts_from=run_dir if state == "artifacts" else None)  # fmt: skip
            if not t.step_times_s:  # stopped before its first step
                break
            files = sum(1 for p in cache.rglob("*") if p.is_file())
            firsts.append(FirstStep(cache=state, steps=cfg.train.max_steps, first_step_s=t.step_times_s[0],
                                    startup_s=t.startup_s, cache_files=files, compile_s=t.compile_s))  # fmt: skip
    assert timing is not None
    return timing, firsts


def _child(job: dict) -> int:
    from engine.train import compile_cache, compiling
    from engine import device as devices
    from engine.run.preflight import prepared

    config, dataset = prepared(RunConfig.model_validate(job["config"]), memory=False)
    control = Control()
    signal.signal(signal.SIGTERM, lambda *_: control.stop())
    with compile_cache.redirect(Path(job["cache"])):
        if job["artifacts_from"]:
            label = devices.describe(devices.pick(config.speed.device))
            loaded, note = compiling.load_artifacts(Path(job["artifacts_from"]), label)
            console.out.line(note or f"loaded the compile artifacts of {job['artifacts_from']}" if loaded else
                             f"no compile artifacts in {job['artifacts_from']}", flush=True)  # fmt: skip
        timing = time_config(config, dataset, Path(job["run_dir"]), control,
                             lambda e: console.out.line(_STEP + e.model_dump_json(), flush=True))  # fmt: skip
    console.out.line(_TIMING + timing.model_dump_json(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_child(json.loads(sys.argv[1])))
