"""Benchmark of the data path: prints markdown tables for docs/benchmarks.md.

    python -m bench.batching [--data DIR] [--batch-size 64] [--block-size 512] [--iters N]

1. batch construction: one vectorized gather vs the per-row Python loop;
2. random-batch throughput: token files preloaded in RAM vs read from the file per batch (pread per row).

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

from engine import console
from engine.dataset import TokenSplit, open_dataset
from engine.train.batches import BatchSampler


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


def _reference(sampler: BatchSampler, how: str) -> Callable[[], tuple]:
    """Other ways to build the same batch (same RNG draws), for comparison only.

    "nanogpt": nanoGPT's get_batch, torch.stack of torch.from_numpy per row;
    "index": one (B, T+1) index array and one fancy-index gather.
    """
    T = sampler.block_size
    window = np.arange(T + 1)

    def build() -> tuple:
        shard_ids, offsets = sampler._draw()
        used = [0] if len(sampler.split.shards) == 1 else np.unique(shard_ids).tolist()
        arrays = {i: sampler.split.shards[i].read(0, sampler.split.shards[i].count) for i in used}
        if how == "nanogpt":
            rows = list(zip(shard_ids.tolist(), offsets))  # scalar indices, as in nanoGPT's loop

            def row(s: int, o: int) -> torch.Tensor:
                return torch.from_numpy(arrays[s][o : o + T].astype(np.int64))

            return torch.stack([row(s, o) for s, o in rows]), torch.stack([row(s, o + 1) for s, o in rows])
        windows = np.empty((len(offsets), T + 1), dtype=sampler.split.shards[0].dtype)
        for i, tokens in arrays.items():
            rows = np.flatnonzero(shard_ids == i)
            windows[rows] = tokens[offsets[rows, None] + window]
        return windows[:, :-1].astype(np.int64, order="C"), windows[:, 1:].astype(np.int64, order="C")

    return build


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.batching", description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=None, help="dataset directory (default: the stdlib corpus)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=512)
    parser.add_argument("--iters", type=int, default=200, help="timed iterations per variant")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab-size", type=int, default=50257, help="for nanoGPT/llm.c files")
    args = parser.parse_args(argv)

    if args.data is None:
        from engine.prep.prepare import default_dataset

        args.data = default_dataset()
    ram = open_dataset(args.data, vocab_size=args.vocab_size, preload=True)
    disk = open_dataset(args.data, vocab_size=args.vocab_size, preload=False)
    ram.train.check_block(args.block_size)
    B, T = args.batch_size, args.block_size

    info = ram.info
    console.out.line(f"dataset: {info.path} ({info.format}, {info.train_tokens:,} train tokens, {info.dtype})")
    console.out.line(f"B={B} T={T}, median of {args.iters} iterations after {args.warmup} warm-up, interleaved; "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, numpy {np.__version__}, torch {torch.__version__}, "
        f"{datetime.date.today().isoformat()}")

    vec, loop = _samplers(ram.train, args, True), _samplers(ram.train, args, False)
    nano = _reference(_samplers(ram.train, args, True), "nanogpt")
    index = _reference(_samplers(ram.train, args, True), "index")
    first = [vec.next(), loop.next(), nano(), index()]
    assert all(np.array_equal(np.asarray(a[k]), np.asarray(first[0][k])) for a in first for k in (0, 1))
    fns = [nano, loop.next, index, vec.next]
    t_nano, t_loop, t_index, t_vec = _median_seconds(fns, args.iters, args.warmup)
    console.out.line("\n**Batch construction** (train split preloaded in RAM; x, y int64; same windows in every row)\n")
    console.out.line("| method | ms / batch | speedup vs loop |")
    console.out.line("|---|---:|---:|")
    rows = (
        ("nanoGPT get_batch: torch.stack of from_numpy per row (reference)", t_nano),
        ("Python loop: slice, cast, np.stack per row (`vectorized=False`)", t_loop),
        ("index array `tokens[offsets[:, None] + arange(T+1)]`, one gather", t_index),
        ("sliding-window view, one row gather (`vectorized=True`)", t_vec),
    )
    for name, t in rows:
        console.out.line(f"| {name} | {t * 1e3:.3f} | {t_loop / t:.2f}x |")

    mm, pre = _samplers(disk.train, args, True), _samplers(ram.train, args, True)
    t_mm, t_pre = _median_seconds([mm.next, pre.next], args.iters, args.warmup)
    console.out.line("\n**Random-batch throughput** (vectorized gather in both; "
                     "token file warm in the OS page cache)\n")
    console.out.line("| source | batches/s | tokens/s | speedup |")
    console.out.line("|---|---:|---:|---:|")
    for name, t in (("read from the file per batch (pread per row)", t_mm), ("RAM preload (np.fromfile)", t_pre)):
        console.out.line(f"| {name} | {1 / t:,.0f} | {B * T / t:,.0f} | {t_mm / t:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
