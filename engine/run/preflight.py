"""A run's config before it starts, judged once for every front door (the CLI's new run and
resume, the form, the Switches dialog and `toggle`, the measuring tools): `preflight`.

    config, run_dir = new_config(preset, file, flags)   or   resumed_config(run_dir, flags)
    verdict = preflight(config, explicit=flags)          # shape, data, device, memory, warnings
    config = verdict.raise_first()                       # the first refusal, as UserError
    run = engine.run.owner.start(config, run_dir, dataset=verdict.dataset)

Everything that can be wrong with the config or the data is found here, before a run
directory exists. The rules are the list RULES, in order; each judges the config in hand
(a Check) and refuses (at a setting, or of none) or warns. A front end renders the Verdict:
the CLI raises its first refusal, the form shows each at its field, the dialog its first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine import rundir
from engine.config import ONLY_UNDER, RunConfig, build, overlay, resolve
from engine.dataset import Dataset, DatasetInfo, open_dataset
from engine.errors import Refusal, UserError

if TYPE_CHECKING:
    from engine.device import Capabilities
    from engine.train.memory import MemoryEstimate


def new_config(
    preset: str | None, file: Path | None, overrides: dict[str, Any], out: Path | None = None
) -> tuple[RunConfig, Path]:
    """A new run's config (preset < file < flags; default preset nano) and its directory,
    refused if that directory is in use. Not judged yet: preflight (explicit=overrides) does."""
    config = resolve(preset or (None if file else "nano"), file, overrides)
    run_dir = out or (Path(config.out_dir) if config.out_dir else rundir.default_path(config.preset))
    rundir.check_new(run_dir)
    return config.model_copy(update={"out_dir": str(run_dir)}), run_dir


def resumed_config(run_dir: Path, overrides: dict[str, Any], resume_from: str | None = None) -> RunConfig:
    """The run's own config with the flags given at resume on top, its lr schedule kept
    (keep_schedule), or UserError when it asks for another optimizer (its state is the run's:
    a new optimizer is a new run). A run already trained to its max steps is refused once its
    checkpoint is loaded and checked (the segment's set-up), so a damaged one says so first."""
    own = rundir.load_config(run_dir)
    refuse_model_change(own, overrides, run_dir)
    if overrides.get("optim.optimizer", own.optim.optimizer) != own.optim.optimizer:
        raise UserError(f"this run trains with optimizer {own.optim.optimizer}; its checkpoints hold that optimizer's state, "
                        f"so it resumes with it: drop --optimizer, or start a new run with --optimizer "
                        f"{overrides['optim.optimizer']}")  # fmt: skip
    from engine.train.checkpoint import CheckpointDir

    step = CheckpointDir(run_dir / rundir.CHECKPOINTS).latest_step() if resume_from is None else None
    asked = overrides.get("train.max_steps")
    if step is not None and type(asked) is int and asked <= step:  # before the config's own checks, whose
        from engine.train.saving import trained_past  # fixes (a warmup below it) would meet this refusal next

        raise trained_past(run_dir, step, asked)
    config = keep_schedule(own, overlay(own.model_dump(mode="json", exclude_none=True), overrides), overrides, step)
    return config


def refuse_model_change(own: RunConfig, overrides: dict[str, Any], run_dir: Path) -> None:
    """A resume keeps the model the run trained: a recipe switch (form section Recipe, under
    model.: what the model computes) given at resume with another value than the run's is
    refused, naming the fix: a new run that starts from this one's weights is another model."""
    from engine import settings
    from engine.config import RECIPE

    for dotted, value in overrides.items():
        section, name = dotted.split(".", 1)
        if section != "model" or settings.setting(dotted).form != RECIPE:
            continue
        was = getattr(own.model, name)
        if value != was:
            flag = settings.setting(dotted).flag or dotted
            flag = f"--no-{flag[2:]}" if value is False and flag.startswith("--") else flag  # as it was typed
            raise UserError(f"{flag} changes what the model computes ({name} {was} -> {value}); a resume keeps the "
                            f"model {run_dir} trained: drop {flag}, or start a new run with it")  # fmt: skip


REPLAN = frozenset({"optim.lr", "optim.min_lr", "optim.warmup_steps", "optim.schedule", "optim.decay_fraction",
                    "optim.decay_steps"})  # schedule settings: given at resume, the user re-plans  # fmt: skip


def keep_schedule(own: RunConfig, config: RunConfig, overrides: dict[str, Any], step: int | None = None) -> RunConfig:
    """The one rule for a resume's lr schedule: the steps already planned keep their lr. The
    decay ends where the run's plan put it (its decay_steps, else the max steps it was started
    with), written into the config (optim.decay_steps) so a later resume keeps it too; steps past
    it train at min_lr, which a note says. A wsd run resumed at `step` before its decay began
    re-plans the decay to the new end instead: every step before it was at the peak lr under
    either plan, so only the decay moves; shortened, it begins no earlier than `step` (the
    decay_fraction that says so is written into the config): never a drop in one step. Schedule
    flags given at resume (--lr, --min-lr, --warmup-steps, --schedule, --decay-fraction,
    --decay-steps) re-plan it: the user asked."""
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
    clamped = replanned and step is not None and o.decay_start(n) < step
    if clamped:  # a run shortened: the new end's decay would have begun in the past (a drop in one step)
        assert step is not None
        kept = overlay(kept.model_dump(mode="json", exclude_none=True), {"optim.decay_fraction": (end - step) / end})
        o = kept.optim
    notes = list(config.notes)
    if replanned:
        also = (f" (decay fraction {o.decay_fraction:.3g}: a decay cannot begin before the step reached)"
                if clamped else "")  # fmt: skip
        notes.append(f"the wsd decay had not begun at step {step}: it is re-planned to the new end, a linear decay "
                     f"from step {o.decay_start(n)} to min_lr {o.min_lr:g} at step {end}{also}; the steps before "
                     "keep their lr")  # fmt: skip
    elif asked:
        notes.append(f"the lr schedule is re-planned with {', '.join('--' + a.split('.')[1].replace('_', '-') for a in asked)} "
                     f"given at resume: it decays to min_lr {o.min_lr:g} at step {end}")  # fmt: skip
    elif n > end:
        began = "" if o.schedule == "cosine" else "the wsd decay had begun: "
        notes.append(f"{began}the schedule keeps its decay to step {end}; steps after it train at min_lr {o.min_lr:g}; "
                     f"pass --decay-steps {n} to re-plan")  # fmt: skip
    elif n < end and step is not None and step < n:  # shortened: what the kept plan does says so too
        notes.append(f"the schedule keeps its decay to step {end}: the run now ends at step {n}, on that plan's lr, "
                     f"before it reaches min_lr {o.min_lr:g}")  # fmt: skip
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
    vocab = dataset_vocab(config, ds.info)
    T = config.seq_len
    ds.check_block(T)
    data = config.model_dump()
    data["data"]["path"] = str(path)
    data["model"]["vocab_size"] = vocab
    data["train"]["block_size"] = T
    bound = RunConfig.model_validate(data)
    bound._notes = [*config.notes, *short_train_notes(bound, ds.info.train_tokens)]  # the trainer warns them
    return bound, ds


def dataset_vocab(config: RunConfig, info: DatasetInfo) -> int:
    """The run's vocab (the model's, else the dataset's); UserError when the dataset's ids do not fit it."""
    vocab = config.model.vocab_size or info.vocab_size
    if vocab < info.vocab_size and config.model.init_from:
        raise UserError(
            f"the dataset's vocab {info.vocab_size} is larger than {config.model.init_from}'s {vocab}: it was tokenized "
            f"with another tokenizer; prepare it with the model's (gpt2-tui prepare ... --tokenizer gpt2, or the model "
            f"directory's tokenizer.json)"
        )
    if vocab < info.vocab_size:
        raise UserError(f"model vocab {vocab} is smaller than the dataset's {info.vocab_size}",
                        {"model.vocab_size": f"{info.vocab_size} or more"})  # fmt: skip
    return vocab


def short_train_notes(config: RunConfig, train_tokens: int) -> list[str]:
    """A train split smaller than one optimizer step's read: every step sees the same text again."""
    need = config.tokens_per_step
    if train_tokens >= need:
        return []
    t = config.train
    return [f"the train split holds {train_tokens:,} tokens, fewer than one optimizer step reads "
            f"({t.batch_size} x {t.grad_accum} x {config.seq_len} = {need:,}): each step repeats the same text; "
            "prepare more text, or lower the batch size or block size"]  # fmt: skip


# ---------------------------------------------------------------- the one preflight


@dataclass
class Verdict:
    """What preflight found: the config to run (bound and marked; None while anything refuses
    it), each refusal at its setting (`errors`) or of none (`general`), in the order found,
    warnings about inputs that have no effect, the memory estimate and the opened dataset."""

    config: RunConfig | None = None
    judged: RunConfig | None = None  # the config the rules saw last (shape and data bound), refused or not
    errors: dict[str, Refusal] = field(default_factory=dict)
    general: list[Refusal] = field(default_factory=list)
    warnings: list[Refusal] = field(default_factory=list)
    estimate: MemoryEstimate | None = None
    dataset: Dataset | None = None
    found: list[Refusal] = field(default_factory=list)  # every refusal, first found first

    def raise_first(self) -> RunConfig:
        """The config to run, or the first refusal raised as UserError (its fixes kept as data)."""
        if self.found:
            first = self.found[0]
            if isinstance(first, UserError):
                raise first
            raise UserError(first.problem, *first.fixes, also=first.also)
        assert self.config is not None
        return self.config


@dataclass
class Check:
    """What a rule sees (the config in hand, which a rule may replace with a bound one) and
    where it says what it found."""

    config: RunConfig
    data: Dataset | DatasetInfo | bool  # True: open it; False: not judged here (a live run's own)
    caps: Capabilities | None  # the form's and the dialog's: refusals at each field
    explicit: Mapping[str, Any] | None  # the settings the user gave ({dotted: value}); None: not known
    held: int | None  # a live toggle: the memory the running segment hands over
    force: bool  # --force: no memory refusal
    local_only: bool  # never the network (the form, on every change)
    resume: bool  # the run's own config: its shape is the run's
    memory: bool  # refuse what will not fit (False: the caller shows the estimate's verdict itself)
    verdict: Verdict
    complete: bool = True  # False: something was left for the launch to judge (a Hub shape not cached)

    def refuse(self, why: Refusal | str, dotted: str | None = None) -> None:
        why = UserError(why) if isinstance(why, str) else why
        dotted = dotted or (next(iter(why.fixes[0]), None) if why.fixes else None)
        if dotted is None:
            self.verdict.general.append(why)
        elif dotted in self.verdict.errors:
            return
        else:
            self.verdict.errors[dotted] = why
        self.verdict.found.append(why)

    def warn(self, why: Refusal | str) -> None:
        self.verdict.warnings.append(UserError(why) if isinstance(why, str) else why)

    def given(self, dotted: str) -> bool:
        """The user gave this setting, with a value other than the schema's default (a preset's
        or a file's value is not the user's here: it does not warn)."""
        if self.explicit is None or dotted not in self.explicit:
            return False
        section, name = dotted.split(".")
        return getattr(getattr(self.config, section), name) != _default(dotted)


Rule = Callable[[Check], None]


def _default(dotted: str) -> Any:
    section, name = dotted.split(".")
    return RunConfig.model_fields[section].annotation.model_fields[name].default  # type: ignore[union-attr]


def pretrained_shape(c: Check) -> None:
    """The model shape the `--init-from` weights decide (their config.json, read once here)."""
    if c.resume or c.config._preflighted or c.config.model.init_from is None:
        return  # a resumed run's shape is its own; a judged config's was read already
    explicit = {k[6:]: v for k, v in (c.explicit or {}).items() if k.startswith("model.")}
    try:
        from engine.prep import hf

        hf.refuse_recipe(c.config.model, c.config.model.init_from)  # before any cache or network
        if c.local_only:
            if hf.cached_config_dir(c.config.model.init_from) is None:
                c.complete = False  # a Hub model not downloaded yet: the launch reads its shape
                return
        c.config = with_pretrained_shape(c.config, explicit, c.local_only)
    except UserError as err:
        c.refuse(err, "model.init_from")


def device_rule(c: Check) -> None:
    """What this machine cannot run: at each field (caps given: the form, the dialog), else the
    launch's one-line check."""
    from engine import device

    s = c.config.speed
    if c.caps is not None:
        values = {f"{section}.{name}": value for section in ("model", "data", "optim", "speed", "train")
                  for name, value in getattr(c.config, section).model_dump().items()}  # fmt: skip
        refused = device.refuse(values, c.caps)
        for dotted, why in refused.items():
            c.refuse(UserError(why), dotted)
        if refused:
            return
    device.check(s.device, s.precision, s.compile)


def emulated_precision(c: Check) -> None:
    """A half precision this CPU only emulates (engine.device.cpu_native) trains several times slower
    than fp32: said at every front door (a run's start, the form, the Switches dialog, toggle), with
    the fix; `auto` never picks one (engine.device.precision). The matmul is timed where nothing
    waits on it (not the form's or the dialog's every change)."""
    from engine import device
    from engine.train.contention import half_reason

    s = c.config.speed
    if device.kind(s.device) != "cpu":
        return
    slow = half_reason(device.precision(s.precision, "cpu"), measure=not c.local_only and c.caps is None)
    if slow:
        c.warn(UserError(f"{slow}: training is far slower than in fp32", {"speed.precision": "fp32"}))


def loggers_rule(c: Check) -> None:
    """--log: a logger whose package is missing is refused before the data is opened or a byte written."""
    if c.config.train.log:
        from engine.run import loggers

        loggers.check(c.config.train.log)


def dataset_rule(c: Check) -> None:
    """The dataset's vocab and length, bound into the config: opened (path, vocab, block size,
    the short-train note), or judged from its info alone (the form: the vocab, for the estimate)."""
    if c.data is False:
        return
    if isinstance(c.data, DatasetInfo):
        info, T = c.data, c.config.seq_len
        vocab = dataset_vocab(c.config, info)
        shortest = min(info.train_tokens, info.val_tokens)
        if T > 0 and shortest < T + 1:
            fixes = [{"train.block_size": f"{shortest - 1} or less"}] if shortest >= 2 else []
            c.refuse(UserError(f"the dataset is shorter than one block of {T} tokens", *fixes, also="use more data"),
                     "train.block_size")  # fmt: skip
        c.config = c.config.model_copy(update={"model": c.config.model.model_copy(update={"vocab_size": vocab})})
        return
    if c.verdict.found:
        return  # refused already: the data is not opened (nor the default dataset built) for nothing
    notes = c.config.notes
    if c.data is True:
        c.config, c.verdict.dataset = open_data(c.config)
    else:
        c.config, c.verdict.dataset = bind(c.config, c.data), c.data
    c.config._notes = [*notes, *[n for n in c.config.notes if n not in notes]]


def bind(config: RunConfig, ds: Dataset) -> RunConfig:
    """`config` bound to an already opened dataset (its path, vocab and block size), as open_data binds it."""
    vocab = dataset_vocab(config, ds.info)
    ds.check_block(config.seq_len)
    data = config.model_dump()
    data["data"]["path"] = ds.info.path
    data["model"]["vocab_size"] = vocab
    data["train"]["block_size"] = config.seq_len
    bound = RunConfig.model_validate(data)
    bound._notes = [*config.notes, *short_train_notes(bound, ds.info.train_tokens)]
    return bound


def documents_rule(c: Check) -> None:
    """data.align_docs: a dataset that records its end-of-text id (its info: the form), with enough
    documents to start a batch's rows at (opened: their starts found here, once, for the run)."""
    if not c.config.data.align_docs or c.data is False:
        return
    from engine.train import batches

    if isinstance(c.data, DatasetInfo):
        batches.check_eot(c.data)
    elif c.verdict.dataset is not None:
        T, train = c.config.seq_len, c.verdict.dataset.train
        seen = batches.reach(batches.documents(c.verdict.dataset, T, c.config.train.batch_size), train, T)
        if seen < 0.5:  # long documents: only their first block is ever trained on
            c.warn(UserError(f"data.align_docs: rows from document starts reach only {seen:.0%} of the train "
                             f"split's tokens (its documents are longer than a block of {T})"))  # fmt: skip


def choose_loss(kind: str, plain_fits: bool) -> tuple[str, str]:
    """model.loss = "auto" on a device of `kind`: (the loss, why). On a GPU the plain loss, compiled,
    moves ~3x fewer bytes than the chunked one (~4-5 ms a step at GPT-2 124M on an H100, by the
    arithmetic), so it is taken wherever its logits fit; on a CPU the chunked one measured faster
    (1.21x nano's step on a 2-core CPU) and holds less."""
    if kind == "cpu":
        return "chunked", "on a CPU the chunked loss measured faster and holds less"
    if plain_fits:
        return "plain", "its logits fit this GPU, where the plain loss is the faster"
    return "chunked", "the plain loss's logits would not fit this GPU"


def tuned_rule(c: Check) -> None:
    """speed.from_tuned: a new run starts from the switches a tune saved for this machine, torch
    and model shape (engine/run/tuned.py, read by the file rules); the flags the user gave win. Said
    either way as the run starts; a resume keeps its own switches, a live toggle is judged as asked."""
    if not c.config.speed.from_tuned or c.resume or c.data is False or isinstance(c.data, DatasetInfo):
        return
    from engine.run import tuned

    c.config, line = tuned.from_tuned(c.config, dict(c.explicit or {}))
    c.config._notes = [*c.config.notes, line]


def loss_rule(c: Check) -> None:
    """model.loss = "auto": chosen for the device the run is on (choose_loss), bound into the config
    (the run's config.toml and run_started say which) and said with why as the run starts."""
    if c.config.model.loss != "auto":
        return
    from engine import device
    from engine.train import memory

    kind = device.kind(c.config.speed.device)
    plain = c.config.model_copy(update={"model": c.config.model.model_copy(update={"loss": "plain"})})
    fits = True
    if kind != "cpu":
        total, _ = device.budget(kind, c.held)
        fits = total is None or memory.estimate(memory.with_dataset_vocab(plain)).fits(total)
    chosen, why = choose_loss(kind, fits)
    notes = c.config.notes
    c.config = c.config.model_copy(update={"model": c.config.model.model_copy(update={"loss": chosen})})
    c.config._notes = [*notes, f"loss auto: {chosen} ({why})"]


def memory_rule(c: Check) -> None:
    """The estimate (the form's and the dialog's panels show it) and, when asked, the refusal of
    what will not fit the device (engine.train.memory.check_fits: the budget the run will have)."""
    import os

    from engine.train import memory

    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    sharding: memory.Sharding = "fsdp" if c.config.speed.parallel == "fsdp" else "ddp"
    sized = memory.with_dataset_vocab(c.config)
    c.verdict.estimate = memory.estimate(sized, world, sharding)
    if c.memory and not c.verdict.found:
        memory.check_fits(sized, c.force, c.held)


def no_effect_warnings(c: Check) -> None:
    """Inputs the user gave that change nothing (issue 39), one line each."""
    o = c.config.optim
    if o.schedule == "cosine" and c.given("optim.decay_fraction"):
        c.warn(UserError(f"decay fraction {o.decay_fraction:g} has no effect with the cosine schedule "
                         "(it sizes the wsd decay)", {"optim.schedule": "wsd"}))  # fmt: skip
    chose_adamw = c.explicit is not None and c.explicit.get("optim.optimizer") == "adamw"  # over a Muon preset
    if o.optimizer == "adamw":
        for dotted in (d for d, (mode, _) in ONLY_UNDER.items() if mode == "optim.optimizer"):
            if c.given(dotted) or (chose_adamw and getattr(o, dotted.split(".")[1]) != _default(dotted)):
                name = dotted.split(".")[1].replace("_", " ")
                c.warn(UserError(f"{name} {getattr(o, dotted.split('.')[1]):g} has no effect with the AdamW optimizer "
                                 "(it is Muon's)", {"optim.optimizer": "muon"}))  # fmt: skip
    n = c.config.train.max_steps
    asked = any(c.given(d) for d in ("optim.schedule", "optim.decay_fraction", "optim.decay_steps", "train.max_steps"))
    if o.schedule == "wsd" and asked and o.decay_end(n) - o.decay_start(n) < 1:
        c.warn(UserError(f"the wsd decay is shorter than one step (decay fraction {o.decay_fraction:g} of "
                         f"{o.decay_end(n)} steps): the lr stays at its peak to the end",
                         {"optim.decay_fraction": _at_least(1 / max(o.decay_end(n), 1))}))  # fmt: skip
    m, T = c.config.model, c.config.seq_len
    if c.given("model.attn_window") and m.attn_window is not None and T > 1 and m.attn_window >= T - 1:
        c.warn(UserError(f"attention window {m.attn_window} has no effect at a block of {T} tokens (a token sees at "
                         f"most {T - 1} before it already)", {"model.attn_window": f"{max(T - 2, 1)} or less"}))


def window_kernel(c: Check) -> None:
    """A sliding window on a GPU that will not run it through FlexAttention (uncompiled, with
    dropout, or a sequence off flex's block: engine.train.window.flex_reason) runs SDPA's dense
    masked kernel, which computes the whole T x T: every step costs more than without the window.
    Said with the fix, as the run starts and in the form (a CPU has no flex backward: its dense
    band is what the ladder measured)."""
    from engine import device
    from engine.train.window import FLEX_BLOCK, banded, flex_reason

    m, s, T = c.config.model, c.config.speed, c.config.seq_len
    if device.kind(s.device) != "cuda" or m.attention != "flash" or not banded(m.attn_window, T):
        return
    why = flex_reason("cuda", s.compile, m.attn_window, T, m.dropout)
    if why is None:
        return
    fixes = ([{"speed.compile": True}] if not s.compile else [{"model.dropout": 0}] if m.dropout > 0 else
             [{"train.block_size": T - T % FLEX_BLOCK}] if T >= FLEX_BLOCK else [])  # fmt: skip
    c.warn(UserError(f"attention window {m.attn_window} runs SDPA's dense masked kernel here ({why}): every step "
                     "computes the whole T x T and costs more than without the window", *fixes))  # fmt: skip


def _at_least(fraction: float) -> str:
    """A decay fraction to advise: at least `fraction`, within its bound (1: the whole run decays)."""
    return "1" if fraction >= 1 else f"{fraction:.3g} or more"


RULES: list[Rule] = [pretrained_shape, device_rule, emulated_precision, loggers_rule, dataset_rule, documents_rule,
                     tuned_rule, loss_rule, memory_rule, no_effect_warnings, window_kernel]  # fmt: skip


def preflight(
    config: RunConfig, *, dataset: Dataset | DatasetInfo | bool = True, caps: Capabilities | None = None,
    explicit: Mapping[str, Any] | None = None, held: int | None = None, force: bool = False,
    local_only: bool = False, resume: bool = False, memory: bool = True,
) -> Verdict:  # fmt: skip
    """The one judgement of a config before it runs, for every front door: each rule of RULES
    in order (pretrained shape, device, an emulated precision, loggers, dataset vocab and length,
    documents, the tuned switches (--from-tuned), the loss auto picks, memory, inputs of no effect,
    a window a GPU would run densely).
    `dataset`: True opens it (the CLI, bench), an opened Dataset is bound, a DatasetInfo judged
    (the form), False leaves the data alone (a live toggle: the run's own). A rule that raises
    UserError refuses; the others still judge (the form shows every field's refusal)."""
    verdict = Verdict()
    c = Check(config, dataset, caps, explicit, held, force, local_only, resume, memory, verdict)
    for rule in RULES:
        try:
            rule(c)
        except UserError as err:
            c.refuse(err)
    verdict.judged = c.config
    if not verdict.found:
        bound = c.config.model_copy()
        bound._notes = [*c.config.notes, *[str(w) for w in verdict.warnings if str(w) not in c.config.notes]]
        bound._preflighted = c.complete and dataset is not False and not isinstance(dataset, DatasetInfo)
        verdict.config = bound
    return verdict


def prepared(config: RunConfig, **options: Any) -> tuple[RunConfig, Dataset]:
    """preflight's config and opened dataset, or its first refusal raised (the measuring tools)."""
    verdict = preflight(config, **options)
    bound = verdict.raise_first()
    assert verdict.dataset is not None
    return bound, verdict.dataset
