"""`gpt2-tui bench` and `gpt2-tui bench-data`: their flags, and which tool each one runs.

gpt2_tui.py adds these two commands to engine.cli's parser; engine/ never imports bench/
(the import-linter contract in pyproject.toml). Bad input is one line and exit status 2,
as for every command: checked here or by BenchOptions before anything runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from engine.cli import SEED, Bounded, target_loss
from engine.config import MAX_BATCH, MAX_CONTEXT, MAX_VOCAB

COMMANDS = ("bench", "bench-data")
# `bench-data`'s flags (bench.batching has the defaults): checked before it runs
BENCH_DATA_FLAGS = (
    ("--batch-size", Bounded(1, MAX_BATCH), "sequences per batch (default 64)"),
    ("--block-size", Bounded(1, MAX_CONTEXT), "tokens per sequence (default 512)"),
    ("--iters", Bounded(1, 10**7), "timed iterations per variant (default 200)"),
    ("--warmup", Bounded(0, 10**7), "untimed iterations first (default 10)"),
    ("--seed", SEED, "sampler seed (default 0)"),
    ("--vocab-size", Bounded(2, MAX_VOCAB), "vocab of nanoGPT/llm.c files, which carry none (default 50257)"),
)
BENCH_DATA_ARGS = ("--data", *(f for f, _, _ in BENCH_DATA_FLAGS))
BASELINE = "baseline"  # --to-loss with no LOSS (argparse converts its const too): the baseline's final val loss


def loss_or_baseline(text: str) -> float | str:
    """--to-loss's value: a val loss, or BASELINE (what --to-loss alone means)."""
    return BASELINE if text == BASELINE else target_loss(text)


loss_or_baseline.__name__ = "loss"


def add_parsers(sub: Any) -> None:
    """Add `bench-data` and `bench` to the subparsers of engine.cli.build_parser."""
    from bench.names import LOSS_RUNG_NAMES, PARTS, RECIPE_NAMES, RUNG_NAMES

    # checked here (one line on bad input), then handed to bench.batching as given
    d = sub.add_parser("bench-data", help="time batch building: vectorized vs loop, RAM vs reads from disk")
    d.add_argument("--data", metavar="DIR", default=argparse.SUPPRESS, help="dataset directory (default: the stdlib corpus)")
    for flag, kind, help_ in BENCH_DATA_FLAGS:
        d.add_argument(flag, type=kind, metavar="N", default=argparse.SUPPRESS, help=help_)

    # bench's numbers are bounded and checked by bench.common.BenchOptions
    b = sub.add_parser("bench", help="the speed ladder: what each optimization buys here")
    mode = b.add_mutually_exclusive_group()
    mode.add_argument("--preset", default=None, help="model preset for the ladder (default nano)")
    mode.add_argument("--config", type=Path, metavar="FILE", help="time this run config over time (compile warm-up)")
    b.add_argument("--plain", action="store_true", help="our Trainer vs an independent plain PyTorch GPT-2 loop")
    b.add_argument("--best", action="store_true", help="every optimization on; sweep micro-batch x compile mode")
    b.add_argument("--to-loss", type=loss_or_baseline, nargs="?", const=BASELINE, metavar="LOSS",
                   help="train each rung (the ladder's, then + Muon, + WSD) to this val loss and rank them by training "
                   "time to it (default preset micro; --steps: a rung's most steps, default 300; --budget bounds the "
                   "whole run); with --recipe-ladder the LOSS may be left out: the baseline's final val "
                   "loss")  # fmt: skip
    b.add_argument("--recipe-ladder", action="store_true", help="--to-loss over the speedrun's tricks instead: "
                   "the GPT-2 baseline (its final val loss the target), each trick added in turn, then each left "
                   f"out of the full recipe, over paired --seeds, ranked by median training time to the target: "
                   f"{', '.join(RECIPE_NAMES)}")  # fmt: skip
    b.add_argument("--seeds", type=int, metavar="N", help="--recipe-ladder: seeds per row, the same list for every "
                   "row (default 3)")  # fmt: skip
    b.add_argument("--steps", type=int, metavar="N", help="timed steps per rung (default 20; --config: 100)")
    b.add_argument("--warmup", type=int, default=5, metavar="N", help="untimed steps first (compile happens here)")
    b.add_argument("--out", type=Path, metavar="DIR", help="new directory for the tables (default runs/bench-NAME-TIME)")
    b.add_argument("--data", metavar="DIR", help="dataset directory (default: the stdlib corpus)")
    b.add_argument("--device", choices=["auto", "cuda", "mps", "cpu"], default="auto")
    b.add_argument("--vocab-size", type=int, metavar="N", help="model vocab (ladder default 50257, GPT-2's)")
    b.add_argument("--batch-size", type=int, metavar="N", help="micro-batch (default: the preset's)")
    b.add_argument("--block-size", type=int, metavar="N", help="tokens per sequence (default: the context)")
    b.add_argument("--grad-accum", type=int, default=1, metavar="N", help="micro-batches per step")
    b.add_argument("--log-interval", type=int, metavar="N", help="steps per timed interval (default 1; --best: 10)")
    b.add_argument("--batch-sizes", metavar="LIST", help="--best: comma-separated micro-batches (default 8,16,32)")
    b.add_argument("--compile-modes", metavar="LIST", help="--best: comma-separated compile modes, 'eager' = none")
    tricks = [n for n in RECIPE_NAMES if n not in LOSS_RUNG_NAMES]
    b.add_argument("--skip", action="append", default=[], choices=RUNG_NAMES[1:] + LOSS_RUNG_NAMES + tricks,
                   metavar="RUNG", help=f"leave a rung out (repeatable): {', '.join(RUNG_NAMES[1:])}; --to-loss also "
                   f"{', '.join(LOSS_RUNG_NAMES)}; --recipe-ladder: a trick")  # fmt: skip
    b.add_argument("--rounds", type=int, default=3, metavar="N", help="--plain: alternating rounds of each loop")
    b.add_argument("--nanogpt", type=Path, metavar="DIR", help="--plain: also time nanoGPT's own train.py from this "
                   "checkout of github.com/karpathy/nanoGPT, at the same shape")  # fmt: skip
    b.add_argument("--compile-cache", choices=["cold", "warm", "both", "all"], default=None,
                   help="ladder and --config: time the first step with torch.compile's caches empty (cold), "
                   "filled by a run of the same config (warm), both, or all: both, then an empty cache with "
                   "the first run's compile artifacts (a resume on a new machine); each run in a fresh process")  # fmt: skip
    b.add_argument("--gpu-report", action="store_true", help="on a CUDA box, the short-window profile (<= 8 minutes "
                   "cold on an H100): headline, switch matrix, ladder, best, dashboard overhead, written to --out "
                   "(default docs/gpu/) DEVICE-DATE-short.md and .json after every row")  # fmt: skip
    b.add_argument("--full", action="store_true", help="--gpu-report: the full report instead (tests, ladder, best, "
                   "memory, overhead; about 22 minutes cold), DEVICE-DATE.md and .json")  # fmt: skip
    b.add_argument("--part", action="append", default=[], choices=PARTS, metavar="PART",
                   help=f"--gpu-report: only this part of the full report (repeatable), merged into the day's: "
                   f"{', '.join(PARTS)}")  # fmt: skip
    b.add_argument("--no-doctor", action="store_true", help="--gpu-report: leave the doctor out (it runs once per "
                   "box: the day's report's entry is reused)")  # fmt: skip
    b.add_argument("--dry-run", action="store_true", help="--gpu-report on CPU with the tiniest shapes (the plumbing)")
    b.add_argument("--budget", type=Bounded(1, 10**6), metavar="S",
                   help="seconds the whole ladder is planned to take: behind it, the rungs left measure fewer steps, "
                   "never none (default: 480 on a CPU, none on a GPU); with --gpu-report: seconds each part may take (default: its own)")  # fmt: skip


def run_command(args: argparse.Namespace, argv: list[str]) -> int:
    """Run a parsed `bench` or `bench-data` (raises UserError on bad input)."""
    if args.command == "bench-data":
        from bench import batching

        given = {flag: getattr(args, flag[2:].replace("-", "_"), None) for flag in BENCH_DATA_ARGS}
        return batching.main([a for flag, v in given.items() if v is not None for a in (flag, str(v))])
    from bench.common import BenchOptions
    from bench.run import run

    fields = BenchOptions.model_fields
    return run(BenchOptions.from_flags({k: v for k, v in vars(args).items() if k in fields}), "gpt2-tui " + " ".join(argv))
