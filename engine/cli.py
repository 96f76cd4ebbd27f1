"""The `gpt2-tui` command: the TUI (bare), train, estimate, prepare, sample, bench, bench-data, attach.

Bad input anywhere is one line on stderr and exit status 2; nothing is written.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any, NoReturn

from engine.config import build, merge, resolve, set_dotted
from engine.errors import UserError

# Every config switch as a flag: (flag, dotted config path, type or "bool", help).
# Booleans get --x / --no-x. Flags left out keep the preset's (or the resumed run's) value.
FLAGS: list[tuple[str, str, Any, str]] = [
    # model
    ("--n-layer", "model.n_layer", int, "transformer blocks"),
    ("--n-head", "model.n_head", int, "attention heads"),
    ("--n-embd", "model.n_embd", int, "embedding width"),
    ("--context", "model.block_size", int, "the model's context length (positions)"),
    ("--vocab-size", "model.vocab_size", int, "vocab (default: the dataset's; nanoGPT/llm.c files: 50257)"),
    ("--pad-vocab", "model.pad_vocab", "bool", "pad the vocab to a multiple of 64 (~3-25%% faster)"),
    ("--bias", "model.bias", "bool", "biases in Linear and LayerNorm"),
    ("--dropout", "model.dropout", float, "dropout probability"),
    ("--attention", "model.attention", ["flash", "manual"], "flash = SDPA (~1.35x, O(T) memory); manual = masked softmax"),
    ("--grad-checkpointing", "model.grad_checkpointing", "bool", "recompute each block in backward: less memory, ~30%% more compute"),
    # data
    ("--data", "data.path", str, "dataset directory (ours, nanoGPT train.bin/val.bin, or llm.c shards); default: the stdlib corpus"),
    ("--preload", "data.preload", "bool", "read tokens into RAM (~2-3x faster random reads than memmap)"),
    ("--vectorized", "data.vectorized", "bool", "one numpy gather per batch (3.4x the per-row loop here; see docs/benchmarks.md)"),
    ("--pin-memory", "data.pin_memory", "bool", "pinned host memory + non_blocking copies (CUDA)"),
    ("--prefetch", "data.prefetch", "bool", "build the next batch on a background thread"),
    # optimizer
    ("--lr", "optim.lr", float, "peak learning rate"),
    ("--min-lr", "optim.min_lr", float, "learning rate at the end of the cosine"),
    ("--warmup-steps", "optim.warmup_steps", int, "linear warmup steps"),
    ("--decay-steps", "optim.decay_steps", int, "step where the cosine reaches min-lr (default: max-steps)"),
    ("--weight-decay", "optim.weight_decay", float, "AdamW weight decay (matrices and embeddings only)"),
    ("--beta1", "optim.beta1", float, "AdamW beta1"),
    ("--beta2", "optim.beta2", float, "AdamW beta2"),
    ("--grad-clip", "optim.grad_clip", float, "clip the global grad norm to this (0 = off)"),
    ("--fused-adamw", "optim.fused", "bool", "fused AdamW kernel (default: on for CUDA)"),
    # speed
    ("--device", "speed.device", ["auto", "cuda", "mps", "cpu"], "where to train (auto: cuda > mps > cpu)"),
    ("--precision", "speed.precision", ["auto", "fp32", "tf32", "bf16", "fp16"], "tf32 ~3x fp32 on Ampere+; bf16 ~1.1x more; fp16 uses a GradScaler"),
    ("--compile", "speed.compile", "bool", "torch.compile (~1.5-2.3x; first steps slow while compiling)"),
    ("--compile-mode", "speed.compile_mode", ["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"], "torch.compile mode"),
    ("--parallel", "speed.parallel", ["auto", "ddp", "fsdp"], "with --nproc/torchrun: ddp replicates the model, fsdp (FSDP2) shards it; auto = ddp unless only a shard fits"),
    # train
    ("--batch-size", "train.batch_size", int, "micro-batch: sequences per forward pass"),
    ("--block-size", "train.block_size", int, "tokens per sequence (at most --context)"),
    ("--grad-accum", "train.grad_accum", int, "micro-batches per optimizer step"),
    ("--max-steps", "train.max_steps", int, "optimizer steps to train to"),
    ("--eval-interval", "train.eval_interval", int, "steps between val-loss evals"),
    ("--eval-batches", "train.eval_batches", int, "val batches per eval"),
    ("--log-interval", "train.log_interval", int, "steps between step reports (each is a host sync)"),
    ("--ckpt-interval", "train.ckpt_interval", int, "steps between checkpoints"),
    ("--keep-last", "train.keep_last", int, "checkpoints kept besides best.pt"),
    ("--seed", "train.seed", int, "random seed (same seed + config on CPU = same loss curve)"),
    ("--on-save-error", "train.on_save_error", ["continue", "stop"], "a checkpoint write fails (disk full, no permission): warn and retry next interval, or stop"),
    ("--max-bad-steps", "train.max_bad_steps", int, "consecutive NaN/Inf steps (each skipped) before the run stops with a checkpoint of the last good state"),
]


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit status 2."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {message}; see `{self.prog} --help`", file=sys.stderr)
        sys.exit(2)


def _add_flags(p: argparse.ArgumentParser) -> None:
    for flag, dotted, kind, help_ in FLAGS:
        dest = dotted.replace(".", "__")
        if kind == "bool":
            p.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction, default=None, help=help_)
        elif isinstance(kind, list):
            p.add_argument(flag, dest=dest, choices=kind, default=None, help=help_)
        else:
            p.add_argument(flag, dest=dest, type=kind, default=None, help=help_)


def overrides_from(args: argparse.Namespace) -> dict[str, Any]:
    """The config values the user gave as flags, by dotted name."""
    out = {}
    for _, dotted, _, _ in FLAGS:
        value = getattr(args, dotted.replace(".", "__"))
        if value is not None:
            out[dotted] = value
    return out


def _parser() -> argparse.ArgumentParser:
    # each subcommand's module defines its own flags; tui.commands loads textual only when a
    # screen opens, so the engine's CLI stays free of it
    from engine import bench, launch, memory_cli, prepare
    from tui.commands import add_attach_arguments

    parser = _Parser(prog="gpt2-tui", description="Train GPT-2-class models fast, and watch it live.")
    parser.add_argument("--config", type=Path, dest="tui_config", help="open the TUI with this run config TOML filled in")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)

    t = sub.add_parser("train", help="train a model (headless, events to the console and the run dir)")
    t.add_argument("--preset", help="model preset name (see presets/) or a TOML file; default nano")
    t.add_argument("--config", type=Path, help="run config TOML (same schema as a run's config.toml)")
    t.add_argument("--out", type=Path, help="run directory to create (default runs/PRESET-TIMESTAMP)")
    t.add_argument("--resume", type=Path, metavar="RUN_DIR", help="continue a run from its latest checkpoint")
    t.add_argument("--headless", action="store_true", help="no TUI: events go to the console")
    _add_flags(t)
    launch.add_arguments(t)
    memory_cli.add_train_arguments(t)
    memory_cli.add_arguments(sub.add_parser("estimate", help="predict peak memory, part by part, and whether it fits"))

    prepare.add_arguments(sub.add_parser("prepare", help="tokenize text files into a dataset"))

    s = sub.add_parser("sample", help="generate text from a run or checkpoint")
    s.add_argument("path", type=Path, metavar="RUN_DIR_OR_CHECKPOINT")
    s.add_argument("--prompt", default="", help="text to continue")
    s.add_argument("--max-new-tokens", type=int, default=200)
    s.add_argument("--temperature", type=float, default=0.8)
    s.add_argument("--top-k", type=int, default=50)
    s.add_argument("--seed", type=int, default=None)
    s.add_argument("--device", default="cpu", help="cpu, cuda or mps")
    s.add_argument("--tokenizer", type=Path, help="tokenizer.json, when the run has none")

    # its flags belong to engine.bench_data, which parses them (and its own --help)
    sub.add_parser("bench-data", add_help=False, help="time batch building: vectorized vs loop, RAM vs memmap")
    bench.add_arguments(sub.add_parser("bench", help="the speed ladder: what each optimization buys here"))
    add_attach_arguments(sub.add_parser("attach", help="open the dashboard on a run directory (live or finished)"))
    return parser


def cmd_train(args: argparse.Namespace) -> int:
    from engine import distributed, memory_cli, rundir
    from engine.events import ConsoleSink
    from engine.trainer import Control, Trainer, open_data

    overrides = overrides_from(args)
    if args.resume:
        if args.preset or args.config or args.out:
            raise UserError("--resume takes its config and directory from the run; drop --preset/--config/--out")
        run_dir = args.resume
        base = rundir.load_config(run_dir).model_dump(mode="json", exclude_none=True)
        nested: dict[str, Any] = {}
        for dotted, value in overrides.items():
            set_dotted(nested, dotted, value)
        config = build(merge(base, nested))
    else:
        preset = args.preset or (None if args.config else "nano")
        config = resolve(preset, args.config, overrides)
        run_dir = args.out or (Path(config.out_dir) if config.out_dir else rundir.default_path(config.preset))
        rundir.check_new(run_dir)
        config = config.model_copy(update={"out_dir": str(run_dir)})
    dctx = distributed.init(config.speed.device)  # under torchrun: join the process group
    if dctx.enabled and not args.resume:  # rank 0's clock names the run directory
        run_dir = Path(distributed.broadcast_object(str(run_dir)))
        config = config.model_copy(update={"out_dir": str(run_dir)})
    with distributed.main_first():  # rank 0 builds the default dataset and the run directory
        config, dataset = open_data(config)
        memory_cli.check_train(config, args.force)  # refuse what will not fit, before allocating
        if not args.resume and dctx.is_main:
            rundir.create(run_dir, config, dataset.info.tokenizer)

    control = Control()

    def on_signal(signum: int, _frame: Any) -> None:
        # first Ctrl-C / SIGTERM: stop at the step boundary with a checkpoint; second: at once
        # (re-armed before printing, so a second signal right after the message quits)
        if not dctx.enabled:  # ranks stop together at a step boundary; torchrun escalates to SIGKILL
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        control.stop()
        print(f"\n{signal.Signals(signum).name}: saving a checkpoint and stopping (again to quit now)", file=sys.stderr)

    previous = signal.signal(signal.SIGINT, on_signal), signal.signal(signal.SIGTERM, on_signal)
    if hasattr(signal, "SIGUSR1"):  # how the TUI steers its detached runs: save now, pause/resume
        signal.signal(signal.SIGUSR1, lambda *_: control.save_now())
        signal.signal(signal.SIGUSR2, lambda *_: control.resume() if control.paused else control.pause())
    try:
        Trainer(config, run_dir, dataset, sinks=[ConsoleSink()], control=control, resume=bool(args.resume)).run()
    finally:
        signal.signal(signal.SIGINT, previous[0])
        signal.signal(signal.SIGTERM, previous[1])
        distributed.shutdown()
    if dctx.is_main:
        print(f"run directory: {run_dir}")
    return 0


def cmd_sample(args: argparse.Namespace) -> int:
    from engine.sample import find_tokenizer, generate_text, load_model, load_tokenizer

    if args.max_new_tokens < 1 or args.temperature <= 0 or args.top_k < 1:
        raise UserError("--max-new-tokens and --top-k must be >= 1 and --temperature > 0")
    model, _, path = load_model(args.path, args.device)
    tokenizer = load_tokenizer(args.tokenizer or find_tokenizer(args.path, path))
    print(generate_text(model, tokenizer, args.prompt, args.max_new_tokens, args.temperature, args.top_k, args.seed))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    if rest and args.command != "bench-data":
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        if args.command == "train":
            from engine import launch

            if launch.requested(args):  # --nproc N: relaunch under torch.distributed.run
                return launch.run_from_args(args, argv if argv is not None else sys.argv[1:])
            return cmd_train(args)
        if args.command == "prepare":
            from engine import prepare

            return prepare.run_from_args(args)
        if args.command == "sample":
            return cmd_sample(args)
        if args.command == "bench-data":
            from engine import bench_data

            return bench_data.main(rest)
        if args.command == "bench":
            from engine import bench

            return bench.run_from_args(args, "gpt2-tui " + " ".join(argv if argv is not None else sys.argv[1:]))
        if args.command == "estimate":
            from engine import memory_cli

            return memory_cli.run_from_args(args)
        if args.command == "attach":
            from tui.commands import run_attach

            return run_attach(args)
        from tui.commands import run_app  # the bare `gpt2-tui`: the TUI

        return run_app(args.tui_config)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `gpt2-tui ... | head`: the reader left; no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
