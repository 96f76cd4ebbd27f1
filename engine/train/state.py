"""What a checkpoint carries besides weights and optimizer: where the segment stands
(`Progress`), the RNG streams, checked on the way back in, and the model-shape check that
turns load_state_dict's page into one line."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.errors import UserError


@dataclass
class Progress:
    """Where a segment stands, shared by its loop and its components and saved in each
    checkpoint: the step, the tokens trained, the best and the last val loss, and the time
    the steps took so far (resumes included: time to loss sums it)."""

    step: int = 0
    tokens: int = 0
    best_val_loss: float | None = None
    last_eval: tuple[int, float] | None = None  # (step, val loss) of the latest eval
    train_time_s: float = 0.0
    timed_to: int = 0  # the step train_time_s counts to

    def val_loss_now(self) -> float | None:
        """The val loss of this very step, if it was evaluated."""
        return self.last_eval[1] if self.last_eval and self.last_eval[0] == self.step else None


def rng_state(device: torch.device) -> dict[str, Any]:
    """Host RNGs, and the run device's CUDA generator only: each rank saves its own GPU's,
    never every visible GPU's (a resume may see fewer)."""
    np_state = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": json.dumps([np_state[0], np_state[1].tolist(), *np_state[2:]]),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else [],  # a list: older readers' type
    }


def set_rng_state(state: dict[str, Any], device: torch.device) -> str | None:
    """Restore what `rng_state` saved; the CUDA state only when this run trains on CUDA.
    An older checkpoint holds a list (one state per GPU visible then): this rank's device's
    entry is taken where it exists. Returns a warning when a CUDA state could not apply."""
    random.setstate(state["python"])
    kind, keys, *rest = json.loads(state["numpy"])
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if device.type != "cuda" or (isinstance(cuda, list) and not cuda):
        return None
    if isinstance(cuda, list):  # get_rng_state_all() of an older checkpoint
        index = device.index or 0
        if index >= len(cuda):
            return (f"the checkpoint holds no CUDA RNG state for GPU {index} (it was saved with {len(cuda)}); "
                    "that generator starts from the seed")  # fmt: skip
        cuda = cuda[index]
    torch.cuda.set_rng_state(cuda, device)
    return None


def check_shapes(model: torch.nn.Module, saved: dict[str, torch.Tensor], path: Path) -> None:
    """One clear line instead of load_state_dict's page when the model shape differs."""
    own = model.state_dict()
    for name, tensor in saved.items():
        if name not in own:
            raise UserError(
                f"checkpoint {path} has another model shape (unexpected {name}); "
                "resume with the run's own config"
            )
        if own[name].shape != tensor.shape:
            raise UserError(
                f"checkpoint {path} has another model shape ({name}: {tuple(tensor.shape)} saved, "
                f"{tuple(own[name].shape)} configured); resume with the run's own config"
            )
    missing = [n for n in own if n not in saved]
    if missing:
        raise UserError(
            f"checkpoint {path} has another model shape (missing {missing[0]}); "
            "resume with the run's own config"
        )
