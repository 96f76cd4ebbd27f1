"""`gpt2-tui bench --to-loss X`: which rung of the ladder reaches a val loss first, here.

    gpt2-tui bench --preset micro --to-loss 5.5 [--steps N] [--budget S] [--skip RUNG]

The speed ladder (bench/ladder.py) measures ms/step; a faster step is only worth as much as
the loss it buys. Here each rung trains from the same seed with the real engine until its
val loss first reaches X (an eval every EVAL_EVERY steps) or its share of the budget or its
`--steps` run out, and the rungs are ranked by the training time they took to get there:
the sum of their step times (Eval.train_time_s: evals, checkpoints and the start-up are left
out, a compile's warm-up is in). The rungs are the speed ladder's (cumulative, those this
device runs), then the optimizer and schedule rungs of bench/rungs.py (LOSS_RUNGS: + Muon,
+ WSD), each on top of the rung before.

The budget (default: the ladder's, CPU_BUDGET_S on a CPU) is split as the rungs go: each gets
an equal share of what is left, so the whole run ends within it.

A rung's steps carry the machine's contention (engine/train/contention.py): a rung whose
training time was taken on a busy machine is marked in the table, and one line says how many
(a busy machine can rank the slowest rung first).
"""

from __future__ import annotations

import datetime
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, NamedTuple

import torch
from pydantic import BaseModel, Field

from bench import ladder
from bench.common import BenchOptions, default_out, load_average
from bench.names import LOSS_RUNG_NAMES, RUNG_NAMES
from bench.rungs import LOSS_RUNGS
from engine import console
from engine import events as ev
from engine import files
from engine.config import RunConfig, resolve
from engine.device import describe as describe_device
from engine.errors import UserError
from engine.events import CallbackSink
from engine.run.owner import start
from engine.run.requests import Control
from engine.text import contention_text, loss_text, path_text, ratio_text
from engine.train import contention

EVAL_EVERY = 5  # steps between evals: how finely the time to the loss is resolved
EVAL_BATCHES = 4  # the same val batches for every rung (seeded)
DEFAULT_STEPS = 300  # a rung's most steps when --steps is not given
RAN = ("reached", "not reached")  # a rung that trained (and so was timed)


class LossRung(BaseModel):
    name: str
    label: str
    status: Literal["reached", "not reached", "skipped", "failed", "pending"] = "pending"
    reason: str | None = None
    changes: dict[str, Any] = {}  # the rung's whole override set (cumulative)
    step: int | None = None  # the eval that first reached the target
    train_time_s: float | None = None  # training time to it (sum of step times)
    tokens: int | None = None
    val_loss: float | None = None  # that eval's (or, not reached, the last eval's)
    steps_trained: int = 0
    rank: int | None = None  # 1 = the least training time to the target
    vs_fastest: float | None = None  # its time over the fastest rung's
    contention: ev.Contention | None = None  # over all its steps (its train time sums them all)


class TableHeader(BaseModel):
    """What a time-to-loss table (this one, the recipe ladder's) was measured on and with."""

    preset: str
    device: str = ""
    device_name: str = ""
    torch_version: str = torch.__version__
    date: str = Field(default_factory=lambda: datetime.date.today().isoformat())
    load: str = ""
    batch_size: int = 0
    block_size: int = 0
    tokens_per_step: int = 0
    max_steps: int = 0
    eval_every: int = EVAL_EVERY
    budget_s: float | None = None
    command: str = ""


class ToLossResult(TableHeader):
    target: float
    rungs: list[LossRung] = []


def plan(bench: ladder.BenchConfig, device: torch.device, vocab: int) -> list[ladder.PlannedRung]:
    """The speed ladder's plan (rungs this device runs, cumulative), then the loss rungs, each
    on top of the last runnable rung before it."""
    unknown = [s for s in bench.skip if s not in RUNG_NAMES and s not in LOSS_RUNG_NAMES]
    if unknown:
        raise UserError(f"unknown rung {unknown[0]!r} in --skip; choose from: {', '.join(RUNG_NAMES[1:] + LOSS_RUNG_NAMES)}")
    speed = bench.model_copy(update={"skip": [s for s in bench.skip if s in RUNG_NAMES]})
    rungs = ladder.plan(speed, device, vocab)
    current = next((p.overrides for p in reversed(rungs) if p.overrides is not None), {}) or {}
    for r in LOSS_RUNGS:
        spec = ladder.RungSpec(name=r.name, label=r.label, changes=r.changes, why=r.why)
        if r.name in bench.skip:
            rungs.append(ladder.PlannedRung(spec, None, "left out by --skip", []))
            continue
        current = current | r.changes
        rungs.append(ladder.PlannedRung(spec, dict(current), None, []))
    return rungs


def base_overrides(bench: ladder.BenchConfig) -> dict[str, Any]:
    """The ladder's shared overrides, with evals every EVAL_EVERY steps and a short warmup
    (a tenth of the steps), the same for every rung."""
    steps = bench.steps
    return ladder.base_overrides(bench) | {
        "train.max_steps": steps, "train.eval_interval": EVAL_EVERY, "train.eval_batches": EVAL_BATCHES,
        "train.ckpt_interval": steps + 1, "train.sample_tokens": 0, "optim.warmup_steps": max(1, steps // 10),
        "train.log_interval": 1,
    }  # fmt: skip


def run_to_loss(
    bench: ladder.BenchConfig, target: float, out: Path, command: str = "", say: Callable[[str], None] | None = None
) -> ToLossResult:
    """Train each rung to `target` (or its share of the budget, or bench.steps); rank them."""
    tell = say or (lambda line: None)
    base = base_overrides(bench)
    device, probe, the_plan, _ = ladder.checked_plan(bench, base, out, plan)
    budget = bench.budget_for(device)
    result = ToLossResult(
        preset=bench.preset, target=target, device=str(device), device_name=describe_device(device), load=load_average(),
        batch_size=probe.train.batch_size, block_size=probe.seq_len, tokens_per_step=probe.tokens_per_step,
        max_steps=bench.steps, budget_s=budget, command=command,
        rungs=[LossRung(name=s.name, label=s.label, changes=o or {}) for s, o, _, _ in the_plan],
    )  # fmt: skip
    files.make_dir(out)
    t0 = time.monotonic()
    runnable = sum(1 for p in the_plan if p.overrides is not None)
    for i, (spec, overrides, skip_reason, notes) in enumerate(the_plan):
        r = result.rungs[i]
        if overrides is None:
            r.status, r.reason = "skipped", skip_reason
        else:
            left = None if budget is None else budget - (time.monotonic() - t0)
            share = None if left is None else left / runnable
            runnable -= 1
            if share is not None and share <= 0:
                r.status, r.reason = "skipped", f"past the time budget of {budget:g} s (--budget)"
            else:
                tell(f"  {spec.label}: training to val loss {loss_text(target)}"
                     + ("" if share is None else f" (at most {share:.0f} s)"))  # fmt: skip
                _train(r, bench.preset, base | overrides, target, out / f"{i}-{spec.name}", share)
                busy = contention_text(r.contention, short=True)
                tell(f"  {spec.label}: {_outcome(r)}" + (f"  {contention.MARK} {busy}" if busy else ""))
        _save(result, out)
    rank(result)
    _save(result, out)
    return result


class Trained(NamedTuple):
    """How a run from scratch ended: the reason it failed (None: it ran), the contention its steps saw."""

    failed: str | None
    contention: ev.Contention | None


def train_until(config: RunConfig, run_dir: Path, watch: Callable[[Any, Control], None], cap_s: float | None) -> Trained:
    """Train `config` into `run_dir` from scratch; `watch(event, control)` sees every event and may
    stop the run (its target reached), and a clock stops it after `cap_s` seconds when given. A
    failure (a refusal, a missing kernel or compiler) is recorded, not raised: the table goes on."""
    control = Control()
    readings: list[ev.Contention | None] = []

    def sink(e: Any) -> None:
        if isinstance(e, ev.Step):
            readings.append(e.contention)
        watch(e, control)

    done = threading.Event()
    if cap_s is not None:
        deadline = time.monotonic() + cap_s

        def clock() -> None:
            if not done.wait(max(0.0, deadline - time.monotonic())):
                control.stop()

        threading.Thread(target=clock, daemon=True).start()
    failed = None
    try:
        start(config, run_dir, sinks=[CallbackSink(sink)], control=control).run()
    except UserError as err:
        failed = str(err).splitlines()[0][:300]
    except Exception as err:  # a missing kernel or compiler: record it, go on
        words = str(err).strip().splitlines()[0] if str(err).strip() else ""
        failed = f"{type(err).__name__}: {words}"[:300]
    finally:
        done.set()
    return Trained(failed, contention.combine(readings))


def _train(r: LossRung, preset: str, overrides: dict[str, Any], target: float, run_dir: Path, share: float | None) -> None:
    """One rung from scratch: stopped at the first eval at or below `target`, or at its share."""
    last: list[ev.Eval] = []

    def watch(e: Any, control: Control) -> None:
        if isinstance(e, ev.Eval):
            last[:] = [e]
            if e.step > 0 and e.val_loss <= target and r.step is None:
                r.step, r.train_time_s, r.tokens, r.val_loss = e.step, e.train_time_s, e.tokens, e.val_loss
                control.stop()
        elif isinstance(e, ev.Step):
            r.steps_trained = e.step

    failed, r.contention = train_until(resolve(preset, None, overrides), run_dir, watch, share)
    if failed is not None:
        r.status, r.reason = "failed", failed
        return
    if r.step is not None:
        r.status = "reached"
        return
    r.status = "not reached"
    r.val_loss = last[0].val_loss if last else None
    ran_out = "its share of the budget" if share is not None and r.steps_trained < int(overrides["train.max_steps"]) else "its --steps"
    r.reason = f"{r.steps_trained} steps, then {ran_out} ran out; last val loss {loss_text(r.val_loss) if r.val_loss else '-'}"


def rank(result: ToLossResult) -> None:
    """Rank the rungs that reached the target by their training time to it."""
    reached = sorted((r for r in result.rungs if r.status == "reached"), key=lambda r: (r.train_time_s or 0.0))
    fastest = reached[0].train_time_s if reached else None
    for i, r in enumerate(reached, 1):
        r.rank = i
        r.vs_fastest = (r.train_time_s / fastest) if fastest and r.train_time_s is not None else None


def _outcome(r: LossRung) -> str:
    if r.status == "reached":
        return f"val {loss_text(r.val_loss or 0.0)} at step {r.step}, {r.train_time_s:.2f} s of training, {r.tokens:,} tokens"
    return f"{r.status} ({r.reason})"


def table_rows(result: ToLossResult) -> list[list[str]]:
    """Ranked first (fastest to the loss), then the rest in ladder order."""
    rows = [["rank", "rung", "step", "train time s", "tokens", "vs fastest", "val loss", "note"]]
    ordered = sorted(result.rungs, key=lambda r: (r.rank is None, r.rank or 0))
    for r in ordered:
        if r.status == "reached":
            rows.append([str(r.rank), r.label, str(r.step), contention.marked(f"{r.train_time_s:.2f}", r.contention),
                         f"{r.tokens:,}", ratio_text(r.vs_fastest), loss_text(r.val_loss or 0.0), ""])  # fmt: skip
        else:
            rows.append(["-", r.label, "-", "-", "-", "-", "-" if r.val_loss is None else loss_text(r.val_loss),
                         f"{r.status}: {r.reason}"])  # fmt: skip
    return rows


def header_lines(result: ToLossResult) -> list[str]:
    return [
        f"time to val loss {loss_text(result.target)}: preset {result.preset}, B={result.batch_size} T={result.block_size} "
        f"= {result.tokens_per_step:,} tokens/step, at most {result.max_steps} steps a rung, an eval every {result.eval_every}",
        f"device {result.device_name or result.device} ({result.device}), torch {result.torch_version}, {result.date}, "
        f"load average at start {result.load}",
        "train time = the sum of the rung's step times to its first eval at or below the target (evals, checkpoints and "
        "start-up left out, compile warm-up in); rungs are cumulative, the speed ladder's then + Muon, + WSD",
        *([busy] if (busy := contention.line([r.contention for r in result.rungs if r.status in RAN], "rungs")) else []),
    ]


def to_text(result: ToLossResult) -> str:
    return text_table(header_lines(result), table_rows(result))


def text_table(header: list[str], rows: list[list[str]]) -> str:
    """The console's table: rank right, name left, figures right, the last column a free note."""
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]) - 1)]
    lines = list(header) + [""]
    for row in rows:
        cells = [row[0].rjust(widths[0]), row[1].ljust(widths[1])] + [c.rjust(w) for c, w in zip(row[2:-1], widths[2:])]
        lines.append("  ".join(cells) + (f"  {row[-1]}" if row[-1] else ""))
    return "\n".join(lines)


def to_markdown(result: ToLossResult) -> str:
    return ladder.markdown(header_lines(result), result.command, table_rows(result), first="---:")


def save(out: Path, stem: str, result: BaseModel, markdown: str) -> None:
    """`stem`.json (the result) and `stem`.md (its table) in `out`, each written whole."""
    files.atomic_write_bytes(out / f"{stem}.json", json.dumps(result.model_dump(mode="json"), indent=1).encode())
    files.atomic_write_bytes(out / f"{stem}.md", markdown.encode())


def _save(result: ToLossResult, out: Path) -> None:
    save(out, "to_loss", result, to_markdown(result))


def run(args: BenchOptions, command: str) -> int:
    """`gpt2-tui bench --to-loss X`: the rungs ranked by training time to X, printed and written."""
    if not isinstance(args.to_loss, float):
        raise UserError("--to-loss needs a val loss (e.g. --to-loss 4.5) unless --recipe-ladder, "
                        "whose baseline sets it")
    preset = args.preset or "micro"
    bench = ladder.BenchConfig(
        preset=preset, data=args.data, device=args.device, vocab_size=args.vocab_size, batch_size=args.batch_size,
        block_size=args.block_size, grad_accum=args.grad_accum, steps=args.steps or DEFAULT_STEPS, skip=args.skip,
        budget_s=args.budget,
    )  # fmt: skip
    out = args.out or default_out(f"{preset}-to-loss")
    console.out.line(f"time to val loss {loss_text(args.to_loss)}: preset {preset}, at most {bench.steps} steps a rung "
                     f"-> {path_text(out)}", flush=True)  # fmt: skip
    result = run_to_loss(bench, args.to_loss, out, command, say=lambda line: console.out.line(line, flush=True))
    console.out.line()
    console.out.line(to_text(result))
    console.out.line(f"\nwrote {path_text(out / 'to_loss.md')} and {path_text(out / 'to_loss.json')}")
    return 0
