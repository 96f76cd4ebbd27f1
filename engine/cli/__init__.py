"""The headless commands: train, estimate, prepare, sample, export, toggle, compare, doctor.

`python -m engine.cli train ...` (engine/cli/__main__.py) is what torchrun runs (no UI is loaded); `gpt2-tui`
(gpt2_tui.py) adds the app, `attach` and the measuring tools (bench/) on top of this parser.
Here argparse is turned into typed engine calls; the flags of `train` and `estimate` are
generated from the config models (engine.settings), so each is described once. Bad input
anywhere is one line on stderr and exit status 2; nothing is written.
"""

from __future__ import annotations

import os

# MKL's dynamic threading picks a thread count per call from the machine's load, which changes
# the order of float sums: on a busy machine 2 of 14 identical CPU runs drifted in the last bits
# (0 of 8 with it off). Off by default, so same seed + config = same curve; set before torch
# loads (both entry points import this module first); a value the user set is kept.
os.environ.setdefault("MKL_DYNAMIC", "FALSE")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, NoReturn  # noqa: E402

from engine import child, settings  # noqa: E402
from engine.console import err, out, route_warnings  # noqa: E402
from engine.config import DEFAULT_VOCAB, MAX_CONTEXT, MAX_VOCAB, SEED_LIMIT  # noqa: E402
from engine.errors import UserError  # noqa: E402
from engine.text import path_text, program  # noqa: E402


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit status 2, and no flag is abbreviated:
    `--max-step` is refused (did you mean --max-steps?), not taken for `--max-steps`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        err.line(f"error: {message}; see `{self.prog} --help`")
        sys.exit(2)


class Bounded:
    """An argparse type: a whole number in [lo, hi], else argparse's one-line error. Every integer
    flag uses one, except config settings (bounded in engine.config) and bench's numbers (bounded
    in bench.common.BenchOptions): tests/config/test_input_checks.py holds every flag to that."""

    def __init__(self, lo: int, hi: int) -> None:
        self.lo, self.hi = lo, hi
        self.__name__ = "int"  # what argparse names in "invalid int value"

    def __call__(self, text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not self.lo <= value <= self.hi:
            raise argparse.ArgumentTypeError(f"{value} is out of range; pass {self.lo} to {self.hi}")
        return value


SEED = Bounded(0, SEED_LIMIT - 1)


def target_loss(text: str) -> float:
    """An argparse type: a val loss to time runs to (`--target`), a finite number above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (value > 0 and value < float("inf")):
        raise argparse.ArgumentTypeError(f"{text} is not a val loss; pass a number above 0, e.g. 4.5")
    return value


target_loss.__name__ = "loss"


def add_setting_flags(p: argparse.ArgumentParser, only: tuple[str, ...] | None = None) -> None:
    """One flag per config setting (or per setting in `only`), with the setting's own
    description; booleans get --x / --no-x."""
    for s in settings.flags():
        if only is not None and s.dotted not in only:
            continue
        help_ = s.help.replace("%", "%%")
        if s.kind in ("bool", "tristate"):
            p.add_argument(s.flag, dest=s.dotted, action=argparse.BooleanOptionalAction, default=None, help=help_)
        elif s.kind == "choice":
            p.add_argument(s.flag, dest=s.dotted, choices=s.choices, default=None, help=help_)
        elif s.kind == "multi":  # --log tensorboard csv, or --log tensorboard --log csv
            p.add_argument(s.flag, dest=s.dotted, choices=s.choices, nargs="+", action="extend", default=None, help=help_)
        else:
            kind = {"int": int, "float": float}.get(s.kind, str)
            p.add_argument(s.flag, dest=s.dotted, type=kind, metavar=s.metavar, default=None, help=help_)


def as_flags(overrides: dict[str, Any]) -> list[str]:
    """The flags that give these config values: overrides_from's inverse, for advice that runs as printed."""
    by_name = {s.dotted: s for s in settings.flags()}
    out: list[str] = []
    for dotted, value in overrides.items():
        flag = by_name[dotted].flag
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, list):
            out += [flag, *map(str, value)]
        else:
            out += [flag, str(value)]
    return out


def overrides_from(args: argparse.Namespace) -> dict[str, Any]:
    """The config values the user gave as flags, by dotted name."""
    given = ((s.dotted, getattr(args, s.dotted, None)) for s in settings.flags())
    return {dotted: value for dotted, value in given if value is not None}


def build_parser(prog: str = "gpt2-tui") -> tuple[Parser, Any]:
    """The parser of the headless commands, and its subparsers (gpt2_tui adds the UI's)."""
    parser = Parser(prog=prog, description="Train GPT-2-class models fast, and watch it live.")
    sub = parser.add_subparsers(dest="command", parser_class=Parser)

    t = sub.add_parser("train", help="train a model (headless, events to the console and the run dir)")
    t.add_argument("--preset", help="model preset name (see presets/) or a TOML file; default nano")
    t.add_argument("--config", type=Path, metavar="FILE", help="run config TOML (same schema as a run's config.toml)")
    t.add_argument("--out", type=Path, metavar="DIR", help="new (or empty) run directory (default runs/PRESET-TIMESTAMP)")
    t.add_argument("--resume", type=Path, metavar="RUN_DIR", help="continue a run from its latest checkpoint")
    t.add_argument("--from", dest="resume_from", metavar="best|STEP|FILE",
                   help="with --resume: continue from this checkpoint instead (later ones are moved aside, not deleted)")
    t.add_argument("--headless", action="store_true", help="no TUI: events go to the console (always so for train)")
    t.add_argument("--force", action="store_true", help="start even when the memory estimate says it does not fit")
    t.add_argument("--nproc", type=Bounded(1, 4096), metavar="N", help="train on N processes of this machine (torchrun; gloo on CPU)")
    add_setting_flags(t)

    e = sub.add_parser("estimate", help="predict peak memory, part by part, and whether it fits")
    e.description = "Predict the peak device memory of a config; exit 0 when it fits (or memory is unknown), 1 when not."
    e.add_argument("--preset", help="model preset name or TOML file (default gpt2)")
    e.add_argument("--config", type=Path, metavar="FILE", help="run config TOML")
    e.add_argument("--device-memory", metavar="SIZE", help="plan for a device with this much memory (80GiB, 24GB)")
    e.add_argument("--world-size", type=Bounded(1, 2**20), default=1, metavar="N", help="ranks sharing the run")
    e.add_argument("--sharding", choices=["ddp", "fsdp"], default="ddp", help="how ranks split the model state")
    e.add_argument("--json", action="store_true", help="print the MemoryEstimate as JSON instead of the table")
    add_setting_flags(e)

    p = sub.add_parser("prepare", help="tokenize text files, or a Hugging Face dataset, into a dataset")
    p.add_argument("paths", nargs="*", type=Path, metavar="PATHS", help="text files (read whatever their name) or directories, "
                   "walked for text files: by suffix (.txt .md .py ...), none (README), or gzipped (.txt.gz)")
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="new (or empty) dataset directory")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--vocab-size", type=Bounded(257, MAX_VOCAB), default=DEFAULT_VOCAB, metavar="N",
                   help=f"with a trained BPE (--tokenizer bpe, the default for files): N entries (default {DEFAULT_VOCAB})")  # fmt: skip
    source.add_argument("--tokenizer", metavar="gpt2|bpe|FILE", help="gpt2: GPT-2's own BPE (50257 ids, from the Hub's cache; "
                   "the default with --hf-dataset); bpe: train a byte-level BPE (the default for files); FILE: a tokenizer.json "
                   "(or a directory holding one, e.g. a transformers model's)")
    p.add_argument("--val-fraction", type=float, default=0.05, metavar="F",
                   help="share held out for val: the end of each file's tokens; with --hf-dataset, that share of the documents (default %(default)s)")
    p.add_argument("--seed", type=SEED, default=0, metavar="S",
                   help="seed of the order of the documents in the token files (default %(default)s)")
    hub = p.add_argument_group("Hugging Face datasets (pip install gpt2-tui[datasets]); streamed, resumable if interrupted")
    hub.add_argument("--hf-dataset", metavar="NAME", help="a Hub dataset (HuggingFaceFW/fineweb-edu, Skylion007/openwebtext...), "
                     "or json|parquet|text|csv with --data-files")
    hub.add_argument("--config", dest="hf_config", metavar="C", help="the dataset's config (subset), e.g. sample-10BT")
    hub.add_argument("--split", default="train", metavar="S", help="the split to read (default train)")
    hub.add_argument("--text-field", default="text", metavar="F", help="the field holding each document's text (default text)")
    hub.add_argument("--data-files", nargs="+", default=[], metavar="FILE", help="local files for json|parquet|text|csv")
    hub.add_argument("--max-tokens", type=Bounded(2, 2**62), metavar="N", help="stop after N tokens (train + val)")

    s = sub.add_parser("sample", help="generate text from a run or checkpoint",
                       usage="%(prog)s [options] RUN_DIR_OR_CHECKPOINT")  # the options, each with its default, follow
    s.add_argument("path", type=Path, metavar="RUN_DIR_OR_CHECKPOINT")
    s.add_argument("--prompt", default="", help="text to continue")
    s.add_argument("--max-new-tokens", type=Bounded(1, MAX_CONTEXT), default=200, metavar="N",
                   help="how many tokens to generate after the prompt (default %(default)s)")
    s.add_argument("--temperature", type=float, default=0.8, metavar="X",
                   help="sharpness of the sampling: below 1 more predictable, above 1 more varied (default %(default)s)")
    s.add_argument("--top-k", type=Bounded(1, MAX_VOCAB), default=50, metavar="K",
                   help="sample only among the K likeliest next tokens (default %(default)s)")
    s.add_argument("--seed", type=SEED, default=None, metavar="S", help="seed for repeatable text (default: random)")
    s.add_argument("--device", default="cpu", choices=["cpu", "cuda", "mps"], help="where to run the model (default %(default)s)")
    s.add_argument("--tokenizer", type=Path, metavar="FILE", help="tokenizer.json, when the run has none")
    s.add_argument("--raw", action="store_true",
                   help="write the text as generated, control characters included, even to a terminal "
                        "(a pipe or file always gets it raw)")  # fmt: skip

    from engine.run.segments import SWITCHES

    g = sub.add_parser("toggle", help="change a live run's speed switches at its next step boundary (a new segment)")
    g.add_argument("run_dir", type=Path, metavar="RUN", help="the run directory of a run training now")
    add_setting_flags(g, only=SWITCHES)
    g.add_argument("--tune", action="store_true", help="start the run's tuner: it tries the speed switches as segments "
                   "and keeps the fastest (docs/training.md); give it alone")  # fmt: skip

    x = sub.add_parser("export", help="write a run's model as a transformers GPT-2 directory (config.json, model.safetensors, tokenizer)")
    x.add_argument("run", type=Path, metavar="RUN", help="a run directory, or one checkpoint file")
    x.add_argument("--from", dest="which", metavar="best|STEP", help="which checkpoint of the run (default: the latest)")
    x.add_argument("--hf", type=Path, required=True, metavar="DIR", help="new (or empty) directory for the transformers model")

    c = sub.add_parser("compare", help="runs and their segments side by side: settled speed, time to a val loss, "
                       "the recipe and the settings that differ")
    c.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN", help="run directories (live or finished)")
    c.add_argument("--json", action="store_true", help="print the runs and segments as JSON instead of the table")
    c.add_argument("--target", type=target_loss, metavar="LOSS", help="the val loss to time each run to: training time "
                   "(sum of step times) and tokens to first reach it (default: the worst final val loss among the runs)")
    d = sub.add_parser("doctor", help="what this box can run: versions, GPU, compile, and a short run of each switch")
    d.add_argument("--json", action="store_true", help="print the checks as JSON instead of the table")
    d.add_argument("--compile", action="store_true", help="on CPU, also run torch.compile (about 40 s; always on CUDA)")
    d.add_argument("--no-runs", dest="runs", action="store_false", help="only the checks, no short training runs")
    return parser, sub


# ---------------------------------------------------------------- the commands


def cmd_doctor(args: argparse.Namespace) -> int:
    """The table (or --json); exit 1 when a check found a problem, each named in one line with its fix."""
    from engine.inspect import doctor

    say = None if args.json else (lambda line: err.line(line, flush=True))
    rows = doctor.diagnose(runs=args.runs, include_compile=args.compile, say=say)
    if args.json:
        out.json(doctor.to_json(rows), indent=1)
    else:
        out.line(doctor.to_table(rows))
    return 1 if doctor.problems(rows) else 0


def cmd_train(args: argparse.Namespace, argv: list[str]) -> int:
    from engine.train import distributed
    from engine.run import torchrun
    from engine.run.requests import Control
    from engine.events import CallbackSink, ConsoleSink, RunStarted
    from engine.run.preflight import new_config, preflight, resumed_config
    from engine.run.owner import start

    overrides = overrides_from(args)
    if args.resume:
        if args.preset or args.config or args.out:
            raise UserError("--resume takes its config and directory from the run; drop --preset/--config/--out")
        if "model.init_from" in overrides:
            raise UserError("--init-from starts a new run; a --resume continues from its checkpoint: drop --init-from")
        config, run_dir = resumed_config(args.resume, overrides, args.resume_from), args.resume
        if args.resume_from:  # named, so checked here, before anything runs
            from engine.train.checkpoint import CheckpointDir

            CheckpointDir(run_dir / "checkpoints").resolve(args.resume_from)
    else:
        if args.resume_from:
            raise UserError("--from picks the checkpoint a --resume continues from; add --resume RUN_DIR")
        config, run_dir = new_config(args.preset, args.config, overrides, args.out)
    relaunch = torchrun.requested(args.nproc)  # --nproc N: check everything, then relaunch under torch.distributed.run
    # the one judgement (shape, data, device, memory; warnings ride in config.notes, said as the run starts);
    # --nproc: the launcher opens the data and judges the memory per rank (engine.run.torchrun), each rank again
    verdict = preflight(config, explicit=overrides, force=args.force, resume=bool(args.resume), dataset=not relaunch,
                        memory=not relaunch)  # fmt: skip
    config = verdict.raise_first()
    if relaunch:
        return torchrun.run(args.nproc, config, run_dir, bool(args.resume), args.force, argv, out_given=bool(args.out))
    control = Control()
    said: list[bool] = []

    def follow(event: Any) -> None:
        """Where to follow and steer it, said as it starts (before the first step: a second terminal
        can follow it at once), once its set-up has passed: a refusal there is its one line."""
        if isinstance(event, RunStarted) and not said and distributed.current().is_main:
            said.append(True)
            out.line(following_text(run_dir, config.speed.compile), flush=True)

    run = start(config, run_dir, resume=bool(args.resume), control=control, force=args.force,
                sinks=[CallbackSink(follow), ConsoleSink(settled_before=settled_before(run_dir))],
                resume_from=args.resume_from, dataset=verdict.dataset)
    run_dir = run.run_dir
    restore = _steer_by_signals(control, distributed.current().enabled)
    try:
        run.run()  # a live toggle (engine/run/toggle.py) continues the run in a new segment
    finally:
        restore()
        del run  # its model holds the process group: freed before the group ends (distributed.shutdown)
        distributed.shutdown()
    if distributed.current().is_main:
        out.line(f"run directory: {path_text(run_dir)}")
    return 0


def refuse_finished(run_dir: Path, overrides: dict[str, Any]) -> None:
    """`toggle` on a run that is not live, whose resume would have nothing left to train (its
    latest checkpoint at its max steps): trained_past's refusal (the one wording), whose advice
    names a larger --max-steps and keeps the switches asked for, so following it trains."""
    from engine import rundir
    from engine.train.checkpoint import CheckpointDir
    from engine.train.saving import trained_past

    step = CheckpointDir(run_dir / rundir.CHECKPOINTS).latest_step()
    if step is None:
        return
    limit = overrides.get("train.max_steps") or rundir.load_config(run_dir).train.max_steps
    if limit <= step:
        given = {k: v for k, v in overrides.items() if k != "train.max_steps"}
        raise trained_past(run_dir, step, limit, as_flags(given))


def settled_before(run_dir: Path) -> Callable[[int], Any]:
    """The console's fallback at a run's end when its last segment is too short to settle: the
    last segment of the run (its events) that settled before a step (None: none did)."""

    def last(step: int) -> Any:
        from engine import rundir
        from engine.events import read_events
        from engine.run.segments import segments_of

        try:
            events, _ = read_events(run_dir / rundir.EVENTS)
        except (UserError, OSError):  # a nicety: the end is said without it
            return None
        done = [s for s in segments_of(events) if s.settled_step_time_s is not None and s.to_step <= step]
        return done[-1] if done else None

    return last


def following_text(run_dir: Path, compiled: bool) -> str:
    """Where a headless run writes and how to watch and steer it from another terminal."""
    prog, where = program(), path_text(run_dir)  # a name may hold ESC: escaped, and still findable
    return (f"run directory: {where}\n"
            f"follow it: {prog} attach {where}\n"
            f"change its speed switches live: {prog} toggle {where} {'--no-compile' if compiled else '--compile'} "
            f"(see `{prog} toggle --help`)")  # fmt: skip


def _steer_by_signals(control: Any, distributed_run: bool) -> Callable[[], None]:
    """First Ctrl-C / SIGTERM: stop at the step boundary with a checkpoint; second: at once.
    (Every other request reaches the run through its mailbox, engine/run/requests.py.)"""

    def on_stop(signum: int, _frame: Any) -> None:
        if not distributed_run:  # ranks stop together at a step boundary; torchrun escalates to SIGKILL
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        control.stop()
        err.line(f"\n{signal.Signals(signum).name}: saving a checkpoint and stopping (again to quit now)")

    previous = signal.signal(signal.SIGINT, on_stop), signal.signal(signal.SIGTERM, on_stop)

    def restore() -> None:
        signal.signal(signal.SIGINT, previous[0])
        signal.signal(signal.SIGTERM, previous[1])

    return restore


def cmd_estimate(args: argparse.Namespace) -> int:
    from engine import device, text
    from engine.train import memory
    from engine.config import resolve

    if args.world_size < 1:
        raise UserError(f"--world-size must be at least 1 (got {args.world_size})")
    overrides = overrides_from(args)
    device_bytes = text.parse_bytes(args.device_memory) if args.device_memory else None
    if device_bytes is not None and overrides.get("speed.device", "auto") == "auto":
        overrides["speed.device"] = "cuda"  # a memory size to plan for means a GPU
    config = resolve(args.preset or (None if args.config else "gpt2"), args.config, overrides)
    for note in config.notes:
        out.line(note)
    from engine.run.preflight import with_pretrained_shape

    config = with_pretrained_shape(config, {k[6:]: v for k, v in overrides.items() if k.startswith("model.")})
    if config.data.path is not None:
        from engine.dataset import check_dir

        check_dir(Path(config.data.path).expanduser())  # a path that is no dataset: one line, not a guess
    size = memory.size_text(config)  # the model's own size, and what the dataset's vocab makes of it
    config = memory.with_dataset_vocab(config)
    est = memory.estimate(config, args.world_size, args.sharding)
    if device_bytes is None:
        device_bytes, _ = device.budget(est.target)  # None when this machine lacks that device
    fits = device_bytes is None or est.fits(device_bytes)
    if args.json:
        out.json(est.model_dump(mode="json"), indent=2)
    else:
        out.line(text.format_table(est, device_bytes, size))
        if est.target == "cpu":  # a half precision this CPU emulates: fits, but far slower than fp32
            from engine.train.contention import half_reason

            slow = half_reason(device.precision(config.speed.precision, "cpu"))
            if slow:
                out.line(f"note: {slow}; prefer --precision fp32 here")
        if not fits:
            out.line(text.advice(memory.suggest_fit(config, device_bytes, args.world_size, args.sharding)))  # type: ignore[arg-type]
    return 0 if fits else 1


def cmd_prepare(args: argparse.Namespace) -> int:
    if args.hf_dataset:
        return cmd_prepare_hub(args)
    hub_only = [f for f, v in (("--config", args.hf_config), ("--data-files", args.data_files), ("--max-tokens", args.max_tokens)) if v]
    if hub_only or args.split != "train" or args.text_field != "text":
        raise UserError(f"{(hub_only or ['--split/--text-field'])[0]} reads a Hugging Face dataset; add --hf-dataset NAME")
    if not args.paths:
        raise UserError("name the text files or directories to tokenize, or pass --hf-dataset NAME")
    from engine.prep.prepare import prepare_report, skipped_text

    tokenizer = None
    if args.tokenizer not in (None, "bpe"):
        from engine.prep.hub import resolve_tokenizer

        tokenizer = resolve_tokenizer(args.tokenizer)  # gpt2 (the Hub's cache), a tokenizer.json or a model directory
    report = prepare_report(
        list(args.paths), args.out, vocab_size=args.vocab_size, tokenizer=tokenizer,
        val_fraction=args.val_fraction, seed=args.seed, progress=True,
    )  # fmt: skip
    info = report.info
    out.line(
        f"wrote {path_text(info.path)}: {info.train_tokens:,} train + {info.val_tokens:,} val tokens "
        f"({info.dtype}), vocab {info.vocab_size}, eot id {info.eot_id}; "
        f"{report.train_docs} document{'' if report.train_docs == 1 else 's'}, "
        f"the last {args.val_fraction:.0%} of each held out for val, "
        f"{len(report.skipped)} files skipped; {report.seconds:.1f} s"
    )
    if report.skipped:
        out.line(f"skipped {len(report.skipped)} files: {skipped_text(report.skipped)}")
    for line in report.warnings:  # stderr, as every warning: stdout is the result
        err.line(line)
    return 0


def cmd_prepare_hub(args: argparse.Namespace) -> int:
    """`prepare --hf-dataset NAME`: streamed through `datasets` (engine/prep/hub.py)."""
    import tempfile

    from engine import rundir
    from engine.prep.hub import HubSource, bpe_tokenizer, prepare_hub

    if args.paths:
        raise UserError(f"--hf-dataset reads its own files; pass local ones as --data-files {args.paths[0]} (not as PATHS)")
    source = HubSource(args.hf_dataset, args.hf_config, args.split, [str(f) for f in args.data_files], args.text_field)
    with tempfile.TemporaryDirectory(prefix="gpt2-tui-bpe-") as tmp:
        tokenizer: str | Path = args.tokenizer or "gpt2"
        if tokenizer == "bpe":
            rundir.check_new(args.out)  # before minutes of training a tokenizer
            tokenizer = bpe_tokenizer(source, args.vocab_size, Path(tmp))
        report = prepare_hub(source, args.out, tokenizer, args.max_tokens, args.val_fraction, args.seed, progress=True)
    info = report.info
    resumed = f", resumed after {report.resumed_from:,} documents" if report.resumed_from else ""
    out.line(
        f"wrote {path_text(info.path)}: {info.train_tokens:,} train + {info.val_tokens:,} val tokens ({info.dtype}), "
        f"vocab {info.vocab_size}, eot id {info.eot_id}; {report.documents:,} documents{resumed}; {report.seconds:.1f} s"
    )
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """`export RUN --hf DIR`: the run's weights and tokenizer as a transformers GPT-2 directory."""
    from engine.inspect import export

    hf_dir = export.export_run(args.run, args.hf, args.which)
    out.line(f"wrote {path_text(hf_dir)}: transformers.GPT2LMHeadModel.from_pretrained({str(hf_dir)!r}) loads it")
    return 0


def cmd_sample(args: argparse.Namespace) -> int:
    import math

    from engine.inspect.sample import find_tokenizer, load_model, source_text
    from engine.prep.tokenizer import load_tokenizer
    from engine.train.generate import generate_text

    if args.max_new_tokens < 1 or args.top_k < 1 or not (math.isfinite(args.temperature) and args.temperature > 0):
        raise UserError("--max-new-tokens and --top-k must be >= 1 and --temperature a number > 0")
    loaded = load_model(args.path, args.device)
    tokenizer = load_tokenizer(args.tokenizer or find_tokenizer(args.path, loaded.path))
    err.line(source_text(loaded), flush=True)  # stderr: stdout is the text alone, for pipes
    text = generate_text(loaded.model, tokenizer, args.prompt, args.max_new_tokens, args.temperature, args.top_k, args.seed)
    # a terminal never gets the model's control characters raw (ESC]0; retitles it): a pipe or --raw does
    if args.raw or not out.isatty():
        out.raw(text)  # the one raw path (documented in --raw's help)
    else:
        out.line(text)
    return 0


# ---------------------------------------------------------------- entry


def cmd_toggle(args: argparse.Namespace) -> int:
    """Ask a live run for new switches: checked here first (as a launch is), applied by the
    run at its next step boundary, which checks again (engine/run/toggle.py)."""
    from engine.run import requests, toggle
    from engine import rundir
    from engine.config import overlay
    from engine.text import change_text, short, value_text
    from engine.run.segments import changed, switches

    config = rundir.load_config(args.run_dir)
    overrides = overrides_from(args)
    if args.tune:
        return _ask_tune(args, overrides)
    if not overrides:
        raise UserError(f"name the switches to change, e.g. --compile or --no-prefetch; see `{program()} toggle --help`")
    overlay(config.model_dump(mode="json", exclude_none=True), overrides)  # the values are valid at all
    if rundir.writer_alive(args.run_dir) is not True:
        where = path_text(args.run_dir)
        try:  # a run at its max steps resumes only to more steps: the advice says how many
            refuse_finished(args.run_dir, overrides)
        except UserError as finished:
            raise UserError(f"no live run writes {where}; change a stopped run's switches as you resume it, but "
                            f"{finished}") from None  # fmt: skip
        raise UserError(
            f"no live run writes {where}; change a stopped run's switches as you resume it: "
            f"{program()} train --resume {where} {' '.join(as_flags(overrides))}"
        )
    waiting = requests.pending(args.run_dir)  # asked, not yet taken by the run
    after = config
    for asked_before in waiting:
        try:
            after = overlay(after.model_dump(mode="json", exclude_none=True), asked_before)
        except UserError:
            continue  # the run refuses that one itself
    if waiting and toggle.already_on(after, overrides) is not None:
        what = "; ".join(", ".join(f"{short(n)} -> {value_text(v)}" for n, v in p.items()) for p in waiting)
        raise UserError(f"already pending: {path_text(args.run_dir)} has not yet taken the toggle{'s' * (len(waiting) > 1)} "
                        f"asked before ({what}), which already asks for this; it applies at the next step boundary "
                        f"(`{program()} attach {path_text(args.run_dir)}` shows the new segment)")
    verdict = toggle.judge(config, overrides)
    new = verdict.raise_first()
    diff = changed(switches(config), switches(new))
    for why in verdict.warnings:  # what the new set costs, said before it is asked for (an emulated precision)
        out.line(f"note: {why}")
    if not changed(toggle.effective(config), toggle.effective(new)):  # as they resolve here, not as words
        raise UserError(f"{args.run_dir} already runs with those switches; nothing to change")
    try:
        asked = toggle.request(args.run_dir, {name: new for name, (_, new) in diff.items()})
    except OSError as failure:
        raise UserError(f"could not write the request into {args.run_dir} ({failure.strerror}); free space or fix its permissions") from None
    out.line(f"asked {path_text(args.run_dir)} to switch {change_text(diff)} (request {asked.id}): it applies at the next step boundary "
             f"(`{program()} attach {path_text(args.run_dir)}` shows the new segment)")
    return 0


def _ask_tune(args: argparse.Namespace, overrides: dict[str, Any]) -> int:
    """`toggle RUN --tune`: the live run starts tuning itself at its next step boundary."""
    from engine import rundir
    from engine.run import requests

    where = path_text(args.run_dir)
    if overrides:
        raise UserError(f"give --tune alone: the tuner chooses the switches (drop {' '.join(as_flags(overrides))})")
    if rundir.writer_alive(args.run_dir) is not True:
        raise UserError(f"no live run writes {where}; tune a stopped run as you resume it: "
                        f"{program()} train --resume {where} --tune")  # fmt: skip
    asked = requests.Request("tune")
    try:
        requests.post(args.run_dir, asked)
    except OSError as failure:
        raise UserError(f"could not write the request into {args.run_dir} ({failure.strerror}); free space or fix its permissions") from None
    out.line(f"asked {where} to tune itself (request {asked.id}): it starts at the next step boundary "
             f"(`{program()} attach {where}` shows its trials)")
    return 0


def run_command(args: argparse.Namespace, argv: list[str], rest: list[str]) -> int:
    """Dispatch a parsed headless command (raises UserError on bad input)."""
    if args.command == "train":
        from engine.train.saving import TrainedPast, trained_past

        try:
            return cmd_train(args, argv)
        except TrainedPast as past:  # its advice keeps the flags given: following it trains with them
            given = {k: v for k, v in overrides_from(args).items() if k != "train.max_steps"}
            raise trained_past(past.run_dir, past.step, past.max_steps, as_flags(given)) from None
    if args.command == "estimate":
        return cmd_estimate(args)
    if args.command == "prepare":
        return cmd_prepare(args)
    if args.command == "sample":
        return cmd_sample(args)
    if args.command == "export":
        return cmd_export(args)
    if args.command == "toggle":
        return cmd_toggle(args)
    if args.command == "doctor":
        return cmd_doctor(args)
    if args.command == "compare":
        from engine.inspect import compare

        if args.json:  # re-dumped ASCII-escaped: a run's name or a switch may hold any character
            import json

            out.json(json.loads(compare.run(args.run_dirs, as_json=True, target=args.target)), indent=2)
        else:
            out.line(compare.run(args.run_dirs, target=args.target))
        return 0
    raise UserError(f"no command given; see `{program()} --help`")


def guarded(body: Callable[[], int], sigterm: bool = True) -> int:
    """Run a command: bad input is one line and exit 2, Ctrl-C 130 (SIGTERM too, unless `sigterm` is
    False: the app, which keeps its own; a command's clean-up runs: engine.child.term_as_interrupt),
    a closed pipe no traceback. A torchrun worker then leaves at once (distributed.leave)."""
    code = _guarded(body, sigterm)
    held = sys.modules.get("engine.train.distributed")  # a process group is made only once it is imported
    return held.leave(code) if held is not None else code


def _guarded(body: Callable[[], int], sigterm: bool) -> int:
    try:
        with child.term_as_interrupt() if sigterm else contextlib.nullcontext():
            return body()
    except UserError as error:
        err.line(f"error: {error}")  # the rule: it may quote a file's contents or name
        return 2
    except KeyboardInterrupt:
        err.line("interrupted")
        return 130
    except BrokenPipeError:  # `gpt2-tui ... | head`: the reader left; no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as failure:  # a write the command could not make (disk full, read-only): one line
        where = f" ({path_text(failure.filename)})" if failure.filename else ""
        err.line(f"error: {failure.strerror or type(failure).__name__}{where}; free space or fix permissions and retry")
        return 2


def parse(parser: Parser, argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The parsed arguments; an unknown one is refused by the subcommand's parser, so the line
    points at that subcommand's --help (`gpt2-tui toggle --help`), where its flags are."""
    args, rest = parser.parse_known_args(argv)
    if rest:
        command = subcommand(parser, args)
        unknown = f"unrecognized arguments: {' '.join(rest)}{did_you_mean(parser, args, rest)}"
        command.error(not_live(args, rest) or unknown)
    return args, rest


def subcommand(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the subcommand `args` were parsed for (the top parser when none was)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and getattr(args, "command", None) in action.choices:
            return action.choices[args.command]
    return parser


def not_live(args: argparse.Namespace, rest: list[str]) -> str:
    """`toggle RUN --optimizer muon`: a setting a live run cannot change (no speed switch) is
    named as such, with the new run that trains with it (this run's config, that flag on top);
    '' when `rest` names no such setting, or the command is not toggle."""
    if getattr(args, "command", None) != "toggle":
        return ""
    names = {s.flag: s for s in settings.flags()} | {"--no-" + s.flag[2:]: s for s in settings.flags()
                                                       if s.kind in ("bool", "tristate")}  # fmt: skip
    flag = next((w.split("=", 1)[0] for w in rest if w.split("=", 1)[0] in names), None)
    if flag is None:
        return ""
    label, prog = names[flag].label, program()
    named = flag if label.replace(" ", "-") in flag else f"{flag} ({label})"
    why = (f"{named} is not a live switch: a toggle changes only a running run's speed switches; "
           "to train with it, start a new run")  # fmt: skip
    from engine import rundir

    run_dir = Path(args.run_dir)
    if not (run_dir / rundir.CONFIG).is_file():
        return f"{why} (`{prog} train --help`)"
    new = run_dir.parent / f"{run_dir.name}-new"
    n = 2
    while new.exists():
        new, n = run_dir.parent / f"{run_dir.name}-new{n}", n + 1
    given = [*as_flags(overrides_from(args)), *rest]
    return f"{why} from this one's config: {prog} train --config {path_text(run_dir / rundir.CONFIG)} " \
           f"--out {path_text(new)} {' '.join(given)}"  # fmt: skip


def did_you_mean(parser: argparse.ArgumentParser, args: argparse.Namespace, rest: list[str]) -> str:
    """'; did you mean --batch-size?' for the first unknown flag close to one of the command's
    own flags (difflib), else ''."""
    import difflib

    command = subcommand(parser, args)
    flags = [s for a in command._actions for s in a.option_strings if s.startswith("--")]
    for word in rest:
        if word.startswith("--"):
            close = difflib.get_close_matches(word.split("=", 1)[0], flags, n=1, cutoff=0.75)
            if close:
                return f"; did you mean {close[0]}?"
    return ""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, _ = build_parser()
    args, rest = parse(parser, argv)
    route_warnings()  # Python's warnings reach stderr through the same rule
    return guarded(lambda: run_command(args, argv, rest))

