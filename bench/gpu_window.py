"""The GPU report's short-window profile: what a first GPU contact of about 15 minutes brings back.

`gpt2-tui bench --gpu-report` with no part flags runs these items in this order, each as child
commands under its own budget (bench/gpu_report.py runs them, reads their rows as they land and
rewrites the report after every row); past its budget an item is interrupted, keeps its finished
rows and marks the rest "not reached", and the next item runs:

    env       the doctor's checks, no compile and no runs (once per box: the day's entry is reused)
    headline  gpt2 T1024 B16 bf16, compile, flash, fused AdamW: ms/step, tok/s, MFU, memory vs the estimator;
              then the speedrun preset's recipe at the same shape (Muon, its tricks, the device's loss),
              then that recipe with a 256-token sliding window (FlexAttention, compiled)
    matrix    the switch matrix on this GPU (tests/train/test_switch_matrix.py), the riskiest first:
              max-autotune, then CUDA graphs, then the other compiled cases, then the eager ones
    ladder    the rungs that matter on a GPU: baseline, AMP, compile, flash attention, fused (+ pinned, prefetch)
    best      micro-batch 16, 32 x compile default, then max-autotune-no-cudagraphs
    overhead  what the dashboard costs the run it shows (tui/overhead.py, nano)

Budgets (seconds, a cold H100: no compile cache, no dataset built yet), 460 in all, so the
profile ends within 8 minutes with the parent's start-up; how each was estimated is in
docs/gpu/README.md. With a warm compile cache every item ends well inside its budget.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from engine import files

CAP = 64 * 1024 * 1024  # what an item's JSON may reach (the ladder keeps every rung's step times)

BUDGET_S: dict[str, int] = {"env": 35, "headline": 215, "matrix": 70, "ladder": 70, "best": 45, "overhead": 25}
# The headline's runs, each in its own directory: GPT-2 with every speed switch, then the speedrun's recipe at
# the same shape (Muon, the window-free tricks, the device's loss: what the recipe costs a step on this GPU),
# then that recipe with a 256-token window (FlexAttention's first training run; last: the budget may cut it).
HEADLINES: tuple[tuple[str, list[str]], ...] = (("headline", []), ("headline-speedrun", ["--recipe"]),
                                                ("headline-window", ["--recipe", "--window", "256"]))
ITEMS: tuple[str, ...] = tuple(BUDGET_S)
DRY_BUDGET_S = 120  # each item on a CPU dry run: the plumbing, not a timing (a loaded 2-core box is slow)
DRY_VOCAB = 8192  # the embedded stdlib corpus's BPE vocab
WINDOW_S = 480  # the whole profile, cold on an H100: the item budgets plus the parent's start-up
TITLES = {
    "env": "environment (the doctor's checks, no compile)",
    "headline": ("gpt2 T1024 B16 bf16, compile, flash, fused AdamW, padded vocab; the speedrun's recipe at that shape, "
                 "and with a window"),
    "matrix": "compiled CUDA switch combinations, max-autotune first, then the eager ones as time allows",
    "ladder": "the rungs AMP -> compile -> flash attention -> fused, over the fp32 eager baseline",
    "best": "best of micro-batch 16/32 x compile default / max-autotune-no-cudagraphs",
    "overhead": "the dashboard's overhead",
}
OK_EXITS = {"env": (0, 1)}  # the doctor exits 1 when it found a problem: its rows say which, and the report goes on
LADDER_SKIPS = ("preload", "vectorized", "tf32", "pad_vocab", "chunked_loss")  # cheap or memory rungs: the full report
BEST_MODES = ("default", "max-autotune-no-cudagraphs")  # in this order: the cheap compile first
DRY_MATRIX = "cpu_combination and fp32-compile_mode and flash-grad_checkpointing and False-loss and plain"


class Rows(NamedTuple):
    """What an item has finished so far, read from what its commands wrote or printed."""

    figures: dict[str, Any]
    rows: list[str]  # one line per finished row
    pending: list[str]  # rows planned and not finished (marked "not reached" when the budget ends)
    markdown: str


def commands(opts: Any, work: Path, missing: dict[str, str]) -> dict[str, list[list[str]] | str]:
    """Each item's commands (run in order within its budget), or why it cannot run here;
    `missing` names what a part needs and lacks (pytest, textual), as gpu_report found it."""
    python = [sys.executable, "-m"]
    data = ["--data", str(Path(opts.data).resolve())] if opts.data else []
    vocab = ["--vocab-size", str(opts.vocab_size)] if opts.vocab_size else []
    bench = [*python, "gpt2_tui", "bench", *data, *vocab]
    skips = [a for s in LADDER_SKIPS for a in ("--skip", s)]
    matrix = [*python, "pytest", "-p", "bench.matrix_rows", "--rows-out", str(work / "matrix.json"),
              "tests/train/test_switch_matrix.py", "-q", "-rfE", "-p", "no:cacheprovider", "-k"]  # fmt: skip
    if opts.dry_run and not opts.data and not opts.vocab_size:
        vocab = ["--vocab-size", str(DRY_VOCAB)]  # the stdlib corpus's own: GPT-2's 50257 would dwarf micro
        bench = [*bench, *vocab]
    if opts.dry_run:  # CPU, the tiniest shapes, nothing compiled: the plumbing only
        tiny = ["--preset", "micro", "--device", "cpu", "--steps", "1", "--warmup", "1"]
        headline = ["--dry-run", "--batch-size", "2", "--block-size", "32", "--steps", "1", "--warmup", "1"]
        matrix.append(DRY_MATRIX)
        ladder = [*bench, *tiny, "--batch-size", "2", "--block-size", "32", "--skip", "compile", *skips]
        best = [[*bench, "--best", *tiny, "--block-size", "32", "--batch-sizes", "1,2", "--compile-modes", "eager",
                 "--log-interval", "1", "--out", str(work / "best-0")]]  # fmt: skip
        overhead = ["--preset", "micro", "--max-steps", "3", "--batch-size", "1", "--rounds", "1"]
    else:
        gpt2 = ["--preset", "gpt2", "--device", "cuda", "--block-size", "1024"]
        headline = ["--batch-size", "16", "--block-size", "1024", "--steps", "20", "--warmup", "5"]
        matrix.append("cuda_combination")
        ladder = [*bench, *gpt2, "--batch-size", "16", "--steps", "6", "--warmup", "2", *skips,
                  "--budget", str(max(1, (opts.budget or BUDGET_S["ladder"]) - 10))]  # fmt: skip
        best = [[*bench, "--best", *gpt2, "--batch-sizes", "16,32", "--compile-modes", mode, "--steps", "10",
                 "--warmup", "5", "--log-interval", "5", "--out", str(work / f"best-{i}")]
                for i, mode in enumerate(BEST_MODES)]  # fmt: skip
        overhead = ["--preset", "nano", "--max-steps", "100", "--rounds", "1"]
    planned: dict[str, list[list[str]] | str] = {
        "env": [[*python, "gpt2_tui", "doctor", "--json", "--no-runs"]],
        "headline": [[*python, "bench.headline", *headline, *data, *vocab, *recipe, "--out", str(work / out)]
                     for out, recipe in HEADLINES],
        "matrix": ("skipped: pytest not installed here, and the item runs tests/train/test_switch_matrix.py with it "
                   "(docs/gpu/README.md says how to bring it)") if "tests" in missing else [matrix],  # fmt: skip
        "ladder": [[*ladder, "--out", str(work / "ladder")]],
        "best": best,
        "overhead": missing.get("overhead") or [[*python, "tui.overhead", *overhead, *data]],
    }
    return planned


# ---------------------------------------------------------------- reading an item's rows


def read(item: str, work: Path, text: str, dry_run: bool) -> Rows:
    """An item's finished rows so far (called while it runs, and once more when it ends); the
    tools' tables without their own command lines: the item's commands are the report's."""
    reader = {"env": _env, "headline": _headline, "matrix": _matrix, "ladder": _ladder, "best": _best,
              "overhead": _overhead}[item]  # fmt: skip
    try:
        return reader(work, text, dry_run)
    except (OSError, ValueError):  # a file half way through its first write: nothing finished yet
        return Rows({}, [], [], "")


class DoctorRow(BaseModel):
    """One row of `doctor --json`, as the report's readers use it (anything more is kept)."""

    model_config = ConfigDict(extra="allow")
    section: str
    name: str
    status: str
    seconds: float | None = Field(None, allow_inf_nan=False)
    detail: str = ""


class DoctorEntry(BaseModel):
    """`doctor --json`: its rows and problems. A report's doctor entry is read through this model
    (a child's output, a report file written earlier: untrusted input either way)."""

    model_config = ConfigDict(extra="allow")
    rows: list[DoctorRow] = []
    problems: list[str] = []


def doctor_entry(value: Any) -> dict[str, Any]:
    """`value` as a doctor entry of the shape its readers use; ValueError (pydantic's) where it is not."""
    return DoctorEntry.model_validate(value).model_dump() if value else {}


def doctor_json(text: str) -> dict[str, Any]:
    """`doctor --json` from a command's output (whatever torch warned on stderr comes first), checked
    by DoctorEntry; {} where there is none or it is malformed."""
    start = text.find('{\n "rows"')
    try:
        return doctor_entry(json.loads(text[start:])) if start >= 0 else {}
    except ValueError:
        return {}


def doctor_markdown(doctor: dict[str, Any]) -> str:
    problems = doctor.get("problems", [])
    lines = [f"- problem: {p}" for p in problems] or ["No problems found."]
    lines += ["", "| section | check | status | s | detail |", "|---|---|---|---:|---|"]
    lines += [f"| {x['section']} | {x['name']} | {x['status']} | "
              f"{'' if x.get('seconds') is None else format(x['seconds'], '.1f')} | {x['detail']} |"
              for x in doctor.get("rows", [])]  # fmt: skip
    return "\n".join(lines) + "\n"


def _env(work: Path, text: str, dry_run: bool) -> Rows:
    found = doctor_json(text)
    if not found:
        return Rows({}, [], ["the doctor's checks"], "")
    checks, problems = found.get("rows", []), found.get("problems", [])
    row = f"{len(checks)} checks, {len(problems)} problems" + "".join(f"; problem: {p}" for p in problems)
    return Rows({"doctor": found}, [row], [], doctor_markdown(found))


def _headline(work: Path, text: str, dry_run: bool) -> Rows:
    from bench import headline

    found = {}
    for out, _ in HEADLINES:
        path = work / out / "headline.json"
        if path.is_file():
            found[out] = headline.Headline.model_validate_json(files.read_text(path, CAP))
    pending = [out for out, _ in HEADLINES if out not in found]
    if not found:
        return Rows({}, [], pending, "")
    rows = [headline.line(h) for h in found.values()]
    md = "\n\n".join(rows) + f"\n\nMFU convention: {next(iter(found.values())).mfu_convention}.\n"
    first = found.get(HEADLINES[0][0])
    figures = (first.model_dump(mode="json") if first else {}) | {
        out: h.model_dump(mode="json") for out, h in found.items() if out != HEADLINES[0][0]}  # fmt: skip
    return Rows(figures, rows, pending, md)


def _matrix(work: Path, text: str, dry_run: bool) -> Rows:
    path = work / "matrix.json"
    if not path.is_file():
        return Rows({}, [], ["the switch matrix's cases"], "")
    found = json.loads(files.read_text(path, CAP))
    done = {r["case"]: r for r in found.get("rows", [])}
    collected = found.get("collected", [])
    md = ["| case | compiled | outcome | s | error |", "|---|---|---|---:|---|"]
    for c in collected:
        r = done.get(c["case"])
        cells = [r["outcome"], f"{r['seconds']:.1f}", r["error"].replace("|", "/")] if r else ["not reached", "", ""]
        md.append(f"| {_case(c['case'])} | {'yes' if c['compiled'] else 'no'} | " + " | ".join(cells) + " |")
    rows = [f"{_case(r['case'])}: {r['outcome']} ({r['seconds']:.1f} s)" for r in found.get("rows", [])]
    pending = [_case(c["case"]) for c in collected if c["case"] not in done]
    return Rows(found, rows, pending, "\n".join(md) + "\n")


def _case(nodeid: str) -> str:
    """A case's parameters, without the test function's name."""
    m = re.search(r"\[(.*)\]$", nodeid)
    return m.group(1) if m else nodeid


def _ladder(work: Path, text: str, dry_run: bool) -> Rows:
    from bench import ladder

    path = work / "ladder" / "ladder.json"
    if not path.is_file():
        return Rows({}, [], ["the ladder's rungs"], "")
    r = ladder.LadderResult.model_validate_json(files.read_text(path, CAP))
    rows = [f"{x.label}: " + (f"{1000 * x.median_step_s:.1f} ms/step" if x.status == "ran" and x.median_step_s
                              else f"{x.status} ({x.reason})") for x in r.rungs if x.status != "pending"]  # fmt: skip
    return Rows(r.model_dump(mode="json"), rows, [x.label for x in r.rungs if x.status == "pending"],
                _no_command(ladder.to_markdown(r)))  # fmt: skip


def _best(work: Path, text: str, dry_run: bool) -> Rows:
    from bench import best

    found = sorted(work.glob("best-*/best.json"))
    parts = [best.BestResult.model_validate_json(files.read_text(p, CAP)) for p in found]
    planned = [(1, "eager"), (2, "eager")] if dry_run else [(b, m) for m in BEST_MODES for b in (16, 32)]
    if not parts:
        return Rows({}, [], [f"B{b} {m}" for b, m in planned], "")
    merged = parts[0].model_copy(update={"candidates": [c for p in parts for c in p.candidates],
                                         "command": "; ".join(p.command for p in parts)})  # fmt: skip
    done = {(c.batch_size, c.compile_mode) for c in merged.candidates}
    rows = [f"B{c.batch_size} {c.compile_mode}: " + (f"{c.tokens_per_s:,.0f} tok/s" if c.tokens_per_s else c.status)
            for c in merged.candidates]  # fmt: skip
    pending = [f"B{b} {m}" for b, m in planned if (b, m) not in done]
    md = _no_command(best.to_markdown(merged))
    if pending:
        md += "".join(f"| {p.split()[0][1:]} | {p.split()[1]} | - | - | - | - | - | not reached |\n" for p in pending)
    top = merged.best
    if top is not None:
        md += f"\nBest: micro-batch {top.batch_size}, compile {top.compile_mode}: {top.tokens_per_s:,.0f} tok/s.\n"
    return Rows(merged.model_dump(mode="json"), rows, pending, md)


def _no_command(md: str) -> str:
    """A tool's table without its own command line (with its --out): the item's commands are the report's."""
    return "".join(ln for ln in md.splitlines(keepends=True) if not ln.startswith("Command: "))


def _overhead(work: Path, text: str, dry_run: bool) -> Rows:
    lines = text.splitlines()
    heads = [i for i, ln in enumerate(lines) if ln.startswith("config: ")]
    if not heads:
        return Rows({}, [], ["the dashboard's overhead"], "")
    kept = lines[heads[-1] :]
    table = [ln for ln in kept if ln.startswith("|")]
    rows = [ln for ln in table[2:]]
    spaced: list[str] = []
    for i, ln in enumerate(kept):
        if i and ln.startswith("|") != kept[i - 1].startswith("|") and ln and kept[i - 1]:
            spaced.append("")
        spaced.append(ln)
    return Rows({"lines": kept}, rows, [], "\n".join(spaced) + "\n")
