"""How a UI launches a run: on a thread of this process, or as the headless CLI in a process
of its own (a new run, or a resume), whose console goes to the run's console.log.

The app keeps a handle on what these return (tui/session.py); torchrun's launcher, for
`--nproc`, is engine/run/torchrun.py. A detached process runs in its own session, so the run
survives the terminal that launched it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine import events as ev
from engine import child, files, rundir
from engine.config import RunConfig
from engine.errors import UserError
from engine.run.requests import Control


def headless_command(config_file: Path, run_dir: Path, nproc: int = 1) -> list[str]:
    """The headless CLI; with nproc > 1 it relaunches itself under torchrun (one rank per GPU)."""
    cmd = [sys.executable, "-m", "engine.cli", "train", "--headless", "--config", str(config_file), "--out", str(run_dir)]
    return cmd + (["--nproc", str(nproc)] if nproc > 1 else [])


def train_in_thread(
    config: RunConfig, run_dir: Path, control: Control, on_event: Callable[[Any], None],
    threads: int | None = None, building: Callable[[str | None, float | None], None] | None = None,
) -> threading.Thread:  # fmt: skip
    """Set-up, compile and training on one daemon thread (torch.compile is not thread-safe;
    a daemon thread never holds up the app's exit). Bad input found at set-up is one
    run_failed event; any other failure has already emitted its own. `threads`: torch
    intra-op threads on that thread (its OpenMP team is its own). `building(what, fraction)`
    is told each phase of the first build of the default dataset (seconds) and how far it
    is, then `building(None, None)` once it is ready, so a UI can show it."""
    from engine.run.owner import start

    rundir.check_new(run_dir)

    def work() -> None:
        try:
            if threads:
                import torch

                torch.set_num_threads(threads)
            if config.data.path is None and building is not None:
                from engine.prep.prepare import default_dataset

                building("looking for the default dataset", None)
                try:
                    default_dataset(progress=building)
                finally:
                    building(None, None)
            cfg = config.model_copy(update={"out_dir": str(run_dir)})
            start(cfg, run_dir, sinks=[ev.CallbackSink(on_event)], control=control).run()  # live toggles continue it
        except UserError as err:  # bad input found at set-up: one line, nothing written
            on_event(ev.RunFailed(step=None, error=str(err)))
        except BaseException:  # the run has already emitted run_failed
            pass

    thread = threading.Thread(target=work, name="gpt2-tui-trainer", daemon=True)
    thread.start()
    return thread


def spawn_new(config: RunConfig, run_dir: Path, nproc: int = 1) -> tuple[subprocess.Popen, Path, int]:
    """The headless CLI on this config, in its own session: (the process, the config file it
    reads (the caller removes it once the run started), where its console starts in console.log)."""
    rundir.check_new(run_dir)
    files.make_dir(run_dir)
    fd, name = tempfile.mkstemp(prefix="gpt2-tui-launch-", suffix=".toml")
    os.close(fd)  # a name of our own in the temp directory; the config goes in atomically
    files.write_text(Path(name), config.model_copy(update={"out_dir": str(run_dir)}).to_toml())
    proc, _, pos = _spawn(headless_command(Path(name), run_dir, nproc), run_dir, Path(name))
    return proc, Path(name), pos


def spawn_resume(run_dir: Path, max_steps: int) -> tuple[subprocess.Popen, int]:
    """The headless CLI's --resume of a run that is not running, to `max_steps`, in its own session."""
    cmd = [sys.executable, "-m", "engine.cli", "train", "--headless", "--resume", str(run_dir), "--max-steps", str(max_steps)]
    proc, _, pos = _spawn(cmd, run_dir, None)
    return proc, pos


def _spawn(cmd: list[str], run_dir: Path, config_file: Path | None) -> tuple[subprocess.Popen, Path | None, int]:
    """`cmd` in a session of its own, its output appended to the run's console.log."""
    with files.open_append(run_dir / rundir.LAUNCH_LOG) as log:
        pos = log.tell()
        # detached: the run outlives the app that started it (engine.child: no death signal)
        proc = child.popen(cmd, detached=True, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                           cwd=os.getcwd())  # fmt: skip
    return proc, config_file, pos
