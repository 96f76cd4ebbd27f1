"""Live toggles: change a running run's speed switches at a step boundary, in the same run.

Any UI asks the same way, whether the run is the app's own thread, a detached process or a
torchrun job: it writes `toggle.json` (the new switches) into the run directory. At the next
step boundary rank 0 takes the file and every rank learns it (`distributed.agree`); the
trainer checks the new set with the launch's own rules (config, device, memory budget, the
same tokens per optimizer step) and either trains on with a warning saying why it refused,
or saves and returns "toggle". `engine.start.run_live` then continues the run from that
checkpoint with the new switches, as a resume would: same weights, optimizer, data position
and RNG, a new segment in events.jsonl (engine/segments.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine.config import RunConfig, overlay
from engine.errors import UserError
from engine.segments import SWITCHES

REQUEST = "toggle.json"


def request(run_dir: Path, overrides: dict[str, Any]) -> None:
    """Ask the run writing `run_dir` to switch to `overrides` ({dotted switch: value})."""
    from engine.checkpoint import atomic_write_bytes

    unknown = sorted(set(overrides) - set(SWITCHES))
    if unknown:
        raise UserError(f"{', '.join(unknown)} cannot change on a live run; the switches that can: {', '.join(SWITCHES)}")
    atomic_write_bytes(Path(run_dir) / REQUEST, json.dumps(overrides).encode())


def take(run_dir: Path) -> dict[str, Any] | None:
    """The pending request, removed from the run directory; a malformed one is an empty request
    (which `check` refuses in words) rather than an error that would stop the run."""
    path = Path(run_dir) / REQUEST
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    path.unlink(missing_ok=True)
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def check(config: RunConfig, overrides: dict[str, Any]) -> RunConfig:
    """The run's config with the toggled switches, checked as a launch would be; UserError if not."""
    from engine import device, memory

    if not overrides:
        raise UserError("the toggle request was empty or unreadable")
    unknown = sorted(set(overrides) - set(SWITCHES))
    if unknown:
        raise UserError(f"{', '.join(unknown)} cannot change on a live run")
    new = overlay(config.model_dump(mode="json", exclude_none=True), overrides)
    if new.tokens_per_step != config.tokens_per_step:
        t = config.train
        raise UserError(
            f"a live toggle keeps the tokens per optimizer step ({t.batch_size} x {t.grad_accum} micro-batches); "
            "change the micro-batch and grad-accum together so their product stays"
        )
    device.check(new.speed.device, new.speed.precision, new.speed.compile)
    memory.check_fits(new, force=False)
    return new
