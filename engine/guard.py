"""Verdicts on what went wrong in a step: NaN/Inf, a failed checkpoint write, CUDA OOM.

The guard only judges and words the message; the trainer acts (skips the update, saves,
stops). Every case ends in one of two ways: a `warning` event and the run goes on, or a
`warning` event with the details (the TUI shows it as an alert) and a one-line UserError
that stops the run (the CLI prints it and exits 2).
"""

from __future__ import annotations

import gc
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.config import RunConfig
from engine.errors import UserError


class Diverged(UserError):
    """Loss or grad norm stayed NaN/Inf (or the weights went non-finite): stopped on good weights."""


class SaveFailed(UserError):
    """A checkpoint could not be written and train.on_save_error is "stop"."""


class OutOfMemory(UserError):
    """The device ran out of memory in a step: the stop names a micro-batch that fits."""


class StepGuard:
    """Counts consecutive bad steps: a NaN/Inf loss, or a NaN/Inf grad norm without a GradScaler.

    With fp16 the GradScaler skips overflowing steps itself and lowers its scale, as designed;
    such a step counts as bad only when the loss itself is not finite. Checking costs one
    host sync of two scalars per step: the price of never letting a NaN step reach the weights.
    """

    def __init__(self, max_bad_steps: int):
        self.max_bad_steps = max_bad_steps
        self.streak = 0
        self.total = 0
        self.last: tuple[float, float] = (0.0, 0.0)

    def observe(self, loss: torch.Tensor, norm: torch.Tensor, scaled: bool) -> bool:
        """True when this step is bad and its update must be skipped."""
        loss_v, norm_v = torch.stack([loss.detach().float(), norm.detach().float()]).tolist()
        bad = not math.isfinite(loss_v) or (not scaled and not math.isfinite(norm_v))
        self.streak = self.streak + 1 if bad else 0
        self.total += bad
        self.last = (loss_v, norm_v)
        return bad

    @property
    def tripped(self) -> bool:
        return self.streak >= self.max_bad_steps


@dataclass(frozen=True)
class Verdict:
    """What the trainer should do: warn with `message`, and raise `stop` if it is set."""

    message: str
    stop: type[UserError] | None = None


def likely_causes(precision: str, lr: float) -> str:
    causes = [f"LR too high (--lr {lr:g}; try --lr {lr / 3:.2g})", "bad data (check the token files / --data)"]
    fp16 = "fp16 overflow (try --precision bf16 or fp32)"
    causes.insert(0, fp16) if precision == "fp16" else causes.append(fp16)
    return ", ".join(causes)


def bad_step(g: StepGuard, step: int) -> Verdict:
    """A skipped step: warn; after max_bad_steps in a row, the trainer stops on good weights."""
    loss, norm = g.last
    return Verdict(
        f"step {step}: loss {loss}, grad norm {norm}: not finite; the update was skipped "
        f"({g.streak}/{g.max_bad_steps} in a row before the run stops)"
    )


def diverged(g: StepGuard, step: int, saved: Path | None, precision: str, lr: float, run_dir: Path) -> Verdict:
    where = saved or "no checkpoint (none was written before the divergence)"
    return Verdict(
        f"loss or grad norm was NaN/Inf for {g.streak} steps in a row (to step {step}); "
        f"stopped with the last good weights in {where}; likely causes: {likely_causes(precision, lr)}; "
        f"fix it and continue with --resume {run_dir}",
        Diverged,
    )


def nan_weights(step: int, latest: Path | None, precision: str, lr: float, run_dir: Path) -> Verdict:
    """Before any save: NaN/Inf weights are never written as latest or best; the run stops."""
    return Verdict(
        f"the weights hold NaN/Inf at step {step}, so no checkpoint was written; the last good one is "
        f"{latest or 'none'}; likely causes: {likely_causes(precision, lr)}; fix it and continue with --resume {run_dir}",
        Diverged,
    )


def save_failed(err: OSError, step: int, ckpt_dir: Path, policy: str, run_dir: Path) -> Verdict:
    """A checkpoint write failed (disk full, no permission): warn, then go on or stop."""
    why = err.strerror or type(err).__name__
    message = (
        f"checkpoint at step {step} could not be written ({why}: {err.filename or ckpt_dir}); "
        "the previous checkpoints are intact"
    )
    if policy == "stop":
        return Verdict(message + f"; free disk space or fix permissions, then continue with --resume {run_dir}", SaveFailed)
    return Verdict(
        message + "; training goes on and retries at the next checkpoint interval (--on-save-error stop to stop instead)"
    )


def out_of_memory(cfg: RunConfig, device: torch.device, device_label: str, step: int, latest: Path | None) -> tuple[str, str]:
    """(the one-line stop, the estimator's table) after a CUDA OOM: name a micro-batch that fits.

    No checkpoint is written: the step was half done; the last periodic checkpoint stands.
    """
    from engine import memory
    from engine.device import memory_bytes

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    t = cfg.train
    device_bytes = memory_bytes(str(device))
    table = memory.format_table(memory.estimate(cfg), device_bytes)
    fit = memory.suggest_fit(cfg, device_bytes) if device_bytes else None
    if fit is not None and fit.train.batch_size >= t.batch_size:
        # the estimate says it fits: something else holds device memory; still, go smaller
        seqs = t.batch_size * t.grad_accum
        smaller = [b for b in range(t.batch_size - 1, 0, -1) if seqs % b == 0 and b <= t.batch_size // 2]
        fit = memory.with_batch(cfg, smaller[0], seqs // smaller[0]) if smaller else None
        advice = "the estimate fits, so other processes may hold device memory; " + (
            f"try {memory.fix_flags(cfg, fit)} (same tokens per step)" if fit else "free the device or use a smaller model"
        )
    elif fit is not None:
        advice = f"try {memory.fix_flags(cfg, fit)} (same tokens per step; the estimator's largest that fits)"
    elif device_bytes:
        advice = "even --batch-size 1 does not fit: try --grad-checkpointing, --precision bf16, a smaller model or a larger GPU"
    else:
        advice = "device memory unknown: try a smaller --batch-size with a larger --grad-accum"
    kept = f"; the last checkpoint is {latest}" if latest else ""
    message = (
        f"out of memory at step {step + 1} with micro-batch {t.batch_size} x {cfg.seq_len} tokens "
        f"on {device_label}; {advice}{kept}"
    )
    return message, table
