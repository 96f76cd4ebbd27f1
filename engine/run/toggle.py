"""Live toggles: change a running run's speed switches at a step boundary, in the same run.

Any UI asks the same way, whether the run is the app's own thread, a detached process or a
torchrun job: a "toggle" request (engine/run/requests.py) with the new switches. At the next
step boundary rank 0 takes it and every rank learns it (`distributed.agree`); the
trainer checks the new set with the launch's own rules (config, device, memory budget, the
same tokens per optimizer step) and either trains on with a warning saying why it refused,
or saves and ends the segment for a toggle. The run's owner (engine/run/owner.py) continues it from that
checkpoint with the new switches, as a resume would: same weights, optimizer, data position
and RNG, a new segment in events.jsonl (engine/run/segments.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.config import RunConfig, overlay
from engine.run.preflight import Verdict, preflight
from engine.run.requests import Request, post
from engine.errors import UserError
from engine.text import short, value_text
from engine.run.segments import SWITCHES, switches


def ask(overrides: dict[str, Any]) -> Request:
    """The toggle request for `overrides` ({dotted switch: value}); UserError naming what no
    live run may change."""
    unknown = sorted(set(overrides) - set(SWITCHES))
    if unknown:
        raise UserError(f"{', '.join(unknown)} cannot change on a live run; the switches that can: {', '.join(SWITCHES)}")
    return Request("toggle", switches=dict(overrides))


def request(run_dir: Path, overrides: dict[str, Any]) -> Request:
    """Ask the run writing `run_dir` for these switches through its mailbox (engine/run/requests.py);
    the request, whose id its acknowledgement will carry."""
    asked = ask(overrides)
    post(run_dir, asked)
    return asked


def effective(config: RunConfig) -> dict[str, Any]:
    """The speed switches as they run on the run's device: `auto` precision read as what it resolves
    to there (engine.device.precision), so a toggle is judged by what it changes, not by its words."""
    from engine import device

    out = switches(config)
    out["speed.precision"] = device.precision(str(out["speed.precision"]), device.kind(config.speed.device))
    return out


def already_on(config: RunConfig, overrides: dict[str, Any]) -> str | None:
    """Why a toggle asks for nothing new, or None: every switch it names already runs as it asks
    in `config` (the run's switches now, after any toggle accepted before it), compared as they
    resolve (`effective`: precision auto is fp32 on a CPU). The run drops such a request with
    this reason and starts no segment; the CLI refuses to ask."""
    if not overrides or set(overrides) - set(SWITCHES):
        return None  # empty or unknown: check() words that refusal
    try:
        asked = overlay(config.model_dump(mode="json", exclude_none=True), overrides)
    except UserError:
        return None  # an invalid value: check() refuses it
    now = effective(asked)
    if now != effective(config):
        return None
    return "already on: the run trains with " + ", ".join(f"{short(n)} {value_text(now[n])}" for n in overrides)


def check(config: RunConfig, overrides: dict[str, Any], held: int | None = None) -> RunConfig:
    """The run's config with the toggled switches, checked as a launch would be; UserError if not.
    `held`: the memory the running segment holds (device.held_bytes() in the run's process,
    the default), which the new segment takes over: the memory budget is free + held."""
    return judge(config, overrides, held).raise_first()


def judge(config: RunConfig, overrides: dict[str, Any], held: int | None = None, caps: Any = None) -> Verdict:
    """The verdict on the toggled set: what a live toggle keeps (the tokens per optimizer step,
    the model's shapes), then the launch's own preflight (device, memory against free + held,
    warnings) on the run's data as bound. `caps` (the Switches dialog): refusals at each field.
    UserError for a request that names no switch, or a value no config takes."""
    from engine import device

    if not overrides:
        raise UserError("the toggle request was empty or unreadable")
    unknown = sorted(set(overrides) - set(SWITCHES))
    if unknown:
        raise UserError(f"{', '.join(unknown)} cannot change on a live run")
    new = overlay(config.model_dump(mode="json", exclude_none=True), overrides)
    verdict = preflight(new, dataset=False, caps=caps, explicit=overrides, resume=True,
                        held=device.held_bytes() if held is None else held)  # fmt: skip
    kept = _kept(config, new)
    if kept is not None:
        verdict.general.insert(0, kept)
        verdict.found.insert(0, kept)
        verdict.config = None
    return verdict


def _kept(config: RunConfig, new: RunConfig) -> UserError | None:
    """What a live toggle may not change: the tokens per optimizer step, the model's shapes."""
    if new.tokens_per_step != config.tokens_per_step:
        t = config.train
        return UserError(
            f"a live toggle keeps the tokens per optimizer step ({t.batch_size} x {t.grad_accum} micro-batches); "
            "change the micro-batch and grad-accum together so their product stays"
        )
    changed_shape = _shape_change(config, new)
    if changed_shape:
        v0, v1 = config.model.padded_vocab_size, new.model.padded_vocab_size
        rows = f" (padded vocab {v0} -> {v1} rows)" if v0 != v1 else ""
        return UserError(
            f"a live toggle keeps the model's shapes, and this one changes {changed_shape}{rows}; "
            "the run's checkpoints cannot load into another shape: start a new run with that setting"
        )
    return None


def _shape_change(old: RunConfig, new: RunConfig) -> str | None:
    """The first parameter whose shape differs between the two configs' models (built on the
    meta device: no memory), or None: the one rule for what a hand-over can carry."""
    import torch

    from engine.train.model import GPT

    if old.model == new.model:
        return None
    with torch.device("meta"):
        before = {k: tuple(v.shape) for k, v in GPT(old.model).state_dict().items()}
        after = {k: tuple(v.shape) for k, v in GPT(new.model).state_dict().items()}
    for name in sorted({*before, *after}):
        if before.get(name) != after.get(name):
            return f"{name} {before.get(name)} -> {after.get(name)}"
    return None
