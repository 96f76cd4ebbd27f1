"""One segment of a run: its parts built from the config (engine/train/build.py), a resume's
state loaded into them, then the loop, to an `Ending`.

A segment never sees the run that owns it (engine/run/owner.py): it reports events through
`emit` and calls `boundary(self)` between steps, which returns how the segment ends (a stop,
a live toggle with the next config) or None to train on; the owner acts on the ending.
What happens around the steps is three components, each saying when it is due
(`Components`): evaluation, saving (checkpoints, and the resume) and reporting (the readings,
the step clock, the GPU sampler). The measuring tools pass ones that never evaluate or save.

Per optimizer step: zero_grad(set_to_none) -> micro-batches under autocast (grad_accum of
them, fewer early in a batch ramp), loss/accum ->
(fp16) unscale -> clip, recording the pre-clip norm -> the guard's verdict, one for all
ranks -> optimizer step (skipped on the device when bad) -> scaler update,
with the LR from `lr_at(step)`. Everything (model build, torch.compile, the loop) happens
on the thread that calls `train()`, because torch.compile is not thread-safe.
The host syncs with the device only at eval, checkpoint and last steps, under torchrun too:
whether a step's update is skipped (NaN/Inf, a loss spike) is decided on the device and
honoured there (build.step_unless: the fused AdamW's `found_inf`, Muon's `skip`, or the
tensors kept where skipped), so a bad step never reaches the weights and a `--log-interval N`
step makes no host read at all; its numbers are read a step later (engine/train/reporting.py).
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from engine import events as ev
from engine import rundir
from engine.config import OptimConfig, RunConfig
from engine.errors import UserError
from engine.train import attention, build, contention, distributed, guard
from engine.train.build import Parts
from engine.dataset import DataFailed, Dataset
from engine.train.evaluation import Evaluation
from engine.train.reporting import Reporting, locked
from engine.train.saving import Resumed, Saving, act
from engine.train.state import Progress


@dataclass
class Ending:
    """How a segment ended: "completed", "stopped", or "toggle" with the next segment's config
    and the toggle requests it applies (acknowledged once that segment opens)."""

    reason: str
    next_config: RunConfig | None = None
    applied: list[Any] = field(default_factory=list)


def lr_at(step: int, optim: OptimConfig, max_steps: int) -> float:
    """Linear warmup to optim.lr, then (cosine) a cosine down to optim.min_lr at the decay end,
    or (wsd) the peak lr held until the last decay_fraction of the steps, then a linear decay
    to min_lr at the decay end (OptimConfig.decay_start / decay_end)."""
    if step < optim.warmup_steps:
        return optim.lr * (step + 1) / optim.warmup_steps
    end, start = optim.decay_end(max_steps), optim.decay_start(max_steps)
    if step >= end:
        return optim.min_lr
    if optim.schedule == "wsd":
        if step < start:
            return optim.lr
        return optim.min_lr + (optim.lr - optim.min_lr) * (end - step) / max(1, end - start)
    ratio = (step - start) / max(1, end - start)
    return optim.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (optim.lr - optim.min_lr)


@dataclass
class Components:
    """What runs around a segment's steps, each due on its own interval."""

    evaluation: Evaluation
    saving: Saving
    reporting: Reporting


def standard(config: RunConfig, run_dir: Path, emit: Callable[[Any], None],
             tokenizer: Callable[[], Any] | None) -> Components:  # fmt: skip
    """A run's components: eval, checkpoint and log on the config's intervals."""
    t = config.train
    evaluation = Evaluation(emit, t.eval_interval, t.sample_tokens, tokenizer)
    return Components(evaluation, Saving(config, run_dir, emit, evaluation, t.ckpt_interval),
                      Reporting(config, run_dir, emit, t.log_interval))  # fmt: skip


def measuring(config: RunConfig, run_dir: Path, emit: Callable[[Any], None],
              tokenizer: Callable[[], Any] | None) -> Components:  # fmt: skip
    """The measuring tools' components: no evals, no checkpoints (outside the step clock, they
    only cost time); every step of the config's log interval reported as in a run."""
    evaluation = Evaluation(emit, None)
    return Components(evaluation, Saving(config, run_dir, emit, evaluation, None, write=False),
                      Reporting(config, run_dir, emit, config.train.log_interval))  # fmt: skip


ComponentsFor = Callable[[RunConfig, Path, Callable[[Any], None], Callable[[], Any] | None], Components]


class Trainer:
    """Trains one segment of a run into `run_dir`.

    `config` must come from `open_data` (vocab and block size bound). With `resume`, the
    latest checkpoint (or `resume_from`) is loaded first. `emit` takes its events, `boundary`
    is asked between steps (both the owner's; none: a bare segment), `tokenizer` loads the
    tokenizer its samples decode with; `components` builds what runs around the steps.
    `init_state`: pretrained weights to start from (engine.prep.hf, `--init-from`).
    """

    def __init__(
        self, config: RunConfig, run_dir: Path, dataset: Dataset, *,
        emit: Callable[[Any], None] | None = None, boundary: Callable[[Trainer], Ending | None] | None = None,
        resume: bool = False, resume_from: str | None = None, init_state: Mapping[str, torch.Tensor] | None = None,
        tokenizer: Callable[[], Any] | None = None, components: ComponentsFor = standard,
    ):  # fmt: skip
        self.config, self.run_dir, self.dataset = config, Path(run_dir), dataset
        self._init_state = init_state
        self.init_from = config.model.init_from if init_state is not None else None  # the events say so
        self.emit = locked(emit or (lambda event: None))
        self.boundary = boundary or (lambda segment: None)
        self.resume, self.resume_from = resume, resume_from
        self.dist = distributed.current()  # rank 0 alone writes events, config and checkpoints
        self._folds: bool | None = None  # whether the clip folds into the optimizer (train_step's first call)
        parts = components(config, self.run_dir, self.emit, tokenizer)
        self.evaluation, self.saving, self.reporting = parts.evaluation, parts.saving, parts.reporting
        self.at = Progress()
        self.resumed = Resumed()
        self.parts: Parts | None = None
        self._bad_reported = 0

    # the owner's and the tests' view of the segment
    step = property(lambda self: self.at.step, lambda self, v: setattr(self.at, "step", v))
    ckpts = property(lambda self: self.saving.ckpts)
    clock = property(lambda self: self.reporting.clock)

    # ------------------------------------------------------------------ set-up

    def setup(self) -> None:
        """Parts, the resumed state, the compiled forward: everything before step 1. An
        allocation that fails here is one line (guard.setup_out_of_memory), not a traceback."""
        try:
            self.parts = build.parts(self.config, self.dataset, self.dist, self._init_state)
            self._init_state = None  # its host copy goes now
            self.reporting.start(self.parts)
            if self.resume:
                self.resumed = self.saving.restore(self.parts, self.at, self.resume_from)
            build.finish(self.parts, self.config, self.run_dir)  # compile last, around the state just loaded
            return
        except Exception as err:
            if not guard.is_out_of_memory(err):
                raise
            oom = guard.setup_out_of_memory(err, self.config.speed.device)
        self.close()
        self.parts = None  # the traceback's frames are gone: free what was built
        gc.collect()
        raise oom

    def started(self) -> ev.RunStarted:
        """After setup(): what this segment runs (the owner emits it as the segment opens)."""
        p = self.parts
        assert p is not None
        return ev.RunStarted(
            config=self.config.model_dump(mode="json"), n_params=p.n_params, device=str(p.device),
            device_name=p.device_label, precision=p.precision, start_step=self.at.step,
            flops_per_token=p.flops_token, peak_flops=p.peak, dataset=self.dataset.info.model_dump(mode="json"),
            world_size=self.dist.world_size, parallel=p.parallel, init_from=self.init_from,
            attention=p.attention, attention_ms=p.attention_ms, contention=contention.now(),
        )  # fmt: skip

    # ------------------------------------------------------------------ the recipe

    def train_step(self, lr: float) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer step; returns (loss, pre-clip grad norm) as device tensors (no sync).
        Its micro-batches: grad_accum, fewer early in a batch ramp (TrainConfig.accum_at)."""
        p, accum, clock = self.parts, self.config.train.accum_at(self.at.step), self.reporting.clock
        assert p is not None
        build.set_lr(p.optimizer, lr)
        build.set_momentum(p.optimizer, self.config.optim, self.at.step)  # Muon's warm-up ramp, by the step
        p.optimizer.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), device=p.device)
        for i in range(accum):
            distributed.set_grad_sync(p.forward, i == accum - 1)  # DDP/FSDP2: all-reduce once a step
            t0 = time.perf_counter()
            x, y = p.loader.next()
            clock.data_s += time.perf_counter() - t0
            with p.autocast():
                _, loss = p.forward(x, y)
            loss = loss / accum
            loss_sum += loss.detach()
            (p.scaler.scale(loss) if p.scaler else loss).backward()
        if p.scaler:
            p.scaler.unscale_(p.optimizer)
        clip = self.config.optim.grad_clip
        params = list(p.model.parameters())
        if self._folds is None:  # decided once a segment: folds_clip walks every parameter
            self._folds = p.scaler is None and build.folds_clip(p.optimizer, p.model)
        folded = clip > 0 and self._folds
        if clip > 0 and not folded:
            norm = torch.nn.utils.clip_grad_norm_(params, clip)
        else:  # folded: fused AdamW scales the gradients as it reads them (no pass of its own over them)
            norm = torch.nn.utils.get_total_norm([q.grad for q in params if q.grad is not None])
        norm = distributed.local_value(norm)  # FSDP2: a DTensor
        # one verdict for every rank (their one all-reduce); with fp16 the norm is unscaled
        # here, so skip = the scaler's inf OR the guard's verdict, exactly what bf16/fp32 skip
        skip = p.guard.judge(loss_sum, norm, scaled=p.scaler is not None,
                             agree=lambda flags: distributed.max_over_ranks(flags, self.dist))  # fmt: skip
        # skipped on the device (fused: found_inf; else kept where skipped); a folded clip as its grad_scale
        build.step_unless(p.optimizer, skip, grad_scale=build.clip_scale(norm, clip) if folded else None)
        if p.scaler:
            # not scaler.step(): it would fold in only its own inf. update() reads the infs its
            # unscale_ recorded, so only a real overflow lowers the scale, never a spike
            p.scaler.update()
        return loss_sum, norm

    def _loop(self) -> Ending:
        # no eval before the first step: the first step shows at once (a cold start's step-0
        # eval cost a nano run 11 s on CPU); the first val loss comes at eval_interval
        p, at, rep, max_steps = self.parts, self.at, self.reporting, self.config.train.max_steps
        assert p is not None
        rep.clock.restart()
        while at.step < max_steps:
            ending = self.boundary(self)  # every UI's requests (in-app, attach, torchrun alike)
            if ending is not None:
                self._judge(rep.settle(at))  # the last steps' numbers first: reported, their time counted
                return ending
            lr = lr_at(at.step, self.config.optim, max_steps)
            try:
                loss, _ = self.train_step(lr)  # no host read here: see the module docstring
            except DataFailed:  # the data went bad under the run: the steps trained so far are saved
                p.optimizer.zero_grad(set_to_none=True)  # this step was never taken
                self.save_checkpoint()
                raise
            taken = self.config.tokens_at(at.step) * self.dist.world_size  # all ranks' (a batch ramp's)
            at.step += 1
            at.tokens += taken
            rep.clock.count(taken)

            last = at.step == max_steps
            log, evaluate = rep.due(at.step, last), self.evaluation.due(at.step, last)
            save = self.saving.due(at.step, last)
            # the device waits for the host only where it must: evals, checkpoints, the last step
            # (under torchrun too: the ranks read their numbers and gather step times a step later)
            sync = evaluate or save or last
            if log or sync:  # its numbers travel to the host behind the work; its time runs between end events
                rep.record(at, lr, loss, report=log)
                self._check_run_dir()
            if not sync:
                self._judge(rep.ready(at))  # the earlier steps whose numbers have arrived
                continue
            self._sync()
            self._judge(rep.ready(at, wait=True))
            if evaluate:
                self.evaluation.run(p, at)
            if save:
                self.save_checkpoint(final=last)
            rep.clock.restart()
        return Ending("completed")

    def _sync(self) -> None:
        device = self.parts.device if self.parts else None
        if device is not None and device.type == "cuda":
            torch.cuda.synchronize(device)
        elif device is not None and device.type == "mps":
            torch.mps.synchronize()

    def _judge(self, readings: list[guard.Reading]) -> None:
        """After max_bad_steps skipped updates in a row, stop on the last good weights: saved
        now if they are healthy (a NaN batch), else the last checkpoint stands."""
        for reading in readings:
            if reading.total <= self._bad_reported:
                continue
            p, skipped = self.parts, reading.total - self._bad_reported
            assert p is not None
            self._bad_reported = reading.total
            act(self.emit, guard.bad_steps(p.guard, reading.step, skipped))  # the step read, not the loop's
            if not p.guard.tripped:
                continue
            self.save_checkpoint()  # refuses (and stops) if the weights blew up
            act(self.emit, guard.diverged(p.guard, reading.step, self.ckpts.latest(), p.precision,
                                          self.config.optim.lr, self.run_dir))  # fmt: skip

    def _check_run_dir(self) -> None:
        """A run whose directory vanished (deleted, unmounted) stops instead of training blind
        (an events file moved alone is the owner's: it starts a new one at the boundary)."""
        if self.dist.is_main and not (self.run_dir / rundir.CHECKPOINTS).is_dir():
            raise UserError(
                f"the run directory {self.run_dir} (or its {rundir.CHECKPOINTS}) vanished at step {self.at.step}; "
                "the run stopped, as nothing could be saved; restore the directory or start a new run"
            )

    # ------------------------------------------------------------------ what the owner asks

    def save_checkpoint(self, final: bool = False) -> bool:
        """A final save that fails always ends the run with an error; another follows
        --on-save-error. False when the write failed and the run goes on."""
        assert self.parts is not None
        self._judge(self.reporting.settle(self.at))  # the steps so far timed and read before the save
        return self.saving.save(self.parts, self.at, "stop" if final else self.config.train.on_save_error)

    def save_for_toggle(self, pending: list[dict[str, Any]]) -> str | None:
        """None when saved for a live toggle's hand-over, else why not (the same on every rank)."""
        assert self.parts is not None
        self._judge(self.reporting.settle(self.at))
        return self.saving.for_toggle(self.parts, self.at, pending)

    def train(self) -> Ending:
        """After setup() and the owner's opening events: train the segment to its end."""
        try:
            aside = self.saving.set_aside_after(self.at.step) if self.resume_from else None
            for note in [*self.config.notes, self.parts.artifacts_note, *self.resumed.warnings, aside]:
                if note:  # what the front door noticed (engine.run.preflight), the resume, the compile cache
                    self.emit(ev.Warning_(message=note))
            self.reporting.start_sampler()
            try:
                # the kernel measured fastest, for steps, evals and the compile
                with attention.prefer(self.parts.sdpa):
                    ending = self._loop_or_oom()
            finally:
                self.reporting.stop_sampler()  # its last reading lands before run_finished
            if ending.reason == "toggle":  # not the end: the owner continues the run in a new segment
                self.close()
                self.parts = None  # its memory goes to the next segment
                return ending
            self.emit(ev.RunFinished(step=self.at.step, reason=ending.reason, best_val_loss=self.at.best_val_loss,
                                     summary=self.reporting.summary()))  # fmt: skip
            return ending
        except BaseException as err:
            message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            self.emit(ev.RunFailed(step=self.at.step, error=f"{type(err).__name__}: {message}"))
            raise
        finally:
            self.close()

    def _loop_or_oom(self) -> Ending:
        """The loop, with an out-of-memory (CUDA's, or the CPU allocator's: guard.is_out_of_memory)
        turned into a clean stop that says what fits."""
        try:
            return self._loop()
        except (torch.OutOfMemoryError, MemoryError, RuntimeError) as err:
            if not guard.is_out_of_memory(err):
                raise
            del err  # leave the except block first, so the traceback's frames (and their tensors) can go
        p = self.parts
        assert p is not None
        p.optimizer.zero_grad(set_to_none=True)
        message, table = guard.out_of_memory(self.config, p.device, p.device_label, self.at.step, self.ckpts.latest())
        self.emit(ev.Warning_(message=f"{message}\nestimated memory:\n{table}"))
        raise guard.OutOfMemory(message)

    def close(self) -> None:
        """Let go of the segment's threads (prefetch, GPU sampler); the owner closes the sinks."""
        self.reporting.stop_sampler()
        if self.parts is not None:
            self.parts.loader.close()
