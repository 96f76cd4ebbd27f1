"""A segment's checkpoints: when it saves (every `ckpt_interval` steps and at its last), what a
save holds and refuses (a blown-up state never becomes `latest`), the save a live toggle
hands over with, and the resume that loads one back into freshly built parts.

A component of the segment (engine/train/trainer.py): it says when it is due; the measuring
tools pass `Saving(..., every=None, write=False)`, which is never due and writes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine import events as ev
from engine import rundir
from engine.config import RunConfig
from engine.errors import UserError
from engine.train import checkpoint as ckpt
from engine.train import build, distributed, guard
from engine.train import state as train_state
from engine.train.build import Parts
from engine.train.evaluation import Evaluation
from engine.train.state import Progress


class Resumed:
    """What a resume found besides the state it loaded into the parts."""

    def __init__(self) -> None:
        self.config: dict[str, Any] | None = None  # the switches it trained with: a segment's "before"
        self.pending_toggles: list[dict[str, Any]] = []  # toggles the checkpoint was saved for
        self.warnings: list[str] = []  # said once the segment trains (an RNG state that could not apply)


class Saving:
    """`every`: the interval in steps (None: never due on its own); `write=False`: a save is a
    no-op that reports success (the measuring tools: saves only cost time)."""

    def __init__(self, config: RunConfig, run_dir: Path, emit: Callable[[Any], None], evaluation: Evaluation,
                 every: int | None, write: bool = True) -> None:  # fmt: skip
        self.config, self.run_dir, self.emit, self.evaluation = config, run_dir, emit, evaluation
        self.every, self.write = every, write
        self.ckpts = ckpt.CheckpointDir(run_dir / rundir.CHECKPOINTS, config.train.keep_last)
        self.save_error = "unknown error"  # the last failed save's OS error, for a request's ack
        self.dist = distributed.current()  # rank 0 alone writes

    def due(self, step: int, last: bool) -> bool:
        return self.every is not None and (step % self.every == 0 or last)

    def save(self, p: Parts, at: Progress, on_error: str, pending: Sequence[dict[str, Any]] = ()) -> bool:
        """Save a healthy state; a blown-up one stops the run instead (guard.unhealthy: the last
        good checkpoint stays latest). `on_error` is guard.save_failed's policy (stop, continue,
        toggle); `pending`: the toggles this save hands over, named in the checkpoint so a resume
        after a kill -9 before their segment opened reports them. False when the write failed."""
        if not self.write:
            return True
        if at.val_loss_now() is None:
            self.evaluation.run(p, at)  # every checkpoint carries its val loss, so `best` means something
        val_loss = at.val_loss_now()
        assert val_loss is not None
        lr = self.config.optim.lr
        finite = distributed.weights_finite(p.model)
        if not finite or not guard.healthy(val_loss, at.best_val_loss):
            act(self.emit, guard.unhealthy(at.step, val_loss, at.best_val_loss, finite, self.ckpts.latest(),
                                           p.precision, lr, self.run_dir))  # fmt: skip
        is_best = at.best_val_loss is None or val_loss < at.best_val_loss
        previous_best = at.best_val_loss
        if is_best:
            at.best_val_loss = val_loss
        try:
            state = self._state(p, at)  # on every rank: FSDP2 gathers the shards here
            state["pending_toggles"] = list(pending)
            if not self.dist.is_main:
                return True
            path = self.ckpts.save(state, at.step, is_best)
        except OSError as err:  # disk full, permission denied: warn and go on, or stop (on_save_error)
            at.best_val_loss = previous_best
            kept = self.ckpts.latest() if self.dist.is_main else None
            self.save_error = err.strerror or type(err).__name__
            act(self.emit, guard.save_failed(err, at.step, self.ckpts.path, on_error, self.run_dir, kept))
            return False
        self.emit(ev.Checkpoint(step=at.step, path=str(path), val_loss=val_loss, best=is_best,
                                size_bytes=path.stat().st_size))  # fmt: skip
        return True

    def for_toggle(self, p: Parts, at: Progress, pending: list[dict[str, Any]]) -> str | None:
        """Save for a live toggle's hand-over, the same on every rank: None when saved, else
        why not (the toggle is then refused and the run trains on)."""
        failed = None if self.save(p, at, "toggle", pending=pending) else self.save_error
        if self.dist.enabled:  # rank 0 alone writes: every rank goes on, or hands over, alike
            failed = distributed.broadcast_object(failed if self.dist.is_main else None)
        return failed

    def _state(self, p: Parts, at: Progress) -> dict[str, Any]:
        return {
            **distributed.full_state(p.model, p.optimizer),  # unsharded: any world size resumes it
            "world_size": self.dist.world_size,
            "scaler": p.scaler.state_dict() if p.scaler else None,
            "step": at.step,
            "tokens": at.tokens,
            "best_val_loss": at.best_val_loss,
            "val_loss": at.val_loss_now(),
            "config": self.config.model_dump(mode="json"),
            "rng": train_state.rng_state(p.device),
            "data": json.dumps(p.loader.state()),
            "guard": p.guard.state_dict(),
            "train_time_s": at.train_time_s,
        }

    # ------------------------------------------------------------------ a resume

    def restore(self, p: Parts, at: Progress, resume_from: str | None) -> Resumed:
        """Load the latest checkpoint, or the one `--from` names (best, a step, a file), into
        the parts and `at`; a run already trained to its max steps is refused in one line."""
        found = Resumed()
        if exposed := rundir.open_to_others(self.run_dir):  # said, not refused: the files are still read as data
            found.warnings.append(exposed)
        path = self.ckpts.resolve(resume_from) if resume_from else self.ckpts.latest()
        if path is None:  # stopped before its first checkpoint: the config is all there is; start over
            found.warnings.append("no checkpoint was written before the run stopped; starting it again from step 0")
            return found
        state = ckpt.load(path)
        train_state.check_shapes(p.model, state["model"], path)  # first: "another model shape" says the most
        ckpt.check_resumable(state, path, p.optimizer)
        n = _numbers(state, path)  # its counters by the one reading of a run's numbers, before anything loads
        found.config = state.get("config")
        distributed.load_full_state(p.model, p.optimizer, state)
        build.apply_settings(p.optimizer, self.config.optim, p.device)  # the run's settings over the saved groups
        if p.scaler and state.get("scaler"):
            p.scaler.load_state_dict(state["scaler"])
        at.step, at.tokens, at.best_val_loss = n.step, n.tokens, n.best_val_loss
        at.train_time_s, at.timed_to = n.train_time_s or 0.0, at.step  # absent in older checkpoints: counted from here
        pending = state.get("pending_toggles")
        found.pending_toggles = [t for t in pending if isinstance(t, dict)] if isinstance(pending, list) else []
        guard_state = state.get("guard")
        p.guard.load_state_dict(guard_state if isinstance(guard_state, dict) else None)
        if n.val_loss is not None:
            at.last_eval = (at.step, n.val_loss)
        try:
            rng_warning = train_state.set_rng_state(state["rng"], p.device)
            p.loader.set_state(json.loads(state["data"]))
        except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as err:
            raise UserError(
                f"{path} holds a damaged RNG or data position ({type(err).__name__}); resume from another checkpoint"
            ) from None
        if rng_warning:
            found.warnings.append(rng_warning)
        self._refuse_finished(at.step, resume_from)
        return found

    def set_aside_after(self, step: int) -> str | None:
        """A resume `--from` an earlier checkpoint, once it trains: the later ones move aside
        (rank 0), so `latest` is this run's own line again; the warning to say, if any moved."""
        aside = self.ckpts.set_aside_after(step) if self.dist.is_main else None
        return None if aside is None else f"resumed from step {step}: its later checkpoints were moved to {aside}"

    def _refuse_finished(self, step: int, resume_from: str | None) -> None:
        """A resume of a run already trained to its max steps (and no earlier --from) would add
        an empty segment: one line saying how to train further instead, nothing written."""
        n = self.config.train.max_steps
        if resume_from is None and step >= n:
            raise trained_past(self.run_dir, step, n)


class TrainedPast(UserError):
    """trained_past's refusal, with its numbers: a front door words its advice again with the
    flags it was given (the CLI), so following it keeps them."""

    run_dir: Path
    step: int
    max_steps: int


def trained_past(run_dir: Path, step: int, max_steps: int, flags: tuple[str, ...] | list[str] = ()) -> TrainedPast:
    """The one refusal of a resume whose max steps the run has reached (here, and at the front
    door for a --max-steps given at or below the step reached: engine.run.preflight): its advice
    names a max steps above the step reached, so following it trains (2x the larger of the two),
    with the other `flags` given (the CLI's: its advice keeps what the user asked for)."""
    from engine.text import path_text, program

    where = path_text(run_dir)
    refusal = TrainedPast(f"{where} already trained to step {step}, its max steps {max_steps}: nothing is left to "
                          f"train; to train further give a larger --max-steps: {program()} train --resume {where} "
                          f"--max-steps {2 * max(max_steps, step)}{''.join(' ' + f for f in flags)}")  # fmt: skip
    refusal.run_dir, refusal.step, refusal.max_steps = run_dir, step, max_steps
    return refusal


class _Numbers(BaseModel):
    """A checkpoint's counters, read by the events' rule (engine.events: the one reading of a
    run's numbers): they go on into every event the resumed run writes. Strict: a bool or a
    string is no count; a saved val loss is finite (only a healthy state is saved)."""

    model_config = ConfigDict(strict=True)

    step: ev.Count
    tokens: ev.Count = 0
    best_val_loss: Annotated[float, Field(allow_inf_nan=False)] | None = None
    val_loss: Annotated[float, Field(allow_inf_nan=False)] | None = None
    train_time_s: ev.Measure | None = None


def _numbers(state: dict[str, Any], path: Path) -> _Numbers:
    """The checkpoint's counters, or one line refusing it (the field out of range)."""
    try:
        return _Numbers.model_validate({k: state.get(k) for k in _Numbers.model_fields if state.get(k) is not None})
    except ValidationError as err:
        bad = ", ".join(sorted({str(e["loc"][0]) for e in err.errors() if e["loc"]}))
        raise UserError(f"{path} cannot be resumed from ({bad} out of range); move it aside and --resume takes the "
                        "newest checkpoint left, or start a new run") from None  # fmt: skip


def act(emit: Callable[[Any], None], verdict: guard.Verdict) -> None:
    """Carry out a guard verdict: always a warning event; a stop raises its one-line error."""
    emit(ev.Warning_(message=verdict.message))
    if verdict.stop is not None:
        raise verdict.stop(verdict.message)
