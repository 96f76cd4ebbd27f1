"""Verdicts on what went wrong in a step: NaN/Inf, a failed checkpoint write, CUDA OOM.

The guard only judges and words the message; the trainer acts (skips the update, saves,
stops). Every case ends in one of two ways: a `warning` event and the run goes on, or a
`warning` event with the details (the TUI shows it as an alert) and a one-line UserError
that stops the run (the CLI prints it and exits 2).
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.config import RunConfig
from engine.errors import UserError
from engine.text import loss_text, program


class Diverged(UserError):
    """Loss or grad norm stayed NaN/Inf (or the weights went non-finite): stopped on good weights."""


class SaveFailed(UserError):
    """A checkpoint could not be written and train.on_save_error is "stop"."""


class OutOfMemory(UserError):
    """The device ran out of memory in a step: the stop names a micro-batch that fits."""


def is_out_of_memory(err: BaseException) -> bool:
    """An allocation that failed: CUDA's OutOfMemoryError, Python's MemoryError, or the CPU
    allocator's RuntimeError ("can't allocate memory", under a memory limit)."""
    return isinstance(err, (torch.OutOfMemoryError, MemoryError)) or (
        isinstance(err, RuntimeError) and "can't allocate memory" in str(err)
    )


def setup_out_of_memory(err: BaseException, device: str) -> OutOfMemory:
    """An allocation that failed while a run was being set up (model, optimizer, batches): one
    line. The memory check refuses such a run first; it got here past --force, or the memory
    free at launch went to another process."""
    first = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return OutOfMemory(f"out of memory setting up the run on {device} ({first[:200]}): the model, optimizer and "
                       "batches do not fit", {"train.batch_size": "smaller"},
                       also="a smaller preset, or run without --force to see the memory estimate")  # fmt: skip


SPIKE_RATIO, SPIKE_MARGIN = 2.0, 4.0  # a finite loss above max(2 x its EMA, EMA + 4 nats) is a spike
EMA_DECAY = 0.9


@dataclass(frozen=True)
class Reading:
    """The guard's counters as read to the host (at log, eval and checkpoint steps only)."""

    loss: float  # this step's loss and pre-clip grad norm
    norm: float
    streak: int  # bad steps in a row, ending at this step
    total: int  # bad steps since the run (this session) started
    step: int = 0  # the step read (the loop is past it by then: read a step later)


class StepGuard:
    """Decides on the device, with no host sync, whether a step's update is skipped.

    A step is bad when its loss or (without a GradScaler) its grad norm is NaN/Inf, or when
    its loss spikes far above its recent level: the sign that the previous update blew the
    weights up although every number stayed finite. `judge` returns the decision as a
    0/1 device tensor that the optimizer step honours on the device (engine.train.build.step_unless:
    fused AdamW as `found_inf`, the GradScaler's own mechanism; Muon as its `skip`; unfused AdamW
    by putting back what the step changed, or on the CPU by a read that waits for nothing), and
    keeps the streak, count and loss EMA on the device too. The host reads them a step later
    (`snapshot`, engine/train/readings.py) at log, eval and checkpoint steps, under torchrun
    too: never the flag itself.
    """

    def __init__(self, max_bad_steps: int, device: torch.device):
        self.max_bad_steps = max_bad_steps
        zeros = lambda: torch.zeros((), device=device)  # noqa: E731
        self.flag, self._streak, self._total = zeros(), zeros(), zeros()
        self._ema = torch.full((), math.inf, device=device)  # inf: no level yet, so no spike
        self._loss, self._norm = zeros(), zeros()
        self.last = Reading(0.0, 0.0, 0, 0)

    def judge(
        self, loss: torch.Tensor, norm: torch.Tensor, scaled: bool,
        agree: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """The 0/1 skip flag for this step (1 = skip), computed on the device.

        `scaled`: a GradScaler runs and `norm` was taken after its unscale_, so a non-finite
        norm is its overflow (its scale search): skipped, but not counted as a bad step.
        `agree` (distributed.max_over_ranks) makes the verdict one verdict across ranks,
        in the step's one all-reduce, before the counters move: a spike seen on one rank
        counts on every rank, so they all reach a divergence stop at the same step."""
        loss, norm = loss.detach().float(), norm.detach().float()
        finite = torch.isfinite(loss) & (torch.isfinite(norm) | scaled)
        spike = loss > torch.maximum(self._ema * SPIKE_RATIO, self._ema + SPIKE_MARGIN)
        overflow = ~torch.isfinite(norm) if scaled else torch.zeros_like(finite)
        flags = torch.stack([~finite | spike, overflow]).float()
        if agree is not None:
            flags = agree(flags)
        bad = flags[0] > 0
        self.flag = bad.float()
        self._streak = (self._streak + 1) * self.flag
        self._total = self._total + self.flag
        level = torch.where(torch.isfinite(self._ema), EMA_DECAY * self._ema + (1 - EMA_DECAY) * loss, loss)
        self._ema = torch.where(bad, self._ema, level)  # the level follows good steps only
        self._loss, self._norm = loss, norm
        return flags.amax()

    def state_dict(self) -> dict[str, float]:
        """The loss level and bad-step streak a checkpoint carries, so the first step after a
        resume or toggle is judged as it would be in a straight run (one host read, at a save)."""
        ema, streak = torch.stack([self._ema, self._streak]).tolist()
        return {"ema": ema, "streak": streak}

    def load_state_dict(self, state: dict[str, float] | None) -> None:
        """Restore what state_dict saved; a checkpoint without it (older runs) starts with no
        level (inf), as before."""
        if not state:
            return
        try:
            ema, streak = float(state.get("ema", math.inf)), float(state.get("streak", 0.0))
        except (TypeError, ValueError, OverflowError):  # a checkpoint's is checked before (engine.train.checkpoint)
            return  # a damaged entry: start with no level, as an old checkpoint does
        if math.isnan(streak):
            streak = 0.0
        if math.isnan(ema) or ema < 0:
            ema = math.inf  # a damaged level: judge no spike rather than every step
        self._ema = torch.full((), ema, device=self._ema.device)
        self._streak = torch.full((), max(0.0, streak), device=self._streak.device)

    def snapshot(self) -> torch.Tensor:
        """This step's loss, norm and bad-step counters as one device tensor (no host read)."""
        return torch.stack([self._loss, self._norm, self._streak, self._total])

    def read(self) -> Reading:
        """One host read of this step's loss, norm and the bad-step counters."""
        return self.take(self.snapshot().tolist())

    def take(self, values: list[float], step: int = 0) -> Reading:
        """A snapshot of `step` read later (engine.train.readings): it becomes the last reading."""
        loss, norm, streak, total = values
        self.last = Reading(loss, norm, int(streak), int(total), step)
        return self.last

    @property
    def streak(self) -> int:
        return self.last.streak

    @property
    def total(self) -> int:
        return self.last.total

    @property
    def tripped(self) -> bool:
        return self.last.streak >= self.max_bad_steps


@dataclass(frozen=True)
class Verdict:
    """What the trainer should do: warn with `message`, and raise `stop` if it is set."""

    message: str
    stop: type[UserError] | None = None


def lower_lr(lr: float) -> float:
    """The LR a stop message suggests: a third of the run's, and never above the default."""
    from engine.config import OptimConfig

    return min(lr / 3, OptimConfig().lr)


def likely_causes(precision: str, lr: float) -> str:
    causes = [f"LR too high (--lr {lr:g}; try --lr {lower_lr(lr):.2g})", "bad data (check the token files / --data)"]
    fp16 = "fp16 overflow (try --precision bf16 or fp32)"
    causes.insert(0, fp16) if precision == "fp16" else causes.append(fp16)
    return ", ".join(causes)


def bad_steps(g: StepGuard, step: int, skipped: int) -> Verdict:
    """Skipped updates since the last report: warn; after max_bad_steps in a row the trainer stops."""
    r = g.last
    finite = math.isfinite(r.loss) and math.isfinite(r.norm)
    what = "a loss spike far above its recent level" if finite else "not finite"
    which = "the update was skipped" if skipped == 1 else f"{skipped} updates since the last report were skipped"
    return Verdict(
        f"step {step}: loss {loss_text(r.loss)}, grad norm {r.norm:.6g}: {what}; {which} "
        f"({r.streak} in a row; the run stops at {g.max_bad_steps})"
    )


def healthy(val_loss: float, best: float | None) -> bool:
    """A state worth a checkpoint: its val loss is finite and not far above the run's best
    (the spike rule above), so a blown-up state never becomes `latest`."""
    if not math.isfinite(val_loss):
        return False
    return best is None or val_loss <= max(best * SPIKE_RATIO, best + SPIKE_MARGIN)


def _continue(run_dir: Path, lr: float) -> str:
    """Advice that runs as printed: resume from the last good checkpoint with a lower LR."""
    return f"continue with `{program()} train --resume {run_dir} --lr {lower_lr(lr):.2g}` (or add `--from best`)"


def diverged(g: StepGuard, step: int, kept: Path | None, precision: str, lr: float, run_dir: Path) -> Verdict:
    where = kept or "no checkpoint (none was written before the divergence)"
    finite = math.isfinite(g.last.loss) and math.isfinite(g.last.norm)
    what = "the loss spiked far above its recent level" if finite else "loss or grad norm was NaN/Inf"
    return Verdict(
        f"{what} for {g.streak} steps in a row (to step {step}); "
        f"stopped with the last good weights in {where}; likely causes: {likely_causes(precision, lr)}; "
        + _continue(run_dir, lr),
        Diverged,
    )


def unhealthy(step: int, val_loss: float, best: float | None, weights_finite: bool, latest: Path | None,
              precision: str, lr: float, run_dir: Path) -> Verdict:
    """Before a save: a state that fails `healthy` (or holds NaN/Inf weights) is not written;
    the run stops and the last good checkpoint stays latest."""
    if not weights_finite:
        why = "the weights hold NaN/Inf"
    elif not math.isfinite(val_loss):
        why = f"the val loss is {val_loss}"
    else:
        why = f"the val loss {val_loss:.4g} is far above the best {best:.4g}: the weights blew up"
    return Verdict(
        f"{why} at step {step}, so no checkpoint was written; the last good one is {latest or 'none'}; "
        f"likely causes: {likely_causes(precision, lr)}; " + _continue(run_dir, lr),
        Diverged,
    )


def save_failed(err: OSError, step: int, ckpt_dir: Path, policy: str, run_dir: Path, kept: Path | None) -> Verdict:
    """A checkpoint write failed (disk full, no permission). One rule: only a `stop` policy
    (the final save, or --on-save-error stop) ends the run; a toggle's save ("toggle") refuses
    the toggle and the run trains on; otherwise warn and retry at the next interval. The words
    say what is true: whether any checkpoint exists (`kept`, the newest left)."""
    why = err.strerror or type(err).__name__
    # what is there now, not a history: checkpoints moved away by someone else are "none there"
    intact = f"the previous checkpoints are intact (newest: {kept})" if kept else f"no earlier checkpoint is in {ckpt_dir}"
    message = f"checkpoint at step {step} could not be written ({why}: {err.filename or ckpt_dir}); {intact}"
    if policy == "stop":
        return Verdict(message + f"; free disk space or fix permissions, then continue with --resume {run_dir}", SaveFailed)
    if policy == "toggle":
        return Verdict(message + "; the toggle is refused and the run trains on with its switches")
    return Verdict(
        message + "; training goes on and retries at the next checkpoint interval (--on-save-error stop to stop instead)"
    )


def out_of_memory(cfg: RunConfig, device: torch.device, device_label: str, step: int, latest: Path | None) -> tuple[str, str]:
    """(the one-line stop, the estimator's table) after a CUDA OOM: name a micro-batch that fits.

    No checkpoint is written: the step was half done; the last periodic checkpoint stands.
    """
    from engine.train import memory
    from engine.device import memory_bytes
    from engine.text import fix_flags, format_table

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    t = cfg.train
    device_bytes = memory_bytes(str(device))
    table = format_table(memory.estimate(cfg), device_bytes)
    fit = memory.suggest_fit(cfg, device_bytes) if device_bytes else None
    if fit is not None and fit.train.batch_size >= t.batch_size:
        # the estimate says it fits: something else holds device memory; still, go smaller
        seqs = t.batch_size * t.grad_accum
        smaller = [b for b in range(t.batch_size - 1, 0, -1) if seqs % b == 0 and b <= t.batch_size // 2]
        fit = memory.with_batch(cfg, smaller[0], seqs // smaller[0]) if smaller else None
        advice = "the estimate fits, so other processes may hold device memory; " + (
            f"try {fix_flags(fit)} (same tokens per step)" if fit else "free the device or use a smaller model"
        )
    elif fit is not None:
        advice = f"try {fix_flags(fit)} (same tokens per step; the estimator's largest that fits)"
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
