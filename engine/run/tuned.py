"""The tuned file: the speed switches a tune (engine/run/tune.py) chose for one machine, torch
build and model shape, kept in the user's cache (`tuned/` under engine.files.cache_root), and
`--from-tuned`, which starts a new run from them (engine.run.preflight's tuned_rule).

The file is untrusted input like every file of a run: read bounded, never through a link,
validated (only speed switches, only values a config takes, this machine's key), and any
reason it cannot be used is one line; the run then starts with its own switches.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, Field, ValidationError

from engine import events as ev
from engine import files
from engine.config import RunConfig, overlay
from engine.errors import UserError
from engine.run.segments import SWITCHES, changed, switches
from engine.text import change_text, printable

TUNED_DIR = "tuned"  # under the gpt2-tui cache: one file per machine, torch and model shape
CAP = 1 << 20  # a set of switches is a few hundred bytes


class Tuned(BaseModel):
    """What a tune chose for one machine, torch and model shape: what `--from-tuned` starts from."""

    version: Literal[1] = 1
    key: Annotated[dict[str, Any], ev.Plain]  # tuned_key: what the switches were measured for
    switches: Annotated[dict[str, Any], ev.Plain]
    gain: ev.Measure | None = None  # its settled speed over the start's
    date: Annotated[str, Field(max_length=64)] = ""
    run: Annotated[str, Field(max_length=4096)] = ""  # the run directory that measured it


def tuned_key(config: RunConfig) -> dict[str, Any]:
    """What a tuned set holds for: the device (its name), the torch build, the model's shape and
    the tokens per optimizer step, the processes. Another of any of these is measured anew."""
    import os

    import torch

    from engine import device

    kind = device.kind(config.speed.device)
    m = config.model
    return {"device": device.describe(torch.device(kind)), "torch": torch.__version__,
            "world_size": int(os.environ.get("WORLD_SIZE", "1") or 1),
            "shape": [m.n_layer, m.n_head, m.n_embd, m.padded_vocab_size, config.seq_len],
            "tokens_per_step": config.tokens_per_step}  # fmt: skip


def tuned_path(config: RunConfig) -> Path:
    key = json.dumps(tuned_key(config), sort_keys=True)
    name = re.sub(r"[^a-z0-9]+", "-", (config.preset or "run").lower()).strip("-")[:32] or "run"
    return files.cache_root() / TUNED_DIR / f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def save_tuned(config: RunConfig, chosen: dict[str, Any], gain: float | None, run_dir: Path) -> Path | None:
    """The chosen switches for this machine and shape, in the user's cache; None if it cannot be
    written (said by the caller's event: tuned_file is None)."""
    path = tuned_path(config)
    tuned = Tuned(key=tuned_key(config), switches=chosen, gain=gain, run=str(run_dir),
                  date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))  # fmt: skip
    try:
        files.private_dir(path.parent)
        files.atomic_write_bytes(path, tuned.model_dump_json(indent=1).encode())
    except OSError:
        return None
    return path


M = TypeVar("M", bound=BaseModel)


def read_model(path: Path, model: type[M], name: str, what: str, cap: int = CAP) -> tuple[M | None, str | None]:
    """A small JSON file of ours read as `model` by the file rules (bounded, no link followed,
    validated): (it, None); (None, None) when there is none; (None, why) in one printable line,
    naming it `name`, when it cannot be used (`what` it should have been)."""
    try:
        raw = files.read_json(path, cap)
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as err:
        return None, f"{name} could not be read ({printable(str(err))[:200]})"
    try:
        return model.model_validate(raw), None
    except ValidationError as err:
        return None, f"{name} is not {what} ({printable(str(err).splitlines()[0])[:200]})"


def load_tuned(config: RunConfig) -> tuple[Tuned | None, str]:
    """The tuned switches for this config's machine and shape, read by the file rules (bounded,
    no link followed, validated: only speed switches, each a value a config takes); (None, why) if
    there are none to use."""
    path = tuned_path(config)
    tuned, why = read_model(path, Tuned, printable(str(path)), "a tuned set")
    if tuned is None:
        return None, why or "none saved yet for this machine, torch and model shape (`train --tune` saves them)"
    if tuned.key != tuned_key(config):
        return None, f"{printable(str(path))} was tuned for another machine or shape"
    unknown = sorted(set(tuned.switches) - set(SWITCHES))
    if unknown:
        return None, f"{printable(str(path))} names settings that are not speed switches ({printable(', '.join(unknown))[:200]})"
    try:
        overlay(config.model_dump(mode="json", exclude_none=True), tuned.switches)
    except UserError as err:
        return None, f"{printable(str(path))} holds a value no config takes ({printable(str(err))[:200]})"
    return tuned, ""


def from_tuned(config: RunConfig, explicit: dict[str, Any] | None) -> tuple[RunConfig, str]:
    """`speed.from_tuned`: the config with the tuned switches over it (flags the user gave win),
    and the line that says what came from where."""
    tuned, why = load_tuned(config)
    if tuned is None:
        return config, f"--from-tuned: {why}; the run starts with its own switches"
    given = set(explicit or {})
    own = switches(config)
    use = {n: v for n, v in tuned.switches.items() if n not in given and own.get(n) != v}
    if "train.batch_size" in given or "train.grad_accum" in given:  # a geometry is a pair: the user's stands
        use.pop("train.batch_size", None)
        use.pop("train.grad_accum", None)
    if not use:
        return config, f"--from-tuned: the tuned switches of {tuned.date} are the ones this run has"
    new = overlay(config.model_dump(mode="json", exclude_none=True), use)
    new._notes = list(config.notes)
    gain = f", {tuned.gain:.2f}x its start there" if tuned.gain else ""
    return new, f"--from-tuned: {change_text(changed(own, {**own, **use}))} (tuned {tuned.date}{gain})"
