"""The compile warm-up, cut by scope and by cache: what docs/benchmarks.md shows.

    python -m bench.compile_warmup [--preset nano --preset gpt2] [--batch-size 2] [--block-size 128]
                                   [--steps 30] [--rounds 2] [--device cpu] [--out DIR]

For each preset, round after round (the order of the scopes alternates, so a busy machine
weighs on both alike), each compile scope (model, blocks) is timed with
fresh.time_compile_cache("all"): a cold run of --steps steps in a fresh process with an
empty compile cache, then a one-step run reading the caches it left on disk (warm disk),
then a one-step run with an empty cache and the first run's compile artifacts (run
artifacts: a resume on a new machine). Every run is a fresh process (bench.fresh). The table
gives, per preset and scope, the medians over rounds of: the cold first step and the seconds
torch counted as compiling, the settled step time, and the warm-disk and run-artifacts
first step and compile seconds. Nothing here is run by the tests.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import tempfile
from pathlib import Path

import torch

from bench.fresh import time_compile_cache
from bench.common import default_out, load_average
from engine import console
from engine.files import atomic_write_bytes
from engine.config import resolve
from engine.events import settled_step_time
from engine.run.preflight import prepared

SCOPES = ("model", "blocks")


def measure(preset: str, scope: str, args: argparse.Namespace, where: Path) -> dict:
    overrides = {"speed.compile": True, "speed.compile_scope": scope, "train.max_steps": args.steps,
                 "train.log_interval": 1, "train.eval_interval": args.steps + 1, "train.ckpt_interval": args.steps + 1,
                 "optim.warmup_steps": 0, "train.batch_size": args.batch_size, "train.block_size": args.block_size,
                 "train.grad_accum": 1}  # fmt: skip
    if args.device != "auto":
        overrides["speed.device"] = args.device
    config, dataset = prepared(resolve(preset, None, overrides), memory=False)
    timing, firsts = time_compile_cache("all", config, dataset, where / f"{preset}-{scope}")
    by = {f.cache: f for f in firsts}
    return {
        "device": timing.device_name, "precision": timing.precision,
        "cold_first_s": by["cold"].first_step_s, "cold_compile_s": by["cold"].compile_s,
        "settled_s": settled_step_time(timing.step_times_s[1:]),
        "warm_first_s": by["warm"].first_step_s if "warm" in by else None,
        "warm_compile_s": by["warm"].compile_s if "warm" in by else None,
        "artifacts_first_s": by["artifacts"].first_step_s if "artifacts" in by else None,
        "artifacts_compile_s": by["artifacts"].compile_s if "artifacts" in by else None,
    }  # fmt: skip


def _med(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r[key] is not None]
    return statistics.median(values) if values else None


def table(results: dict[str, dict[str, list[dict]]]) -> list[str]:
    cols = ["cold_first_s", "cold_compile_s", "settled_s", "warm_first_s", "warm_compile_s", "artifacts_first_s",
            "artifacts_compile_s"]  # fmt: skip
    lines = ["| preset | scope | cold first step s | cold compile s | settled ms/step | warm-disk first s | "
             "warm-disk compile s | run-artifacts first s | run-artifacts compile s |",
             "|---|---|" + "---:|" * len(cols)]  # fmt: skip
    for preset, scopes in results.items():
        for scope, rows in scopes.items():
            cells = []
            for c in cols:
                v = _med(rows, c)
                cells.append("-" if v is None else f"{1000 * v:.1f}" if c == "settled_s" else f"{v:.2f}")
            lines.append(f"| {preset} | {scope} | " + " | ".join(cells) + " |")
        m, b = (_med(scopes.get(s, []), "cold_first_s") for s in SCOPES)
        sm, sb = (_med(scopes.get(s, []), "settled_s") for s in SCOPES)
        if m and b and sm and sb:
            lines.append(f"| {preset} | blocks vs model | {m / b:.2f}x shorter | | {100 * (sb / sm - 1):+.1f}% | | | | |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.compile_warmup", description=__doc__.splitlines()[0])
    p.add_argument("--preset", action="append", default=None, help="repeatable (default: nano and gpt2)")
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--steps", type=int, default=30, help="steps of each cold run (the settled time: its second half)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--device", default="auto")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    presets = args.preset or ["nano", "gpt2"]
    out = args.out or default_out("compile-warmup")
    out.mkdir(parents=True, exist_ok=False)
    load_before = load_average()
    results: dict[str, dict[str, list[dict]]] = {pr: {s: [] for s in SCOPES} for pr in presets}
    with tempfile.TemporaryDirectory(prefix="gpt2-tui-compile-warmup-") as tmp:
        for rnd in range(args.rounds):
            for preset in presets:
                for scope in SCOPES if rnd % 2 == 0 else SCOPES[::-1]:
                    console.out.line(f"round {rnd + 1}/{args.rounds}: {preset}, compile scope {scope}", flush=True)
                    row = measure(preset, scope, args, Path(tmp) / f"r{rnd}")
                    results[preset][scope].append(row)
                    console.out.line(json.dumps(row), flush=True)
    any_row = next(r for s in results.values() for rows in s.values() for r in rows)
    head = [f"{any_row['device']}, {any_row['precision']}, torch {torch.__version__}, {datetime.date.today()}, "
            f"B{args.batch_size} T{args.block_size}, {args.rounds} rounds (medians), load before {load_before}, "
            f"after {load_average()}  ", f"Command: `python -m bench.compile_warmup {' '.join(argv or [])}`".rstrip(), ""]  # fmt: skip
    text = "\n".join(head + table(results)) + "\n"
    atomic_write_bytes(out / "compile_warmup.md", text.encode())
    atomic_write_bytes(out / "compile_warmup.json", json.dumps(results, indent=1).encode())
    console.out.line(text)
    console.out.line(f"wrote {out / 'compile_warmup.md'} and {out / 'compile_warmup.json'}")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
