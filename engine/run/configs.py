"""A run's config before it starts: preset < file < flags (or the run's own, at resume),
the shape `--init-from` weights decide, and the dataset bound into it (path, vocab, block).

    config, run_dir = new_config(preset, file, flags)   or   resumed_config(run_dir, flags)
    run = engine.run.owner.start(config, run_dir)       # checked, opened, locked
    run.run()

Everything that can be wrong with the config or the data is found here, before a run
directory exists.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


from engine import rundir
from engine.config import RunConfig, build, overlay, resolve
from engine.train.data import Dataset, open_dataset
from engine.errors import UserError


def new_config(
    preset: str | None, file: Path | None, overrides: dict[str, Any], out: Path | None = None
) -> tuple[RunConfig, Path]:
    """A new run's config (preset < file < flags; default preset nano) and its directory,
    refused if that directory is in use."""
    config = resolve(preset or (None if file else "nano"), file, overrides)
    config = with_pretrained_shape(config, {k[6:]: v for k, v in overrides.items() if k.startswith("model.")})
    run_dir = out or (Path(config.out_dir) if config.out_dir else rundir.default_path(config.preset))
    rundir.check_new(run_dir)
    return config.model_copy(update={"out_dir": str(run_dir)}), run_dir


def resumed_config(run_dir: Path, overrides: dict[str, Any], resume_from: str | None = None) -> RunConfig:
    """The run's own config with the flags given at resume on top, its lr schedule kept
    (keep_schedule), or UserError when it asks for another optimizer (its state is the run's:
    a new optimizer is a new run). A run already trained to its max steps is refused once its
    checkpoint is loaded and checked (the segment's set-up), so a damaged one says so first."""
    own = rundir.load_config(run_dir)
    if overrides.get("optim.optimizer", own.optim.optimizer) != own.optim.optimizer:
        raise UserError(f"this run trains with optimizer {own.optim.optimizer}; its checkpoints hold that optimizer's state, "
                        f"so it resumes with it: drop --optimizer, or start a new run with --optimizer "
                        f"{overrides['optim.optimizer']}")  # fmt: skip
    from engine.train.checkpoint import CheckpointDir

    step = CheckpointDir(run_dir / rundir.CHECKPOINTS).latest_step() if resume_from is None else None
    config = keep_schedule(own, overlay(own.model_dump(mode="json", exclude_none=True), overrides), overrides, step)
    return config


REPLAN = frozenset({"optim.lr", "optim.min_lr", "optim.warmup_steps", "optim.schedule", "optim.decay_fraction",
                    "optim.decay_steps"})  # schedule settings: given at resume, the user re-plans  # fmt: skip


def keep_schedule(own: RunConfig, config: RunConfig, overrides: dict[str, Any], step: int | None = None) -> RunConfig:
    """The one rule for a resume's lr schedule: the steps already planned keep their lr. The
    decay ends where the run's plan put it (its decay_steps, else the max steps it was started
    with), written into the config (optim.decay_steps) so a later resume keeps it too; steps past
    it train at min_lr, which a note says. A wsd run resumed at `step` before its decay began
    re-plans the decay to the new end instead: every step before it was at the peak lr under
    either plan, so only the decay moves. Schedule flags given at resume (--lr, --min-lr,
    --warmup-steps, --schedule, --decay-fraction, --decay-steps) re-plan it: the user asked."""
    asked = sorted(set(overrides) & REPLAN)
    if asked or config.optim.decay_steps is not None:
        kept, replanned = config, False
    else:
        end = own.optim.decay_end(own.train.max_steps)
        replanned = (own.optim.schedule == config.optim.schedule == "wsd" and step is not None
                     and step < own.optim.decay_start(own.train.max_steps) and config.train.max_steps != end)  # fmt: skip
        kept = config if replanned else overlay(config.model_dump(mode="json", exclude_none=True), {"optim.decay_steps": end})
    o, n = kept.optim, kept.train.max_steps
    end = o.decay_end(n)
    notes = list(config.notes)
    if replanned:
        notes.append(f"the wsd decay had not begun at step {step}: it is re-planned to the new end, a linear decay "
                     f"from step {o.decay_start(n)} to min_lr {o.min_lr:g} at step {end}; the steps before keep their lr")  # fmt: skip
    elif asked:
        notes.append(f"the lr schedule is re-planned with {', '.join('--' + a.split('.')[1].replace('_', '-') for a in asked)} "
                     f"given at resume: it decays to min_lr {o.min_lr:g} at step {end}")  # fmt: skip
    elif n > end:
        began = "" if o.schedule == "cosine" else "the wsd decay had begun: "
        notes.append(f"{began}the schedule keeps its decay to step {end}; steps after it train at min_lr {o.min_lr:g}; "
                     f"pass --decay-steps {n} to re-plan")  # fmt: skip
    kept._notes = notes
    return kept


def with_pretrained_shape(
    config: RunConfig, explicit: dict[str, Any] | None = None, local_only: bool = False
) -> RunConfig:
    """`config` with the model shape its `--init-from` weights decide (their config.json only:
    the weights come later, once the run is checked). `explicit`: the model settings the
    user gave as flags; a shape among them that differs from the weights' is refused in one
    line. `local_only` (the form, on every change): never the network; unchanged when a Hub
    model's config is not in the cache yet."""
    source = config.model.init_from
    if source is None:
        return config
    from engine.prep import hf

    directory = hf.cached_config_dir(source) if local_only else hf.config_dir(source)
    if directory is None:
        return config
    model = hf.shape_config(directory, config.model, explicit, source)
    return build(config.model_dump(mode="json") | {"model": model.model_dump(mode="json")})


def pretrained(config: RunConfig, run_dir: Path, resume: bool) -> Any:
    """The `--init-from` weights (engine.prep.hf.Pretrained) when this start begins from them: a new
    run, or a resumed one that stopped before its first checkpoint; else None."""
    if config.model.init_from is None:
        return None
    if resume:
        from engine.train.checkpoint import CheckpointDir

        if CheckpointDir(run_dir / rundir.CHECKPOINTS).latest() is not None:
            return None  # the checkpoint holds the weights now
    from engine.prep import hf

    return hf.init_from(config.model.init_from, config.model)


def open_data(config: RunConfig) -> tuple[RunConfig, Dataset]:
    """Open the dataset and bind what it decides into the config: path, vocab, block size.

    Everything that can be wrong with the data is found here, before a run directory exists.
    """
    if config.data.path is None:
        from engine.prep.prepare import default_dataset

        path = default_dataset()
    else:
        path = Path(config.data.path)
    headerless_vocab = config.model.vocab_size or config.data.vocab_size  # nanoGPT/llm.c files
    ds = open_dataset(path, vocab_size=headerless_vocab, preload=config.data.preload)
    vocab = config.model.vocab_size or ds.info.vocab_size
    if vocab < ds.info.vocab_size and config.model.init_from:
        raise UserError(
            f"the dataset's vocab {ds.info.vocab_size} is larger than {config.model.init_from}'s {vocab}: it was tokenized "
            f"with another tokenizer; prepare it with the model's (gpt2-tui prepare ... --tokenizer gpt2, or the model "
            f"directory's tokenizer.json)"
        )
    if vocab < ds.info.vocab_size:
        raise UserError(f"model vocab {vocab} is smaller than the dataset's {ds.info.vocab_size}",
                        {"model.vocab_size": f"{ds.info.vocab_size} or more"})  # fmt: skip
    T = config.seq_len
    ds.check_block(T)
    data = config.model_dump()
    data["data"]["path"] = str(path)
    data["model"]["vocab_size"] = vocab
    data["train"]["block_size"] = T
    bound = RunConfig.model_validate(data)
    bound._notes = [*config.notes, *short_train_notes(bound, ds.info.train_tokens)]  # the trainer warns them
    return bound, ds


def short_train_notes(config: RunConfig, train_tokens: int) -> list[str]:
    """A train split smaller than one optimizer step's read: every step sees the same text again."""
    need = config.tokens_per_step
    if train_tokens >= need:
        return []
    t = config.train
    return [f"the train split holds {train_tokens:,} tokens, fewer than one optimizer step reads "
            f"({t.batch_size} x {t.grad_accum} x {config.seq_len} = {need:,}): each step repeats the same text; "
            "prepare more text, or lower the batch size or block size"]  # fmt: skip
