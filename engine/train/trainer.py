"""One segment of a run: set-up (model, optimizer, scaler, autocast, compiled forward,
loaders, the resumed state), then the loop, to an `Ending`.

A segment never sees the run that owns it (engine/run/owner.py): it reports events through
`emit` and calls `boundary(self)` between steps, which returns how the segment ends (a stop,
a live toggle with the next config) or None to train on; the owner acts on the ending.

Per optimizer step: zero_grad(set_to_none) -> micro-batches under autocast, loss/accum ->
(fp16) unscale -> clip, recording the pre-clip norm -> the guard's verdict, one for all
ranks -> optimizer step (skipped on the device when bad) -> scaler update,
with the LR from `lr_at(step)`. Everything (model build, torch.compile, the loop) happens
on the thread that calls `train()`, because torch.compile is not thread-safe.
The host syncs with the device only at log, eval and checkpoint steps: whether a step's
update is skipped (NaN/Inf, a loss spike) is decided on the device and honoured by the
fused AdamW step as `found_inf` (engine/train/guard.py), so a bad step never reaches the weights
and a `--log-interval N` step makes no host read at all.
"""

from __future__ import annotations

import gc
import json
import math
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.train import checkpoint as ckpt
from engine import events as ev
from engine import device as devices
from engine.train import attention, build, compile_cache, compiling, distributed, guard
from engine import rundir
from engine.config import OptimConfig, RunConfig
from engine.train.data import BatchLoader, DataFailed, Dataset
from engine.errors import UserError
from engine.train.flops import flops_per_token, mfu, peak_flops
from engine.train.generate import generate_text
from engine.train.readings import Reading, Readings
from engine.train import state as train_state


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


class _StepClock:
    """Times training steps only: pauses, evals and saves restart it."""

    def __init__(self) -> None:
        self.readings: Readings | None = None  # the logged steps in flight, timed by device events
        self.restart()

    def restart(self) -> None:
        """After an eval, a save, a pause: the next steps are timed from here."""
        self.mark()
        if self.readings is not None:
            self.readings.restart()

    def mark(self) -> None:
        """The steps counted so far went into a reading: count again from here."""
        self.t0, self.steps, self.data_s = time.perf_counter(), 0, 0.0

    def per_step(self) -> tuple[float, float]:
        """(wall seconds, seconds waiting for data) per step since the restart; sync first."""
        return (time.perf_counter() - self.t0) / self.steps, self.data_s / self.steps


class Trainer:
    """Trains one segment of a run into `run_dir`.

    `config` must come from `open_data` (vocab and block size bound). With `resume`, the
    latest checkpoint in run_dir/checkpoints is loaded first. `emit` takes its events,
    `boundary` is asked between steps (both the owner's; none: a bare segment, as the
    measuring tools build), `tokenizer` loads the tokenizer its samples decode with.
    """

    def __init__(
        self,
        config: RunConfig,
        run_dir: Path,
        dataset: Dataset,
        *,
        emit: Callable[[Any], None] | None = None,
        boundary: Callable[[Trainer], Ending | None] | None = None,
        resume: bool = False,
        resume_from: str | None = None,
        init_state: Mapping[str, torch.Tensor] | None = None,
        tokenizer: Callable[[], Any] | None = None,
    ):
        """`init_state`: pretrained weights to start from (engine.prep.hf, `--init-from`), loaded at set-up."""
        self.config, self.run_dir, self.dataset = config, Path(run_dir), dataset
        self._init_state = init_state
        self.init_from = config.model.init_from if init_state is not None else None  # the events say so
        self._emit_to = emit or (lambda event: None)
        self.boundary = boundary or (lambda segment: None)
        self._load_tokenizer = tokenizer
        self.resume, self.resume_from = resume, resume_from
        self.ckpts = ckpt.CheckpointDir(self.run_dir / rundir.CHECKPOINTS, config.train.keep_last)
        self.step = 0
        self.tokens = 0
        self.best_val_loss: float | None = None
        self.last_eval: tuple[int, float] | None = None
        self._step_times: list[float] = []
        self.train_time_s = 0.0  # the steps' time so far, resumes included (Eval.train_time_s)
        self._timed_to = 0  # the step train_time_s counts to
        self.clock = _StepClock()
        self.dist = distributed.current()  # rank 0 alone writes events, config and checkpoints
        self._emit_lock = threading.Lock()  # the GPU sampler's thread emits too
        self._bad_reported = 0
        self.resumed_from_config: dict[str, Any] | None = None  # the switches it trained with: a segment's "before"
        self._tokenizer: Any = None
        self._gpu_sampler: Any = None
        self.loader: BatchLoader | None = None
        self._warmup: compiling.Warmup | None = None  # a compiled segment's counters, read after its first steps
        self._artifacts_note: str | None = None  # why the run's compile artifacts were ignored
        self._rng_warning: str | None = None  # a resume's CUDA RNG state that could not apply
        self.pending_toggles: list[dict[str, Any]] = []  # toggles the resumed checkpoint was saved for
        self.save_error = "unknown error"  # the last failed save's OS error, for a request's ack

    # ------------------------------------------------------------------ plumbing

    def emit(self, event: Any) -> None:
        if not self.dist.is_main:
            return
        with self._emit_lock:
            self._emit_to(event)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elif self.device.type == "mps":
            torch.mps.synchronize()

    # ------------------------------------------------------------------ set-up

    def setup(self) -> None:
        """Device, model, optimizer, data, the resumed state, compile: everything before step 1.
        An allocation that fails here is one line (guard.setup_out_of_memory), not a traceback."""
        try:
            return self._setup()
        except Exception as err:
            if not guard.is_out_of_memory(err):
                raise
            oom = guard.setup_out_of_memory(err, self.config.speed.device)
        self.model = self.forward = self.optimizer = None  # the traceback's frames are gone: free what was built
        gc.collect()
        raise oom

    def _setup(self) -> None:
        cfg = self.config
        self.device = distributed.place(devices.pick(cfg.speed.device), self.dist)
        self.precision = devices.precision(cfg.speed.precision, self.device.type)
        self.autocast, self.scaler = build.precision_context(self.precision, self.device)
        self.guard = guard.StepGuard(cfg.train.max_bad_steps, self.device)

        random.seed(cfg.train.seed)
        np.random.seed(cfg.train.seed)
        torch.manual_seed(cfg.train.seed)
        self.model = build.model(cfg, self.device, self._init_state)
        self._init_state = None  # its host copy goes now
        self.parallel = distributed.choose(cfg.speed.parallel, cfg, self.dist, self.device)
        if self.parallel == "fsdp":
            self.model = distributed.shard(self.model, self.device, self.dist, self.precision)  # before the optimizer
        self.optimizer = build.optimizer(self.model, cfg.optim, self.device)
        self.loader, self.val_batches = build.loaders(cfg, self.dataset, self.device, self.dist)
        self.clock.readings = Readings(self.device)

        if self.resume:
            self._load_resumed()
            self._refuse_finished()
        # compile last, on this thread, wrapping the module whose state was just loaded
        self.forward = self.model
        self.device_label = devices.describe(self.device)
        if cfg.speed.compile:
            mode = None if cfg.speed.compile_mode == "default" else cfg.speed.compile_mode
            compile_cache.enable()  # PyTorch's compile caches in the gpt2-tui cache: a rerun skips the compile
            loaded, self._artifacts_note = compiling.load_artifacts(self.run_dir, self.device_label)
            self._warmup = compiling.Warmup(cfg.speed.compile_scope, loaded)
            self.forward = compiling.compile_forward(self.model, cfg.speed.compile_scope, mode)
        if self.parallel == "ddp":
            self.forward = distributed.replicate(self.forward, self.device)

        self.sdpa, self.attention_ms, self.attention = None, {}, None
        if cfg.model.attention == "flash":  # on CUDA the fastest kernel measured leads SDPA's priority
            shape = attention.shape_of(cfg.train.batch_size, cfg.model.n_head, cfg.seq_len, cfg.model.n_embd,
                                       devices.autocast_dtype(self.precision) or torch.float32, self.device)  # fmt: skip
            choice = attention.choose(shape)
            self.sdpa, self.attention_ms = choice.picked, choice.timings
            with attention.prefer(self.sdpa):
                self.attention = attention.kernel_name(shape)

        self.n_params = self.model.num_params()
        self.flops_token = flops_per_token(cfg.model, self.n_params, cfg.seq_len)
        self.peak = peak_flops(self.device_label, self.precision) if self.device.type == "cuda" else None

    def _state(self) -> dict[str, Any]:
        return {
            **distributed.full_state(self.model, self.optimizer),  # unsharded: any world size resumes it
            "world_size": self.dist.world_size,
            "scaler": self.scaler.state_dict() if self.scaler else None,
            "step": self.step,
            "tokens": self.tokens,
            "best_val_loss": self.best_val_loss,
            "val_loss": self.last_eval[1] if self.last_eval and self.last_eval[0] == self.step else None,
            "config": self.config.model_dump(mode="json"),
            "rng": train_state.rng_state(self.device),
            "data": json.dumps(self.loader.state()),
            "guard": self.guard.state_dict(),
            "train_time_s": self.train_time_s,
        }

    def _refuse_finished(self) -> None:
        """A resume of a run already trained to its max steps (and no earlier --from) would add
        an empty segment: one line saying how to train further instead, nothing written."""
        n = self.config.train.max_steps
        if self.resume_from is None and self.step >= n:
            from engine.text import path_text, program

            where = path_text(self.run_dir)
            raise UserError(f"{where} already trained to step {self.step}, its max steps {n}: nothing is left to train; "
                            f"to train further give a larger --max-steps: {program()} train --resume {where} "
                            f"--max-steps {2 * n}")  # fmt: skip

    def _load_resumed(self) -> None:
        """The latest checkpoint, or the one `--from` names (best, a step, a file)."""
        path = self.ckpts.resolve(self.resume_from) if self.resume_from else self.ckpts.latest()
        if path is None:  # stopped before its first checkpoint: the config is all there is; start over
            return
        state = ckpt.load(path)
        train_state.check_shapes(self.model, state["model"], path)  # first: "another model shape" says the most
        ckpt.check_resumable(state, path, self.optimizer)
        self.resumed_from_config = state.get("config")
        distributed.load_full_state(self.model, self.optimizer, state)
        if self.scaler and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.step, self.tokens = state["step"], state.get("tokens", 0)
        self.best_val_loss = state.get("best_val_loss")
        spent = state.get("train_time_s")  # absent in older checkpoints: counted from here
        ok = isinstance(spent, (int, float)) and not isinstance(spent, bool) and math.isfinite(spent) and spent >= 0
        self.train_time_s, self._timed_to = float(spent) if ok else 0.0, self.step
        pending = state.get("pending_toggles")
        self.pending_toggles = [p for p in pending if isinstance(p, dict)] if isinstance(pending, list) else []
        guard_state = state.get("guard")
        self.guard.load_state_dict(guard_state if isinstance(guard_state, dict) else None)
        if state.get("val_loss") is not None:
            self.last_eval = (self.step, state["val_loss"])
        try:
            self._rng_warning = train_state.set_rng_state(state["rng"], self.device)
            self.loader.set_state(json.loads(state["data"]))
        except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as err:
            raise UserError(
                f"{path} holds a damaged RNG or data position ({type(err).__name__}); resume from another checkpoint"
            ) from None

    # ------------------------------------------------------------------ the loop

    @torch.no_grad()
    def evaluate(self) -> float:
        self.model.eval()
        total = torch.zeros((), device=self.device)
        for x, y in self.val_batches:
            x = torch.from_numpy(x).to(self.device)
            y = torch.from_numpy(y).to(self.device)
            with self.autocast():
                _, loss = self.forward(x, y)
            total += loss.float()
        self.model.train()
        val_loss = distributed.global_mean(total, len(self.val_batches), self.dist)
        self.last_eval = (self.step, val_loss)
        self.emit(ev.Eval(step=self.step, val_loss=val_loss, tokens=self.tokens, train_time_s=self.train_time_s))
        self._emit_sample()
        return val_loss

    def _emit_sample(self) -> None:
        """A short generation for the dashboard, seeded by the step so global RNG (and a
        bit-exact resume) is untouched; only when the dataset carries a tokenizer."""
        n = self.config.train.sample_tokens
        if not n or self._load_tokenizer is None:
            return
        try:
            if self._tokenizer is None:
                self._tokenizer = self._load_tokenizer()
            self.model.eval()
            # eager: a compiled block would compile again for each new sequence length
            with self.autocast(), torch.compiler.set_stance("force_eager"):
                text = generate_text(self.model, self._tokenizer, "", n, 0.8, 50, seed=self.step)
            self.emit(ev.Sample(step=self.step, text=text))
        except Exception as err:  # a sample is a nicety: never let it end the run
            self.emit(ev.Warning_(message=f"sample at step {self.step} failed: {err}"))
        finally:
            self.model.train()

    def save_checkpoint(self, final: bool = False) -> bool:
        """Save a healthy state; a blown-up one stops the run instead (the last good checkpoint
        stays latest). A `final` save that fails always ends the run with an error; another
        follows --on-save-error. False when the write failed and the run goes on."""
        return self._save("stop" if final else self.config.train.on_save_error)

    def save_for_toggle(self, pending: list[dict[str, Any]]) -> str | None:
        """Save for a live toggle's hand-over, the same on every rank: None when saved, else
        why not (the toggle is then refused and the run trains on)."""
        failed = None if self._save("toggle", pending=pending) else self.save_error
        if self.dist.enabled:  # rank 0 alone writes: every rank goes on, or hands over, alike
            failed = distributed.broadcast_object(failed if self.dist.is_main else None)
        return failed

    def _save(self, on_error: str, pending: Sequence[dict[str, Any]] = ()) -> bool:
        """The save itself; `on_error` is guard.save_failed's policy (stop, continue, toggle).
        `pending`: the toggles this save hands over; the checkpoint names them, so a resume
        after a kill -9 before their segment opened reports them (`_report_lost_toggles`)."""
        if not (self.last_eval and self.last_eval[0] == self.step):
            self.evaluate()  # every checkpoint carries its val loss, so `best` means something
        val_loss = self.last_eval[1]
        finite = distributed.weights_finite(self.model)
        if not finite or not guard.healthy(val_loss, self.best_val_loss):
            self._act(guard.unhealthy(self.step, val_loss, self.best_val_loss, finite, self.ckpts.latest(),
                                      self.precision, self.config.optim.lr, self.run_dir))  # fmt: skip
        is_best = self.best_val_loss is None or val_loss < self.best_val_loss
        previous_best = self.best_val_loss
        if is_best:
            self.best_val_loss = val_loss
        try:
            state = self._state()  # on every rank: FSDP2 gathers the shards here
            state["pending_toggles"] = list(pending)
            if not self.dist.is_main:
                return True
            path = self.ckpts.save(state, self.step, is_best)
        except OSError as err:  # disk full, permission denied: warn and go on, or stop (on_save_error)
            self.best_val_loss = previous_best
            kept = self.ckpts.latest() if self.dist.is_main else None
            self.save_error = err.strerror or type(err).__name__
            self._act(guard.save_failed(err, self.step, self.ckpts.path, on_error, self.run_dir, kept))
            return False
        self.emit(
            ev.Checkpoint(step=self.step, path=str(path), val_loss=val_loss, best=is_best, size_bytes=path.stat().st_size)
        )
        return True

    def train_step(self, lr: float) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer step; returns (loss, pre-clip grad norm) as device tensors (no sync)."""
        accum = self.config.train.grad_accum
        build.set_lr(self.optimizer, lr)
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), device=self.device)
        for i in range(accum):
            distributed.set_grad_sync(self.forward, i == accum - 1)  # DDP/FSDP2: all-reduce once a step
            t0 = time.perf_counter()
            x, y = self.loader.next()
            self.clock.data_s += time.perf_counter() - t0
            with self.autocast():
                _, loss = self.forward(x, y)
            loss = loss / accum
            loss_sum += loss.detach()
            (self.scaler.scale(loss) if self.scaler else loss).backward()
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        clip = self.config.optim.grad_clip
        params = self.model.parameters()
        if clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, clip)
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        norm = distributed.local_value(norm)  # FSDP2: a DTensor
        # one verdict for every rank (their one all-reduce); with fp16 the norm is unscaled
        # here, so skip = the scaler's inf OR the guard's verdict, exactly what bf16/fp32 skip
        skip = self.guard.judge(loss_sum, norm, scaled=self.scaler is not None,
                                agree=lambda flags: distributed.max_over_ranks(flags, self.dist))  # fmt: skip
        if self.optimizer.defaults.get("fused"):
            self.optimizer.found_inf = skip  # the fused kernel leaves weights and state as they were
            self.optimizer.step()
        elif not skip.item():  # unfused AdamW and Muon (build.MuonAdamW) have no found_inf: the one per-step host read left
            self.optimizer.step()
        if self.scaler:
            # not scaler.step(): it would fold in only its own inf. update() reads the infs its
            # unscale_ recorded, so only a real overflow lowers the scale, never a spike
            self.scaler.update()
        return loss_sum, norm

    def _loop(self) -> Ending:
        cfg = self.config.train
        max_steps = cfg.max_steps
        # no eval before the first step: the first step shows at once (a cold start's step-0
        # eval cost a nano run 11 s on CPU); the first val loss comes at eval_interval
        clock = self.clock
        clock.restart()
        while self.step < max_steps:
            ending = self.boundary(self)  # every UI's requests (in-app, attach, torchrun alike)
            if ending is not None:
                return ending

            lr = lr_at(self.step, self.config.optim, max_steps)
            try:
                loss, _ = self.train_step(lr)  # no host read here: see the module docstring
            except DataFailed:  # the data went bad under the run: the steps trained so far are saved
                self.optimizer.zero_grad(set_to_none=True)  # this step was never taken
                self.save_checkpoint()
                raise
            self.step += 1
            self.tokens += self.config.tokens_per_step * self.dist.world_size
            clock.steps += 1

            last = self.step == max_steps
            log = self.step % cfg.log_interval == 0 or last
            evaluate = self.step % cfg.eval_interval == 0 or last
            save = self.step % cfg.ckpt_interval == 0 or last
            # the device waits for the host only where it must: evals, checkpoints, the last
            # step, and under torchrun (the ranks gather their step times on the host)
            sync = evaluate or save or self.dist.enabled
            if log and not sync:  # this step's numbers travel to the host behind the work
                clock.readings.record(self.step, self.tokens, lr, self.guard.snapshot(), clock.steps, clock.data_s)
                clock.mark()
                self._check_run_dir()
            for r in clock.readings.ready():  # the earlier steps whose numbers have arrived
                self._after_reading(r, None)
            if not sync:
                continue
            self._sync()
            for r in clock.readings.ready(wait=True):
                self._after_reading(r, None)
            step_time, data_time = clock.per_step()
            self._check_run_dir()
            mean_loss = distributed.mean_over_ranks(loss, self.dist).item() if log and self.dist.enabled else None
            now = Reading(self.step, self.tokens, lr, self.guard.snapshot().tolist(), step_time, data_time)
            self._after_reading(now, mean_loss, report=log)
            if evaluate:
                self.evaluate()
            if save:
                self.save_checkpoint(final=last)
            clock.restart()
        return Ending("completed")

    def _warmed_up(self) -> None:
        """After a compiled segment's first steps: what the compile cost, and (rank 0) what
        it built saved with the run, for its resume, its next toggle to compile, a new machine."""
        warmup, self._warmup = self._warmup, None
        compiled = warmup.read(self.step)
        self.emit(compiled)
        if not compiled.compiled:  # Dynamo gave up (recompile limit, a graph break everywhere): eager
            self.emit(ev.Warning_(message=f"compile is on but nothing was compiled by step {self.step}: this segment "
                                          "runs eager, at eager speed; restart the app or the run to compile again"))  # fmt: skip
        if not self.dist.is_main:
            return
        try:
            compiling.save_artifacts(self.run_dir, self.device_label)
        except OSError as err:  # a nicety: the run goes on without it
            self.emit(ev.Warning_(message=f"compile artifacts not saved in {self.run_dir} ({err.strerror or err})"))

    def _act(self, verdict: guard.Verdict) -> None:
        """Carry out a guard verdict: always a warning event; a stop raises its one-line error."""
        self.emit(ev.Warning_(message=verdict.message))
        if verdict.stop is not None:
            raise verdict.stop(verdict.message)

    def _after_bad_steps(self, skipped: int) -> None:
        """Updates were skipped; after max_bad_steps in a row, stop on the last good weights:
        saved now if they are healthy (a NaN batch), else the last checkpoint stands."""
        self._bad_reported += skipped
        self._act(guard.bad_steps(self.guard, self.step, skipped))
        if not self.guard.tripped:
            return
        self.save_checkpoint()  # refuses (and stops) if the weights blew up
        self._act(guard.diverged(self.guard, self.step, self.ckpts.latest(), self.precision,
                                 self.config.optim.lr, self.run_dir))  # fmt: skip

    def _check_run_dir(self) -> None:
        """A run whose directory vanished (deleted, unmounted) stops instead of training blind
        (an events file moved alone is the owner's: it starts a new one at the boundary)."""
        if not self.dist.is_main:
            return
        if not (self.run_dir / rundir.CHECKPOINTS).is_dir():
            raise UserError(
                f"the run directory {self.run_dir} (or its {rundir.CHECKPOINTS}) vanished at step {self.step}; "
                "the run stopped, as nothing could be saved; restore the directory or start a new run"
            )

    def _loop_or_oom(self) -> Ending:
        """The loop, with an out-of-memory (CUDA's, or the CPU allocator's: guard.is_out_of_memory)
        turned into a clean stop that says what fits."""
        try:
            return self._loop()
        except (torch.OutOfMemoryError, MemoryError, RuntimeError) as err:
            if not guard.is_out_of_memory(err):
                raise
            del err  # leave the except block first, so the traceback's frames (and their tensors) can go
        self.optimizer.zero_grad(set_to_none=True)
        message, table = guard.out_of_memory(self.config, self.device, self.device_label, self.step, self.ckpts.latest())
        self.emit(ev.Warning_(message=f"{message}\nestimated memory:\n{table}"))
        raise guard.OutOfMemory(message)

    def _after_reading(self, r: Reading, mean_loss: float | None, report: bool = True) -> None:
        """A logged step's numbers, arrived: its step event, the compile warm-up's cost once,
        and the guard's verdict on the updates skipped since the last reading."""
        reading = self.guard.take(r.values)  # this step's loss, norm and the skipped-step counters
        self.train_time_s += r.step_time_s * max(0, r.step - self._timed_to)  # the steps this reading timed
        self._timed_to = max(self._timed_to, r.step)
        if report:  # under torchrun the logged loss is the mean over ranks
            loss = reading.loss if mean_loss is None else mean_loss
            self._report(loss, r.lr, reading.norm, r.step_time_s, r.data_time_s, r.step, r.tokens)
        if self._warmup is not None:
            self._warmed_up()
        if reading.total > self._bad_reported:
            self._after_bad_steps(reading.total - self._bad_reported)

    def _report(self, loss: float, lr: float, grad_norm: float, step_time: float, data_time: float, step: int,
                tokens: int) -> None:  # fmt: skip
        rank_times = distributed.gather_floats(step_time, self.dist)
        step_time = max(rank_times) if rank_times else step_time  # a step ends with its slowest rank
        self._step_times.append(step_time)
        W = self.dist.world_size
        tok_s = self.config.tokens_per_step * W / step_time
        mem = torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else None
        self.emit(
            ev.Step(
                step=step, loss=loss, lr=lr, grad_norm=grad_norm, step_time_s=step_time,
                tokens_per_s=tok_s, mfu=mfu(tok_s / W, self.flops_token, self.peak), mem_bytes=mem,
                tokens=tokens, data_time_s=data_time, rank_step_times=rank_times,
            )
        )

    def summary(self) -> dict[str, Any]:
        """Settled speed: medians over the second half of the logged intervals (past compile)."""
        if not self._step_times:
            return {}
        times = self._step_times
        settled = ev.settled_step_time(times)
        tok_s = self.config.tokens_per_step * self.dist.world_size / settled
        return {
            "first_step_time_s": times[0],
            "median_step_time_s": settled,
            "tokens_per_s": tok_s,
            "mfu": mfu(tok_s / self.dist.world_size, self.flops_token, self.peak),
            "peak_mem_bytes": torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else None,
        }

    def started(self) -> ev.RunStarted:
        """After setup(): what this segment runs (the owner emits it as the segment opens)."""
        return ev.RunStarted(
            config=self.config.model_dump(mode="json"), n_params=self.n_params, device=str(self.device),
            device_name=self.device_label, precision=self.precision, start_step=self.step,
            flops_per_token=self.flops_token, peak_flops=self.peak, dataset=self.dataset.info.model_dump(mode="json"),
            world_size=self.dist.world_size, parallel=self.parallel, init_from=self.init_from,
            attention=self.attention, attention_ms=self.attention_ms,
        )

    def train(self) -> Ending:
        """After setup() and the owner's opening events: train the segment to its end."""
        try:
            for note in self.config.notes:  # what the front door noticed (engine.run.configs.open_data): said in the run's log
                self.emit(ev.Warning_(message=note))
            if self._artifacts_note:
                self.emit(ev.Warning_(message=self._artifacts_note))
            if self._rng_warning:
                self.emit(ev.Warning_(message=self._rng_warning))
            if self.resume and self.ckpts.latest() is None:
                self.emit(ev.Warning_(message="no checkpoint was written before the run stopped; starting it again from step 0"))
            aside = self.ckpts.set_aside_after(self.step) if self.resume_from and self.dist.is_main else None
            if aside is not None:
                self.emit(ev.Warning_(message=f"resumed from step {self.step}: its later checkpoints were moved to {aside}"))
            self._start_gpu_sampler()
            try:
                with attention.prefer(self.sdpa):  # the kernel measured fastest, for steps, evals and the compile
                    ending = self._loop_or_oom()
            finally:
                self._stop_gpu_sampler()  # its last reading lands before run_finished
            if ending.reason == "toggle":  # not the end: the owner continues the run in a new segment
                self.model = self.forward = self.optimizer = None  # its memory goes to the next segment
                return ending
            self.emit(
                ev.RunFinished(step=self.step, reason=ending.reason, best_val_loss=self.best_val_loss,
                               summary=self.summary())
            )  # fmt: skip
            return ending
        except BaseException as err:
            message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            self.emit(ev.RunFailed(step=self.step, error=f"{type(err).__name__}: {message}"))
            raise
        finally:
            self.close()

    def _start_gpu_sampler(self) -> None:
        """NVML readings into the run's events (about 1 Hz): the dashboard's GPU tab, live or attached."""
        from engine import gpu_monitor

        if not (self.dist.is_main and self.device.type == "cuda" and gpu_monitor.available()[0]):
            return
        self._gpu_sampler = gpu_monitor.GpuSampler(lambda samples: self.emit(ev.Gpu(gpus=samples)))
        self._gpu_sampler.start()

    def _stop_gpu_sampler(self) -> None:
        sampler, self._gpu_sampler = self._gpu_sampler, None
        if sampler is not None:
            sampler.stop()

    def close(self) -> None:
        """Let go of the segment's threads (prefetch, GPU sampler); the owner closes the sinks."""
        self._stop_gpu_sampler()
        if self.loader is not None:
            self.loader.close()

