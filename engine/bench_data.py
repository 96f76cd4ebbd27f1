"""Benchmark of the data path: prints markdown tables for docs/benchmarks.md.

    python -m engine.bench_data [--data DIR] [--batch-size 64] [--block-size 512] [--iters N]

1. batch construction: one vectorized gather vs the per-row Python loop;
2. random-batch throughput: token files preloaded in RAM vs np.memmap opened per batch.

Fairness: both sides of a comparison use samplers with the same seed (so they copy the
very same windows), are warmed up first, run interleaved (A, B, A, B, ...) so drift hits
both alike, and report the median over iterations.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
import torch

from engine.data import BatchSampler, TokenSplit, open_dataset


def _median_seconds(fns: list[Callable[[], object]], iters: int, warmup: int) -> list[float]:
    """Median wall time of each function, the functions called in turn each iteration."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(iters):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            times[i].append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def _samplers(split: TokenSplit, args: argparse.Namespace, vectorized: bool) -> BatchSampler:
    return BatchSampler(split, args.batch_size, args.block_size, seed=args.seed, vectorized=vectorized)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.bench_data", description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=None, help="dataset directory (default: the embedded stdlib corpus)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=512)
    parser.add_argument("--iters", type=int, default=200, help="timed iterations per variant")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab-size", type=int, default=50257, help="for nanoGPT/llm.c files")
    args = parser.parse_args(argv)

    if args.data is None:
        from engine.prepare import default_dataset

        args.data = default_dataset()
    ram = open_dataset(args.data, vocab_size=args.vocab_size, preload=True)
    disk = open_dataset(args.data, vocab_size=args.vocab_size, preload=False)
    ram.train.check_block(args.block_size)
    B, T = args.batch_size, args.block_size

    print(f"dataset: {ram.info.path} ({ram.info.format}, {ram.info.train_tokens:,} train tokens, {ram.info.dtype})")
    print(
        f"B={B} T={T}, median of {args.iters} iterations after {args.warmup} warm-up, interleaved; "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"numpy {np.__version__}, torch {torch.__version__}, {datetime.date.today().isoformat()}"
    )

    vec, loop = _samplers(ram.train, args, True), _samplers(ram.train, args, False)
    assert all(np.array_equal(a, b) for a, b in zip(vec.next(), loop.next())), "paths disagree"
    t_vec, t_loop = _median_seconds([vec.next, loop.next], args.iters, args.warmup)
    print("\n**Batch construction** (train split preloaded in RAM; x, y int64)\n")
    print("| method | ms / batch | speedup |")
    print("|---|---:|---:|")
    print(f"| Python loop (slice, cast, stack per row) | {t_loop * 1e3:.3f} | 1.00x |")
    print(f"| vectorized (one index array, one gather) | {t_vec * 1e3:.3f} | {t_loop / t_vec:.2f}x |")

    mm, pre = _samplers(disk.train, args, True), _samplers(ram.train, args, True)
    t_mm, t_pre = _median_seconds([mm.next, pre.next], args.iters, args.warmup)
    print("\n**Random-batch throughput** (vectorized gather in both; token file warm in the OS page cache)\n")
    print("| source | batches/s | tokens/s | speedup |")
    print("|---|---:|---:|---:|")
    for name, t, base in (("np.memmap opened per batch", t_mm, t_mm), ("RAM preload (np.fromfile)", t_pre, t_mm)):
        print(f"| {name} | {1 / t:,.0f} | {B * T / t:,.0f} | {base / t:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
