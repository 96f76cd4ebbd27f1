"""`gpt2-tui bench --recipe-ladder`: what each of the speedrun's tricks buys here, in training
time to a val loss (issue 40).

    gpt2-tui bench --recipe-ladder [--to-loss [X]] [--preset P] [--seeds N] [--steps N] [--budget S] [--skip TRICK]

The tricks are bench/rungs.py's RECIPE table, in its order. Rows, each trained with the real engine
over the same seeds (paired: --seeds N, default 3, the same seed list for every row):
  - the baseline: the preset with every recipe setting at GPT-2's value (AdamW, cosine, ...),
    trained all its steps; its worst final val loss across the seeds is the target (every seed of
    it reached it), unless --to-loss X names one;
  - the ladder: each trick added in turn on top of the ones before it (cumulative);
  - leave-one-out: the full recipe (every trick that runs here) with one trick left out.
Every row trains to the same --steps (the schedule's length), stopped at its first eval at or
below the target; a row's figure is the median over its seeds of the training time to the target
(the sum of step times: evals, checkpoints and start-up left out), a seed that never got there
counted as never (so a row most seeds never finished has no median); spread = the fastest and
slowest seed that got there. A trick the device cannot run (the switch matrix) or the engine's
preflight refuses is skipped with the reason, and left out of the rows after it.

The budget (--budget; default the ladder's on a CPU, none on a GPU) bounds the whole run: the
baseline's seeds first (if they alone would not fit, nothing else runs, and the table says so);
then a row runs only if its seeds fit what is left at the baseline's pace (a row cut says so, and
a line at the start says how many fit); each run stops at RUN_CAP times the baseline's slowest.
Each row's contention (engine/train/contention.py) is recorded over all its steps.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, NamedTuple

import torch
from pydantic import BaseModel

from bench import ladder, to_loss
from bench.common import BenchOptions, default_out, load_average
from bench.names import RECIPE_NAMES
from bench.rungs import RECIPE, Rung, Share
from engine import console
from engine import events as ev
from engine import files, rundir
from engine.config import RunConfig, resolve
from engine.dataset import Dataset
from engine.device import describe as describe_device, pick as pick_device
from engine.errors import UserError
from engine.inspect.compare import RECIPE_SETTINGS, recipe_text
from engine.run.preflight import preflight, prepared
from engine.run.requests import Control
from engine.text import contention_text, loss_text, path_text, ratio_text
from engine.train import contention

DEFAULT_SEEDS = 3
RUN_CAP = 3.0  # a trick's run stops past this many times the baseline's slowest run (wall clock)
BY_FLAG = "left out by --skip"  # such rows are one line above the table, not rows in it
# A trick the config refuses at the ladder's own batch geometry whatever else is on (a batch ramp
# at grad accum 1, the shipped presets' geometry): a line above the table with its fix, not a row.
BY_GEOMETRY = "not at this batch geometry"
Kind = Literal["baseline", "ladder", "leave-one-out"]


class EvalPoint(BaseModel):
    step: int
    train_time_s: float  # the sum of step times to it
    tokens: int
    val_loss: float


class SeedRun(BaseModel):
    """One row trained from one seed."""

    seed: int
    status: Literal["reached", "not reached", "failed"] = "not reached"
    reason: str | None = None
    step: int | None = None  # the first eval at or below the target
    train_time_s: float | None = None  # training time to it
    tokens: int | None = None
    final_val_loss: float | None = None  # its last eval's
    steps_trained: int = 0
    wall_s: float = 0.0  # the whole run, start-up and evals in
    evals: list[EvalPoint] = []
    contention: ev.Contention | None = None  # over all its steps


class RecipeRow(BaseModel):
    name: str  # baseline, +muon, -muon
    label: str
    kind: Kind
    tricks: list[str] = []  # the tricks on in this row, in the table's order
    changes: dict[str, Any] = {}  # its recipe settings not at GPT-2's values
    status: Literal["ran", "skipped", "pending"] = "pending"
    reason: str | None = None  # why skipped, or a note (a trick that did not run here)
    same_as: str | None = None  # a row with the same settings, whose runs this one shares
    runs: list[SeedRun] = []
    reached: int = 0  # seeds that got to the target
    steps: float | None = None  # median steps to the target (None: most seeds never got there)
    time_s: float | None = None  # median training time to it
    min_time_s: float | None = None  # the fastest and slowest seed that got there
    max_time_s: float | None = None
    vs_baseline: float | None = None  # its time over the baseline's
    gain: float | None = None  # time without the trick over time with it (ladder: vs the row before; else vs full)
    rank: int | None = None  # 1 = the least median time to the target
    contention: ev.Contention | None = None  # over every step of its runs


class RecipeLadderResult(to_loss.TableHeader):
    target: float | None = None
    target_from: Literal["--to-loss", "the baseline's worst final val loss"] = "the baseline's worst final val loss"
    seeds: list[int] = []
    notes: list[str] = []  # the budget's re-plans and stops, as said while running
    rows: list[RecipeRow] = []


# ------------------------------------------------------------------------------ the plan


class Trick(NamedTuple):
    rung: Rung
    values: dict[str, Any] | None  # the settings it sets here, or None: it does not run here
    reason: str | None


def gpt2_values() -> dict[str, Any]:
    """Every recipe setting at GPT-2's value: the baseline, whatever the preset turned on."""
    return dict(RECIPE_SETTINGS)


def tricks_here(skip: list[str], device: torch.device, vocab: int, steps: int, context: int) -> list[Trick]:
    """Each RECIPE trick with its values here (a Share set to this run's steps or context), or why
    it does not run here: --skip, or the switch matrix for this device."""
    out = []
    for r in RECIPE:
        if r.name in skip:
            out.append(Trick(r, None, BY_FLAG))
            continue
        values = {k: v.at(steps, context) if isinstance(v, Share) else v for k, v in r.changes.items()}
        idle = [why for k, v in values.items() if (why := ladder.applicable(k, v, device, vocab)[1]) is not None]
        out.append(Trick(r, None, "; ".join(idle)) if idle else Trick(r, values, None))
    return out


def _at_geometry(t: Trick, preset: str, base: dict[str, Any]) -> Trick:
    """`t`, or `t` with the config's own refusal of it at the ladder's batch geometry (BY_GEOMETRY):
    a trick of the train section (the geometry's) that the config refuses whatever else is on."""
    if t.values is None or not all(k.startswith("train.") for k in t.values):
        return t
    try:
        resolve(preset, None, base | t.values)
    except UserError as err:
        return Trick(t.rung, None, f"{BY_GEOMETRY}: {str(err).removeprefix('invalid config: ')}")
    return t


def left_out(row: RecipeRow) -> bool:
    """Whether a row is a line above the table (BY_FLAG, BY_GEOMETRY), not a row in it."""
    return (row.reason or "").startswith((BY_FLAG, BY_GEOMETRY))


def plan(tricks: list[Trick], refused: Callable[[dict[str, Any]], str | None]) -> list[RecipeRow]:
    """The baseline, the ladder (a trick `refused` on top of the ones before it is skipped with
    the reason and left out after), then leave-one-out from the full recipe; a row whose settings
    an earlier row has is marked `same_as` it (it shares that row's runs)."""
    base = gpt2_values()
    rows = [RecipeRow(name="baseline", label="baseline (GPT-2: AdamW, cosine)", kind="baseline")]
    on: list[Trick] = []
    for t in tricks:
        row = RecipeRow(name=f"+{t.rung.name}", label=t.rung.label, kind="ladder")
        why = t.reason
        if why is None:
            why = refused(base | _merged([*on, t]))
        if why is None:
            on.append(t)
        else:
            row.status, row.reason = "skipped", why
        rows.append(_settle(row, on if why is None else None, base))
    for t in on:
        others = [o for o in on if o is not t]
        row = RecipeRow(name=f"-{t.rung.name}", label=f"full - {t.rung.label.removeprefix('+ ')}", kind="leave-one-out")
        why = refused(base | _merged(others))
        if why is not None:
            row.status, row.reason = "skipped", why
        rows.append(_settle(row, None if why else others, base))
    seen: dict[str, str] = {}
    for row in rows:
        if row.status == "pending":
            key = json.dumps(row.changes, sort_keys=True)
            row.same_as = seen.get(key)
            seen.setdefault(key, row.name)
    return rows


def _merged(tricks: list[Trick]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for t in tricks:
        out |= t.values or {}
    return out


def _settle(row: RecipeRow, on: list[Trick] | None, base: dict[str, Any]) -> RecipeRow:
    if on is not None:
        row.tricks = [t.rung.name for t in on]
        row.changes = {k: v for k, v in _merged(on).items() if base.get(k) != v}
    return row


def overrides_of(row: RecipeRow) -> dict[str, Any]:
    return gpt2_values() | row.changes


# ------------------------------------------------------------------------------ training


def train_once(config: RunConfig, run_dir: Path, seed: int, target: float | None, cap_s: float | None) -> SeedRun:
    """One row from one seed, from scratch: to the end of its steps, or its first eval at or below
    `target`, or `cap_s` seconds, whichever comes first."""
    run = SeedRun(seed=seed)

    def watch(e: Any, control: Control) -> None:
        if isinstance(e, ev.Eval):
            run.evals.append(EvalPoint(step=e.step, train_time_s=e.train_time_s, tokens=e.tokens, val_loss=e.val_loss))
            if target is not None and e.step > 0 and e.val_loss <= target:
                control.stop()
        elif isinstance(e, ev.Step):
            run.steps_trained = e.step

    began = time.monotonic()
    failed, run.contention = to_loss.train_until(config, run_dir, watch, cap_s)
    run.wall_s = time.monotonic() - began
    if failed is not None:
        run.status, run.reason = "failed", failed
    run.final_val_loss = run.evals[-1].val_loss if run.evals else None
    if run.status != "failed":
        if target is not None:
            mark(run, target)
        if run.status != "reached" and cap_s is not None and run.steps_trained < config.train.max_steps:
            run.reason = f"stopped at step {run.steps_trained}: its time cap ({cap_s:.0f} s) ran out"
    return run


def mark(run: SeedRun, target: float) -> None:
    """The run's first eval (after step 0) at or below `target`: its time, tokens and step."""
    hit = next((e for e in run.evals if e.step > 0 and e.val_loss <= target), None)
    if run.status == "failed":
        return
    if hit is None:
        run.status, run.step, run.train_time_s, run.tokens = "not reached", None, None, None
        return
    run.status, run.step, run.train_time_s, run.tokens = "reached", hit.step, hit.train_time_s, hit.tokens


def summarize(row: RecipeRow) -> None:
    """A row's medians over its seeds (a seed that never got there counts as never), spread and contention."""
    never = float("inf")
    times = [r.train_time_s if r.status == "reached" and r.train_time_s is not None else never for r in row.runs]
    steps = [float(r.step) if r.status == "reached" and r.step is not None else never for r in row.runs]
    got = [t for t in times if t != never]
    row.reached = len(got)
    mid, mid_steps = (statistics.median(times), statistics.median(steps)) if times else (never, never)
    row.time_s = mid if mid != never else None
    row.steps = mid_steps if mid_steps != never else None
    row.min_time_s, row.max_time_s = (min(got), max(got)) if got else (None, None)
    row.contention = contention.combine([r.contention for r in row.runs])


def rank(result: RecipeLadderResult) -> None:
    """Ratios against the baseline, each trick's gain, and the rows ranked by median time to the target."""
    rows = {r.name: r for r in result.rows}
    base = rows["baseline"].time_s
    last = next((r for r in reversed(result.rows) if r.kind == "ladder" and r.tricks and r.status == "ran"
                 and not (r.reached == 0 and r.reason)), None)  # every trick that runs (and one dropped: not)  # fmt: skip
    full = last if last is not None and last.status == "ran" else None
    before = rows["baseline"]
    for r in result.rows:
        if r.status != "ran":
            continue
        r.vs_baseline = r.time_s / base if r.time_s is not None and base else None
        if r.kind == "ladder":
            r.gain = before.time_s / r.time_s if before.time_s is not None and r.time_s else None
            before = r
        elif r.kind == "leave-one-out" and full is not None:
            r.gain = r.time_s / full.time_s if r.time_s is not None and full.time_s else None
    timed = sorted((r for r in result.rows if r.status == "ran" and r.time_s is not None and r.same_as is None),
                   key=lambda r: r.time_s or 0.0)  # fmt: skip
    for i, r in enumerate(timed, 1):
        r.rank = i
    for r in result.rows:
        if r.same_as is not None and r.status == "ran":
            r.rank = rows[r.same_as].rank


# ------------------------------------------------------------------------------ the run


def budget_fit(left_s: float, seeds: int, run_s: float) -> int:
    """How many rows of `seeds` runs at `run_s` each fit in `left_s` seconds."""
    return int(left_s // (seeds * run_s)) if run_s > 0 else 1 << 30


def run_ladder(
    bench: ladder.BenchConfig, seeds: int, target: float | None, out: Path, command: str = "",
    say: Callable[[str], None] | None = None,
) -> RecipeLadderResult:  # fmt: skip
    """The whole ladder: planned and checked before a byte is written, then row by row."""
    tell = say or (lambda line: None)
    base = to_loss.base_overrides(bench)
    device = pick_device(bench.device)
    probe, dataset = prepared(resolve(bench.preset, None, base | gpt2_values()), memory=False)
    assert probe.model.vocab_size is not None
    tricks = [_at_geometry(t, bench.preset, base | gpt2_values())
              for t in tricks_here(bench.skip, device, probe.model.vocab_size, bench.steps, probe.seq_len)]  # fmt: skip
    refused = lambda overrides: _refused(bench.preset, base | overrides, dataset)  # noqa: E731
    rows = plan(tricks, refused)
    rundir.check_new(out)
    seed_list = [bench.seed + i for i in range(seeds)]
    budget = bench.budget_for(device)
    result = RecipeLadderResult(
        preset=bench.preset, target=target, target_from="--to-loss" if target is not None else
        "the baseline's worst final val loss", device=str(device), device_name=describe_device(device),
        load=load_average(), batch_size=probe.train.batch_size, block_size=probe.seq_len,
        tokens_per_step=probe.tokens_per_step, max_steps=bench.steps, seeds=seed_list, budget_s=budget,
        command=command, rows=rows,
    )  # fmt: skip
    files.make_dir(out)
    t0 = time.monotonic()

    def left() -> float | None:
        return None if budget is None else budget - (time.monotonic() - t0)

    def note(line: str) -> None:
        result.notes.append(line)
        tell(f"  {line}")

    baseline = rows[0]
    tell(f"  {baseline.label}: {len(seed_list)} seeds, {bench.steps} steps each")
    for i, seed in enumerate(seed_list):
        # all its steps, whatever the target: its final val loss sets the target; its time to it is read after
        baseline.runs.append(train_once(_config(bench, base, baseline, seed), _dir(out, 0, baseline, seed), seed,
                                        None, left()))  # fmt: skip
        pace = max(r.wall_s for r in baseline.runs)
        tell(f"    seed {seed}: {_seed_outcome(baseline.runs[-1])}")
        to_go = len(seed_list) - i - 1
        why = _baseline_stop(baseline.runs[-1], bench.steps, budget, left(), pace, len(seed_list), to_go)
        if why is not None:
            note(f"stopped: {why}")
            baseline.status, baseline.reason = "skipped", f"stopped: {why}"
            for r in rows[1:]:
                if r.status == "pending":
                    r.status, r.reason = "skipped", "the baseline did not finish: no target"
            _save(result, out)
            return result
    baseline.status = "ran"
    if target is None:
        finals = [r.final_val_loss for r in baseline.runs if r.final_val_loss is not None]
        target = result.target = max(finals) if finals else None
    if target is None:
        note("stopped: the baseline evaluated no val loss, so there is no target")
        _save(result, out)
        return result
    for r in baseline.runs:
        mark(r, target)
    summarize(baseline)
    tell(f"  target: val loss {loss_text(target)} ({result.target_from})")
    pace = max(r.wall_s for r in baseline.runs)
    todo = [r for r in rows[1:] if r.status == "pending" and r.same_as is None]
    left_now = left()
    if left_now is not None and (fit := budget_fit(left_now, len(seed_list), pace)) < len(todo):
        note(f"budget: about {fit} of the {len(todo)} rows left fit the {left_now:.0f} s left (a row of "
             f"{len(seed_list)} seeds takes up to ~{len(seed_list) * pace:.0f} s at the baseline's pace); rows that "
             "reach the target sooner leave room for more; the rest are cut, each saying so")  # fmt: skip
    _save(result, out)
    for n, row in enumerate(rows[1:], 1):
        if row.status != "pending" or row.same_as is not None:  # skipped, or another row's runs
            continue
        left_now = left()
        if left_now is not None and left_now < len(seed_list) * pace:
            row.status = "skipped"
            row.reason = (f"cut by --budget {budget or 0:g} s: {max(0.0, left_now):.0f} s were left, a row "
                          f"takes ~{len(seed_list) * pace:.0f} s ({len(seed_list)} seeds at the baseline's "
                          "pace)")  # fmt: skip
            note(f"{row.label}: {row.reason}")
            continue
        tell(f"  {row.label}: {recipe_text(row.changes)}")
        for seed in seed_list:
            cap = RUN_CAP * pace if left() is None else min(RUN_CAP * pace, max(1.0, left() or 0.0))
            row.runs.append(train_once(_config(bench, base, row, seed), _dir(out, n, row, seed), seed, target, cap))
            tell(f"    seed {seed}: {_seed_outcome(row.runs[-1])}")
        row.status = "ran"
        summarize(row)
        if row.kind == "ladder" and row.reached == 0 and not cut_short(row):
            drop_trick(row, tricks, rows, n, refused, note)
        _save(result, out)
    by_name = {r.name: r for r in rows}
    for row in rows:
        if row.same_as is not None:
            twin = by_name[row.same_as]
            row.status, row.runs = twin.status, twin.runs
            row.reason = twin.reason if twin.status != "ran" else f"same settings as {twin.label}"
            if twin.status == "ran":
                summarize(row)
    rank(result)
    _save(result, out)
    return result


def cut_short(row: RecipeRow) -> bool:
    """A row a seed of which failed or was stopped by its time cap: its never may not be the trick's own."""
    return any(r.status == "failed" or (r.reason or "").startswith("stopped at step") for r in row.runs)


def drop_trick(row: RecipeRow, tricks: list[Trick], rows: list[RecipeRow], n: int,
               refused: Callable[[dict[str, Any]], str | None], note: Callable[[str], None]) -> None:  # fmt: skip
    """A trick whose ladder row reached the target from no seed is left out of every row after it
    (the ladder's and the full recipe's), as a refused one is: else each leave-one-out row would
    carry it and tell nothing. The rows still to run are re-planned without it."""
    name = row.tricks[-1]
    row.reason = "never reached the target: left out of the rows after it and of the full recipe"
    note(f"{row.label}: {row.reason}")
    kept = [t for t in tricks if t.rung.name != name]
    tricks[:] = kept
    fresh = {r.name: r for r in plan(kept, refused)}
    for later in rows[n + 1 :]:
        if later.status != "pending":
            continue
        again = fresh.get(later.name)
        if again is None:  # this trick's own leave-one-out: the full recipe is without it already
            later.status, later.same_as = "skipped", None
            later.reason = f"{row.label.removeprefix('+ ')} is not in the full recipe: {row.reason}"
            continue
        later.tricks, later.changes, later.same_as = again.tricks, again.changes, again.same_as
        later.status, later.reason = again.status, again.reason


def _baseline_stop(last: SeedRun, steps: int, budget: float | None, left: float | None, pace: float, seeds: int,
                   to_go: int) -> str | None:  # fmt: skip
    """Why the ladder stops after a baseline seed (it failed, or its seeds do not fit the budget), or None."""
    if last.status == "failed":
        return f"the baseline failed: {last.reason}"
    if last.steps_trained >= steps and (left is None or left >= pace * to_go):
        return None
    return (f"the baseline's {seeds} seeds need about {pace * seeds:.0f} s (a run took {pace:.0f} s), more than the "
            f"--budget of {budget or 0:g} s: raise --budget, or lower --steps or --seeds")  # fmt: skip


def _refused(preset: str, overrides: dict[str, Any], dataset: Dataset) -> str | None:
    """The engine's preflight of a row's config (device, data, combinations): its first refusal, or None."""
    try:
        verdict = preflight(resolve(preset, None, overrides), dataset=dataset, memory=False)
        verdict.raise_first()
    except UserError as err:
        return str(err).splitlines()[0][:300]
    return None


def _config(bench: ladder.BenchConfig, base: dict[str, Any], row: RecipeRow, seed: int) -> RunConfig:
    return resolve(bench.preset, None, base | overrides_of(row) | {"train.seed": seed})


def _dir(out: Path, n: int, row: RecipeRow, seed: int) -> Path:
    name = {"+": "add-", "-": "drop-"}.get(row.name[0], "") + row.name.lstrip("+-")
    return out / f"{n:02d}-{name}" / f"seed-{seed}"


def _seed_outcome(r: SeedRun) -> str:
    busy = contention_text(r.contention, short=True)
    mark_ = f"  {contention.MARK} {busy}" if busy else ""
    if r.status == "reached":
        return f"val {loss_text(r.evals[-1].val_loss)} at step {r.step}, {r.train_time_s:.2f} s of training{mark_}"
    if r.status == "failed":
        return f"failed: {r.reason}"
    last = "-" if r.final_val_loss is None else loss_text(r.final_val_loss)
    return f"{r.steps_trained} steps, final val loss {last}" + (f" ({r.reason})" if r.reason else "") + mark_


# ------------------------------------------------------------------------------ the tables


def table_rows(result: RecipeLadderResult) -> list[list[str]]:
    """The rows in the plan's order (baseline, ladder, leave-one-out), each with its rank."""
    n = len(result.seeds)
    out = [["rank", "row", "steps", "time to target s", "vs baseline", "trick gain", "spread s", "reached", "note"]]
    for r in result.rows:
        if left_out(r):
            continue
        if r.status != "ran":
            out.append(["-", r.label, "-", "-", "-", "-", "-", "-", f"{r.status}: {r.reason}"])
            continue
        never = [str(s.seed) for s in r.runs if s.status != "reached"]
        notes = ([f"never reached by seed {', '.join(never)}"] if never else []) + ([r.reason] if r.reason else [])
        failed = [f"seed {s.seed} failed: {s.reason}" for s in r.runs if s.status == "failed"]
        out.append([
            "-" if r.rank is None else str(r.rank), r.label, "-" if r.steps is None else f"{r.steps:g}",
            "-" if r.time_s is None else contention.marked(f"{r.time_s:.2f}", r.contention),
            ratio_text(r.vs_baseline), ratio_text(r.gain),
            "-" if r.min_time_s is None else f"{r.min_time_s:.2f}-{r.max_time_s:.2f}", f"{r.reached}/{n}",
            "; ".join(notes + failed[:1]),
        ])  # fmt: skip
    return out


def header_lines(result: RecipeLadderResult) -> list[str]:
    target = "-" if result.target is None else loss_text(result.target)
    busy = contention.line([r.contention for r in result.rows if r.status == "ran"], "rows")
    skipped = [r.name.lstrip("+") for r in result.rows if r.reason == BY_FLAG]
    return [
        f"recipe ladder, time to val loss {target} ({result.target_from}): preset {result.preset}, "
        f"B={result.batch_size} T={result.block_size} = {result.tokens_per_step:,} tokens/step, {result.max_steps} "
        f"steps a run, an eval every {result.eval_every}, seeds {', '.join(map(str, result.seeds))} "
        "(paired: the same for every row)",
        f"device {result.device_name or result.device} ({result.device}), torch {result.torch_version}, {result.date}, "
        f"load average at start {result.load}" + (f", budget {result.budget_s:g} s" if result.budget_s else ""),
        "time to target = the median over the seeds of the training time (sum of step times: evals, checkpoints and "
        "start-up left out) to the first eval at or below the target, a seed that never got there counted as never; "
        "spread = the fastest and slowest seed that got there; steps = the median steps to it",
        "trick gain = time without the trick over time with it (ladder: the row before over this row; "
        "full - X: this row over the full recipe); above 1.00x the trick bought time here",
        *result.notes,
        *([f"{BY_FLAG}: {', '.join(skipped)}"] if skipped else []),
        *(f"{r.name.lstrip('+')} {r.reason}" for r in result.rows if (r.reason or "").startswith(BY_GEOMETRY)),
        *([busy] if busy else []),
    ]


def to_text(result: RecipeLadderResult) -> str:
    return to_loss.text_table(header_lines(result), table_rows(result))


def to_markdown(result: RecipeLadderResult) -> str:
    return ladder.markdown(header_lines(result), result.command, table_rows(result), first="---:")


def _save(result: RecipeLadderResult, out: Path) -> None:
    to_loss.save(out, "recipe_ladder", result, to_markdown(result))


def run(args: BenchOptions, command: str) -> int:
    """`gpt2-tui bench --recipe-ladder`: the tricks' rows ranked by training time to the target, printed and written."""
    speed = [s for s in args.skip if s not in RECIPE_NAMES]
    if speed:
        raise UserError(f"--recipe-ladder climbs the speedrun's tricks; {speed[0]!r} is none of them: "
                        f"--skip takes {', '.join(RECIPE_NAMES)}")  # fmt: skip
    preset = args.preset or "micro"
    bench = ladder.BenchConfig(
        preset=preset, data=args.data, device=args.device, vocab_size=args.vocab_size, batch_size=args.batch_size,
        block_size=args.block_size, grad_accum=args.grad_accum, steps=args.steps or to_loss.DEFAULT_STEPS,
        skip=args.skip, budget_s=args.budget,
    )  # fmt: skip
    target = args.to_loss if isinstance(args.to_loss, float) else None  # else the baseline sets it
    seeds = args.seeds or DEFAULT_SEEDS
    out = args.out or default_out(f"{preset}-recipe-ladder")
    console.out.line(f"recipe ladder: preset {preset}, {seeds} seeds, {bench.steps} steps a run -> {path_text(out)}",
                     flush=True)  # fmt: skip
    result = run_ladder(bench, seeds, target, out, command, say=lambda line: console.out.line(line, flush=True))
    console.out.line()
    console.out.line(to_text(result))
    console.out.line(f"\nwrote {path_text(out / 'recipe_ladder.md')} and {path_text(out / 'recipe_ladder.json')}")
    return 0
