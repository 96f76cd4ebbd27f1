"""What a Muon step costs against an AdamW step, at the nano and gpt2 shapes (issue 40 item 2).

    python -m bench.muon_step [--preset nano --preset gpt2] [--batch-size N] [--block-size T]
                              [--rounds 5] [--steps 3] [--device cpu]

Per preset, one model (its shape; vocab 8192 as the default dataset's), one random batch, and
five optimizers over copies of the same weights: fused AdamW (the default), unfused AdamW,
torch.optim.Muon + fused AdamW skipped as the engine did before (its step put back on the
device where the guard says skip: build.step_unless's copy form), ours (engine/train/muon.py:
one batched Newton-Schulz per shape, the skip in its update), and ours compiled (its momentum
stack and Newton-Schulz, as a run with --compile has it; the compile happens in the untimed
warm-up step).
Each is timed two ways: the training step as the trainer runs it (zero_grad, forward, backward,
clip, the guard's verdict, build.step_unless) and the optimizer step alone (build.step_unless).
Rounds are paired: every round times every optimizer, the order rotating round to round, so a
busy machine weighs on all alike; the table shows the median over rounds of each round's mean over --steps steps,
and each Muon's ratio to fused AdamW. The load average before and after is printed with it.
Nothing here is run by the tests.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from bench.common import load_average
from engine import console
from engine.config import resolve
from engine.train import build
from engine.train.guard import StepGuard
from engine.train.model import GPT

KINDS = ("adamw fused", "adamw unfused", "torch muon", "our muon", "our muon compiled")
MUONS = KINDS[2:]  # each shown against fused AdamW


def _optimizer(kind: str, model: torch.nn.Module, preset_optim: object, device: torch.device) -> object:
    o = preset_optim.model_copy(update={"optimizer": "adamw" if kind.startswith("adamw") else "muon",  # type: ignore[attr-defined]
                                        "fused": kind != "adamw unfused"})  # fmt: skip
    opt = build.optimizer(model, o, device)
    if kind == "torch muon":  # the engine's Muon before issue 40: torch's, skipped by the put-back
        params = [p for g in opt.muon.param_groups for p in g["params"]]
        opt.muon = torch.optim.Muon(params, lr=o.muon_lr, weight_decay=0.0, momentum=o.muon_momentum,
                                    nesterov=True, adjust_lr_fn=None)  # fmt: skip
    if kind == "our muon compiled":  # its momentum stack and Newton-Schulz compiled, as a run with --compile
        opt.muon.compiled = True  # type: ignore[attr-defined]
    return opt


def _opt_step(kind: str, opt: object, skip: torch.Tensor) -> None:
    if kind == "torch muon":  # build.step_unless's form for an optimizer with no found_inf
        build.step_unless(opt.adamw, skip)  # type: ignore[attr-defined]
        build.step_unless(opt.muon, skip, on_device=True)  # type: ignore[attr-defined]
    else:
        build.step_unless(opt, skip)  # type: ignore[arg-type]


def _timed(fn: Callable[[], None], steps: int, device: torch.device) -> float:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    sync()
    return (time.perf_counter() - t0) / steps * 1e3


def measure(preset: str, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """{kind: {"train": ms, "opt": ms}}: medians over paired rounds."""
    overrides = {"model.vocab_size": 8192, "model.dropout": 0.0}
    if args.batch_size:
        overrides["train.batch_size"] = args.batch_size
    if args.block_size:
        overrides["model.block_size"] = args.block_size
    cfg = resolve(preset, None, overrides)
    device = torch.device(args.device if args.device != "auto" else "cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    base = GPT(cfg.model).to(device)
    x = torch.randint(0, 8192, (cfg.train.batch_size, cfg.seq_len), device=device)
    runs = {}
    for kind in KINDS:
        model = GPT(cfg.model).to(device)
        model.load_state_dict(base.state_dict())
        runs[kind] = (model, _optimizer(kind, model, cfg.optim, device), StepGuard(cfg.train.max_bad_steps, device))

    def train_step(kind: str) -> None:
        model, opt, guard = runs[kind]
        opt.zero_grad(set_to_none=True)  # type: ignore[attr-defined]
        _, loss = model(x, x)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
        _opt_step(kind, opt, guard.judge(loss, norm, scaled=False))

    def opt_step(kind: str) -> None:
        _, opt, guard = runs[kind]
        _opt_step(kind, opt, guard.flag)

    for kind in KINDS:  # warm-up: state created, kernels loaded
        train_step(kind)
    times: dict[str, dict[str, list[float]]] = {k: {"train": [], "opt": []} for k in KINDS}
    for r in range(args.rounds):
        order = KINDS[r % len(KINDS):] + KINDS[: r % len(KINDS)]
        for kind in order:
            times[kind]["train"].append(_timed(lambda: train_step(kind), args.steps, device))  # noqa: B023
            times[kind]["opt"].append(_timed(lambda: opt_step(kind), args.steps, device))  # noqa: B023
    return {k: {w: statistics.median(v) for w, v in t.items()} for k, t in times.items()} | {
        "_shape": {"batch": cfg.train.batch_size, "T": cfg.seq_len, "L": cfg.model.n_layer, "C": cfg.model.n_embd}}


def table(results: dict[str, dict[str, dict[str, float]]]) -> list[str]:
    head = "| preset (L, C; batch x T) | step | " + " | ".join([*KINDS, *(f"{k} / adamw" for k in MUONS)]) + " |"
    lines = [head, "|---|---|" + "---:|" * (len(KINDS) + len(MUONS))]
    for preset, r in results.items():
        s = r["_shape"]
        for what, label in (("train", "training step"), ("opt", "optimizer step")):
            ms = [r[k][what] for k in KINDS]
            ratios = [r[k][what] / r["adamw fused"][what] for k in MUONS]
            lines.append(f"| {preset} ({s['L']:.0f}, {s['C']:.0f}; {s['batch']:.0f} x {s['T']:.0f}) | {label} | "
                         + " | ".join(f"{m:.1f} ms" for m in ms) + " | "
                         + " | ".join(f"{x:.2f}x" for x in ratios) + " |")  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.muon_step", description=__doc__.splitlines()[0])
    ap.add_argument("--preset", action="append", help="presets to measure (default: nano and gpt2)")
    ap.add_argument("--batch-size", type=int, help="sequences per step (default: the preset's)")
    ap.add_argument("--block-size", type=int, help="tokens per sequence (default: the preset's)")
    ap.add_argument("--rounds", type=int, default=5, help="paired rounds (each times every optimizer)")
    ap.add_argument("--steps", type=int, default=3, help="steps timed per optimizer per round")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    args = ap.parse_args(argv)
    out = console.out
    before = load_average()
    results = {p: measure(p, args) for p in args.preset or ["nano", "gpt2"]}
    out.line(f"device {args.device}, torch {torch.__version__}, {torch.get_num_threads()} threads; "
             f"{args.rounds} paired rounds x {args.steps} steps, medians")  # fmt: skip
    out.line(f"load average before: {before}; after: {load_average()}")
    for line in table(results):
        out.line(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
