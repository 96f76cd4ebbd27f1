"""`gpt2-tui train --nproc N`: the same run on N processes of this machine, via torchrun.

Everything the workers would reject (flags, config, dataset, run directory, GPU count)
is checked here first, so bad input is still one line and exit status 2 with nothing
written. Then PyTorch's own elastic launcher (what `torchrun --standalone` runs) starts
N copies of `python -m engine.cli train ...`, each told its rank by the environment.
It watches them: when one dies, it stops the others and we print one line naming the
rank and the cause. Across machines use torchrun itself (see docs/distributed.md).
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path
from typing import Any

import torch

from engine import device
from engine.train import distributed
from engine import console, rundir
from engine.text import path_text
from engine.config import RunConfig
from engine.errors import UserError

SHUTDOWN_GRACE_S = 30  # after a stop signal, workers get this long to checkpoint before SIGKILL


def requested(nproc: int | None) -> bool:
    """--nproc N asks for the launcher (N = 1 outside torchrun is a plain run)."""
    return nproc is not None and (nproc != 1 or distributed.under_torchrun())


def _strip_nproc(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--nproc":
            skip = True
        elif not a.startswith("--nproc="):
            out.append(a)
    return out


def _check(n: int, config: RunConfig, force: bool) -> None:
    """Everything a worker would refuse, refused here (the config and run directory are
    already checked by engine.run.preflight's new_config / resumed_config)."""
    from engine.run.preflight import open_data

    if distributed.under_torchrun():
        raise UserError("--nproc starts torchrun itself; under torchrun leave it out")
    if n < 1:
        raise UserError(f"--nproc {n} is not a process count; pass --nproc 2 or more (1 = no launcher)")
    if config.speed.device == "mps":
        raise UserError("multi-process training runs on CUDA (NCCL) or CPU (gloo), not MPS; use --device cuda or cpu")
    target = device.pick(config.speed.device)  # a GPU asked for and missing: one line
    gpus = torch.cuda.device_count() if target.type == "cuda" else 0
    if gpus and n > gpus:
        raise UserError(f"--nproc {n} asks for more GPUs than the {gpus} visible; pass --nproc {gpus} or less")
    config, _ = open_data(config)  # the dataset's problems, and the default dataset built once, not N times
    _check_memory(config, n, force)


def _check_memory(config: Any, n: int, force: bool) -> None:
    """The estimator's per-GPU verdict for N ranks, as each worker will judge it."""
    from engine.train import memory

    saved = os.environ.get("WORLD_SIZE")
    os.environ["WORLD_SIZE"] = str(n)  # check_fits reads the world size torchrun will set
    try:
        memory.check_fits(config, force)
    finally:
        if saved is None:
            del os.environ["WORLD_SIZE"]
        else:
            os.environ["WORLD_SIZE"] = saved


def command(argv: list[str], run_dir: Path, name_dir: bool) -> list[str]:
    """The worker command line: the user's own, minus --nproc, plus the run directory."""
    rest = _strip_nproc(argv)
    if name_dir:
        rest += ["--out", str(run_dir)]  # every rank must agree on one clock-named directory
    return ["-m", "engine.cli", *rest]


def run(n: int, config: RunConfig, run_dir: Path, resume: bool, force: bool, argv: list[str], out_given: bool) -> int:
    """Check, then start N workers running `argv` (the user's train command) under torchrun."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    _check(n, config, force)
    if "OMP_NUM_THREADS" not in os.environ:  # as torchrun does: N processes must not each take every core
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // n))
    launch = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=n, run_id=str(uuid.uuid4()),
        rdzv_backend="c10d", rdzv_endpoint="localhost:0",  # torchrun --standalone
        max_restarts=0, monitor_interval=0.1, shutdown_timeout=SHUTDOWN_GRACE_S,
    )  # fmt: skip
    # the launcher is the run's one writer for its ranks: it holds the lock, and its descendants
    # (the ranks, under torchrun) are let in by rundir's ancestor rule
    rundir.claim_writer(run_dir) if resume else rundir.claim_new(run_dir)
    console.err.line(f"launching {n} processes (torch.distributed.run): {path_text(run_dir)}", flush=True)
    try:
        elastic_launch(launch, sys.executable)(*command(argv, run_dir, not resume and not out_given))
    except ChildFailedError as failure:
        console.err.line(f"error: {failure_line(failure.failures, run_dir)}")
        return 1
    except SignalException as stop:
        console.err.line(f"stopped by {stop.sigval.name}; {_latest(run_dir)}")
        return 128 + int(stop.sigval)
    finally:
        rundir.release_writer(run_dir)
    return 0


def _latest(run_dir: Path) -> str:
    from engine.train.checkpoint import CheckpointDir

    latest = CheckpointDir(run_dir / rundir.CHECKPOINTS).latest()
    return f"last checkpoint: {latest}" if latest else "no checkpoint was written"


def failure_line(failures: dict[int, Any], run_dir: Path) -> str:
    """One line from the launcher's failure records: which rank died first, of what."""
    parts = []
    for rank, f in sorted(failures.items(), key=lambda kv: (kv[1].timestamp, kv[1].exitcode >= 0, kv[0])):
        cause = f"killed by {f.signal_name()}" if f.exitcode < 0 else f"exit status {f.exitcode}"
        parts.append(f"rank {rank} (pid {f.pid}) {cause}")
    return (
        f"distributed run failed: {'; '.join(parts)}; the other ranks were stopped; {_latest(run_dir)} "
        f"(continue with --resume {run_dir})"
    )
