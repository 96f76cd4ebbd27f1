"""Text generation from a run directory or a checkpoint file (CLI `sample`, TUI sample panel)."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import torch

from engine.train import checkpoint as ckpt
from engine import rundir
from engine.text import loss_text
from engine.config import RunConfig, build
from engine.errors import UserError
from engine.train.model import GPT


class Loaded(NamedTuple):
    """A checkpoint's model, config and file, and the step (and val loss) it was saved at."""

    model: GPT
    config: RunConfig
    path: Path
    step: int
    val_loss: float | None  # None when the checkpoint was not saved at an eval


def source_text(loaded: Loaded) -> str:
    """'sampling from runs/x/checkpoints/step_000300.pt (step 300, val loss 4.1234)': which
    weights made the text, since a run directory stands for its latest checkpoint."""
    loss = "" if loaded.val_loss is None else f", val loss {loss_text(loaded.val_loss)}"
    return f"sampling from {loaded.path} (step {loaded.step}{loss})"


def load_model(run_or_file: Path, device: str = "cpu") -> Loaded:
    """The model of a checkpoint (a file, or a run directory's latest), with where it came from."""
    from engine.device import pick

    target = pick(device)  # a device this machine lacks is said as such, not as a corrupt file
    path = ckpt.find(run_or_file)
    state = ckpt.load(path, map_location=target)
    try:
        config = build(state["config"])
    except UserError as err:
        raise UserError(f"{path} holds a config that is not valid ({err}); use another checkpoint") from None
    if config.model.vocab_size is None:
        raise UserError(f"{path} holds a config without its vocab size; use another checkpoint")
    with torch.device("meta"):  # shapes only, no memory: a damaged config must not allocate first
        shapes = {k: v.shape for k, v in GPT(config.model).state_dict().items()}
    saved = {k: v.shape for k, v in state["model"].items()}
    if saved != shapes:
        raise UserError(f"{path}: its weights do not match its own config; the file is damaged")
    model = GPT(config.model)
    try:
        model.load_state_dict(state["model"])
    except (RuntimeError, TypeError, ValueError):
        raise UserError(f"{path}: its weights do not load into its own config; the file is damaged") from None
    val_loss = state.get("val_loss")
    if not isinstance(val_loss, (int, float)) or isinstance(val_loss, bool):
        val_loss = None  # ckpt.load checked the step, not this optional number
    return Loaded(model.to(device).eval(), config, path, state["step"], val_loss)



def find_tokenizer(run_or_file: Path, checkpoint_path: Path) -> Path:
    """The run's own tokenizer.json: beside the run dir's config, or two levels above a checkpoint."""
    for run in (run_or_file, checkpoint_path.parent.parent, checkpoint_path.parent):
        tok = rundir.tokenizer_of(run)
        if tok:
            return tok
    raise UserError(
        f"no tokenizer.json found for {run_or_file} (its data carried none, e.g. nanoGPT or llm.c "
        "files); pass --tokenizer PATH"
    )
