"""What the loop does when a step goes wrong: NaN/Inf, a failed checkpoint write, CUDA OOM.

Kept out of trainer.py so the loop reads as the happy path, with one hook line per case.
Every case ends in one of two ways: a `warning` event and the run goes on, or a
`warning` event with the details (the TUI shows it as an alert) and a one-line UserError
that stops the run (the CLI prints it and exits 2).
"""

from __future__ import annotations

import gc
import math
from typing import TYPE_CHECKING

import torch

from engine import events as ev
from engine.errors import UserError

if TYPE_CHECKING:
    from engine.trainer import Trainer


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


def weights_finite(model: torch.nn.Module) -> bool:
    from engine import distributed  # FSDP2 shards: checked per rank, verdict agreed by all

    return distributed.weights_finite(model)


def _likely_causes(trainer: Trainer) -> str:
    lr = trainer.config.optim.lr
    causes = [f"LR too high (--lr {lr:g}; try --lr {lr / 3:.2g})", "bad data (check the token files / --data)"]
    fp16 = "fp16 overflow (try --precision bf16 or fp32)"
    causes.insert(0, fp16) if trainer.precision == "fp16" else causes.append(fp16)
    return ", ".join(causes)


def after_bad_step(trainer: Trainer) -> None:
    """Warn about a skipped step; after max_bad_steps in a row, stop on the last good weights."""
    g = trainer.guard
    loss, norm = g.last
    trainer.emit(
        ev.Warning_(
            message=f"step {trainer.step}: loss {loss}, grad norm {norm}: not finite; the update was skipped "
            f"({g.streak}/{g.max_bad_steps} in a row before the run stops)"
        )
    )
    if not g.tripped:
        return
    where = _save_last_good(trainer)
    message = (
        f"loss or grad norm was NaN/Inf for {g.streak} steps in a row (to step {trainer.step}); "
        f"stopped with the last good weights in {where}; likely causes: {_likely_causes(trainer)}; "
        f"fix it and continue with --resume {trainer.run_dir}"
    )
    trainer.emit(ev.Warning_(message=message))
    raise Diverged(message)


def _save_last_good(trainer: Trainer) -> str:
    """Bad updates were skipped, so the weights are normally the last good ones: save them.

    If they are not finite after all (a finite but huge step), keep the latest file on disk.
    """
    if weights_finite(trainer.model):
        trainer.save_checkpoint()
        saved = trainer.ckpts.latest()
        if saved is not None and saved.name == f"step_{trainer.step:06d}.pt":
            return str(saved)
    latest = trainer.ckpts.latest()
    return str(latest) if latest else "no checkpoint (none was written before the divergence)"


def check_weights(trainer: Trainer) -> None:
    """Before any save: NaN/Inf weights are never written as latest or best; the run stops."""
    if weights_finite(trainer.model):
        return
    latest = trainer.ckpts.latest()
    message = (
        f"the weights hold NaN/Inf at step {trainer.step}, so no checkpoint was written; the last good one is "
        f"{latest or 'none'}; likely causes: {_likely_causes(trainer)}; fix it and continue with --resume {trainer.run_dir}"
    )
    trainer.emit(ev.Warning_(message=message))
    raise Diverged(message)


def save_failed(trainer: Trainer, err: OSError) -> None:
    """A checkpoint write failed (disk full, no permission): warn, then go on or stop."""
    why = err.strerror or type(err).__name__
    where = err.filename or trainer.ckpts.path
    message = f"checkpoint at step {trainer.step} could not be written ({why}: {where}); the previous checkpoints are intact"
    if trainer.config.train.on_save_error == "stop":
        message += f"; free disk space or fix permissions, then continue with --resume {trainer.run_dir}"
        trainer.emit(ev.Warning_(message=message))
        raise SaveFailed(message)
    trainer.emit(
        ev.Warning_(
            message=message + "; training goes on and retries at the next checkpoint interval "
            "(--on-save-error stop to stop instead)"
        )
    )


def run_loop(trainer: Trainer) -> str:
    """trainer._loop(), with a CUDA out-of-memory turned into a clean stop that says what fits."""
    try:
        return trainer._loop()
    except torch.OutOfMemoryError:
        pass  # leave the except block first, so the traceback's frames (and their tensors) can go
    raise out_of_memory(trainer)


def out_of_memory(trainer: Trainer) -> OutOfMemory:
    """Free what the failed step held, emit the estimator's breakdown, name a micro-batch that fits.

    No checkpoint is written: the step was half done; the last periodic checkpoint stands.
    """
    from engine import memory

    trainer.optimizer.zero_grad(set_to_none=True)
    gc.collect()
    if trainer.device.type == "cuda":
        torch.cuda.empty_cache()
    cfg = trainer.config
    t = cfg.train
    device_bytes = memory.device_memory_bytes(str(trainer.device))
    est = memory.estimate(cfg)
    table = memory.format_table(est, device_bytes)
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
    latest = trainer.ckpts.latest()
    kept = f"; the last checkpoint is {latest}" if latest else ""
    message = (
        f"out of memory at step {trainer.step + 1} with micro-batch {t.batch_size} x {cfg.seq_len} tokens "
        f"on {trainer.device_label}; {advice}{kept}"
    )
    trainer.emit(ev.Warning_(message=f"{message}\nestimated memory:\n{table}"))
    return OutOfMemory(message)
