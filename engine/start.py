"""The one front door: a config in, a Trainer ready to run out.

    config = new_config(preset, file, flags)  or  resumed_config(run_dir, flags)
    trainer = start(config, run_dir, resume=...)   # data opened, memory checked, run dir made
    trainer.run()                                   # events -> events.jsonl + your sinks

The CLI, the TUI, the launcher, the measuring tools and the tests all start runs here, so
every run is checked the same way before a byte is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


from engine import device, distributed, events, memory, rundir
from engine.config import RunConfig, build, overlay, resolve
from engine.control import Control
from engine.data import Dataset, open_dataset
from engine.errors import UserError
from engine.run_owner import RunWriter
from engine.trainer import Trainer


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


def resumed_config(run_dir: Path, overrides: dict[str, Any]) -> RunConfig:
    """The run's own config with the flags given at resume on top."""
    return overlay(rundir.load_config(run_dir).model_dump(mode="json", exclude_none=True), overrides)


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
    from engine import hf

    directory = hf.cached_config_dir(source) if local_only else hf.config_dir(source)
    if directory is None:
        return config
    model = hf.shape_config(directory, config.model, explicit, source)
    return build(config.model_dump(mode="json") | {"model": model.model_dump(mode="json")})


def _pretrained(config: RunConfig, run_dir: Path, resume: bool) -> Any:
    """The `--init-from` weights (engine.hf.Pretrained) when this start begins from them: a new
    run, or a resumed one that stopped before its first checkpoint; else None."""
    if config.model.init_from is None:
        return None
    if resume:
        from engine.checkpoint import CheckpointDir

        if CheckpointDir(run_dir / rundir.CHECKPOINTS).latest() is not None:
            return None  # the checkpoint holds the weights now
    from engine import hf

    return hf.init_from(config.model.init_from, config.model)


def open_data(config: RunConfig) -> tuple[RunConfig, Dataset]:
    """Open the dataset and bind what it decides into the config: path, vocab, block size.

    Everything that can be wrong with the data is found here, before a run directory exists.
    """
    if config.data.path is None:
        from engine.prepare import default_dataset

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



def start(
    config: RunConfig,
    run_dir: Path,
    *,
    resume: bool = False,
    resume_from: str | None = None,
    sinks: Sequence[events.Sink] = (),
    control: Control | None = None,
    force: bool = False,
    dataset: Dataset | None = None,
    trainer_class: type[Trainer] = Trainer,
    owner: RunWriter | None = None,
) -> Trainer:
    """Open the data, check the memory budget, create the run directory; return the Trainer,
    whose `run()` trains the run to its end, live toggles included (engine/run_owner.py).

    Under torchrun every rank calls this: rank 0 names the directory and builds what is
    shared (the default dataset, the run directory) before the others read it. A `dataset`
    already opened by open_data (with `config` bound by it) is reused; the measuring tools
    pass a `trainer_class` that skips evals and checkpoints. The run's owner locks the run
    directory (its one writer) before anything is written and holds it to the run's end; a
    live toggle's next segment is started here with the `owner` that already holds it.
    """
    device.check(config.speed.device, config.speed.precision, config.speed.compile)  # before a byte is written
    handing_over = owner is not None
    if config.train.log and not handing_over:  # --log: a missing package is refused before a byte is written
        from engine import loggers

        loggers.check(config.train.log)
    ctx = distributed.init(config.speed.device)  # under torchrun: join the process group
    if ctx.enabled and not resume:  # rank 0's clock names the run directory
        run_dir = Path(distributed.broadcast_object(str(run_dir)))
        config = config.model_copy(update={"out_dir": str(run_dir)})
    owner = owner or RunWriter(run_dir, sinks, control, next_segment=_next_segment)
    if resume and not handing_over:
        owner.lock()  # one writer: a second resume is refused before anything is read or written
    try:
        with distributed.main_first():  # rank 0 downloads --init-from weights into the Hub's cache first
            if not resume:
                config = with_pretrained_shape(config)  # the form's and the TUI's configs too
            if dataset is None:
                config, dataset = open_data(config)
            memory.check_fits(config, force)  # refuse what will not fit, before allocating
            pretrained = None if handing_over else _pretrained(config, run_dir, resume)
            if not resume:
                owner.create(config, dataset.info.tokenizer)  # locked: held until the run ends
        if config.train.log and not handing_over and ctx.is_main:
            from engine import loggers

            owner.sinks += loggers.make_sinks(config.train.log, run_dir)  # beside the console/TUI and the JSONL
        return trainer_class(config, run_dir, dataset, owner=owner, resume=resume, resume_from=resume_from,
                             init_state=pretrained.state if pretrained else None)  # fmt: skip
    except BaseException:
        if not handing_over:  # a hand-over's owner releases at its run's end
            owner.discard_new()  # a new run refused after its directory was made: it goes
            owner.release()
        raise


def _next_segment(owner: RunWriter, config: RunConfig, kind: type[Trainer]) -> Trainer:
    """A live toggle's next segment: the run resumed from the checkpoint just saved, under the
    owner that holds it."""
    return start(config, owner.run_dir, resume=True, owner=owner, trainer_class=kind)


def run_live(trainer: Trainer) -> str:
    """`trainer.run()`: kept for the callers that name it (the run goes on after live toggles)."""
    return trainer.run()
