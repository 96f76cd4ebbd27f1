"""One timed run in a fresh Python process, for compile measurements that must start cold.

Triton and inductor pin their cache directories at a process's first compile, and a process
keeps what it has loaded; so a cold (or a warm-from-disk) measurement in a process that has
compiled before is neither. `time_fresh` runs common.time_config in a child process
(`python -m bench.fresh`) with torch.compile's caches in a given directory, relays its step
events to `on_step` as they come, forwards a stop (SIGTERM: the child stops at its next step
boundary), and returns its Timing. With `artifacts_from`, the child first hot-loads the
compile artifacts that run directory holds (engine.compiling), as a resume would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from engine import events as ev
from engine.config import RunConfig
from engine.control import Control

if TYPE_CHECKING:
    from bench.common import Timing

_STEP, _TIMING = "@@step ", "@@timing "


def time_fresh(
    config: RunConfig, run_dir: Path, cache_dir: Path, control: Control | None = None,
    on_step: Callable[[ev.Step], None] | None = None, artifacts_from: Path | None = None,
) -> Timing:  # fmt: skip
    """common.time_config(config) in a new process whose compile caches live in cache_dir."""
    from bench.common import Timing

    job = {"config": config.model_dump(mode="json"), "run_dir": str(run_dir), "cache": str(cache_dir),
           "artifacts_from": str(artifacts_from) if artifacts_from else None}  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.fresh", json.dumps(job)], stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
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
                sys.stdout.write(line)
        code = proc.wait()
    finally:
        done.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if timing is None:
        raise RuntimeError(f"the measuring process ended (exit {code}) before its first step")
    return timing


def _child(job: dict) -> int:
    from bench.common import time_config
    from engine import compile_cache, compiling
    from engine import device as devices
    from engine.start import open_data

    config, dataset = open_data(RunConfig.model_validate(job["config"]))
    control = Control()
    signal.signal(signal.SIGTERM, lambda *_: control.stop())
    with compile_cache.redirect(Path(job["cache"])):
        if job["artifacts_from"]:
            label = devices.describe(devices.pick(config.speed.device))
            loaded, note = compiling.load_artifacts(Path(job["artifacts_from"]), label)
            print(note or f"loaded the compile artifacts of {job['artifacts_from']}" if loaded else
                  f"no compile artifacts in {job['artifacts_from']}", flush=True)  # fmt: skip
        timing = time_config(config, dataset, Path(job["run_dir"]), control,
                             lambda e: print(_STEP + e.model_dump_json(), flush=True))  # fmt: skip
    print(_TIMING + timing.model_dump_json(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_child(json.loads(sys.argv[1])))
