"""The GPU report: the figures a CUDA box owes docs/gpu/, in one command.

    gpt2-tui bench --gpu-report --out DIR            the short-window profile: <= 8 minutes cold on an H100
    gpt2-tui bench --gpu-report --full               every part, about 22 minutes cold on an H100, less warm
    gpt2-tui bench --gpu-report --part memory        one part of the full report (repeatable), merged into the day's
    gpt2-tui bench --gpu-report --dry-run --out DIR  the same plumbing on CPU, with the tiniest shapes

The short-window profile (bench/gpu_window.py: its items, their order and budgets) is what a
first contact of about 15 minutes can bring back: the headline first, then the rest, each item
under its own budget, the report rewritten after every finished row (DEVICE-DATE-short.md and
.json). The full report's parts, each a command of its own run as a child process from the
checkout under a time budget; what it writes or prints becomes the part's figures, recorded
with the command that gives them (its --out left out: the tool then picks a fresh directory):

    tests     pytest tests/train/test_switch_matrix.py tests/gpu/test_gpu.py: every supported switch
              combination on this GPU (engine/switch_matrix.py), then the CUDA code paths
    ladder    the speed ladder, gpt2 at B16 T1024 (ladder.py)
    best      every optimization on; micro-batch 16, 32 x compile default, reduce-overhead (best.py)
    memory    the estimator vs torch.cuda.max_memory_allocated, gpt2 and gpt2-medium (memory_check.py)
    overhead  what the dashboard costs the run it shows (tui/overhead.py, run as a command; needs textual)

A part past its budget is interrupted and keeps what it finished (the ladder and the sweep
save after every rung). The report, docs/gpu/DEVICE-DATE.json and .md, is rewritten after
every part; a part run again the same day replaces its own entry and leaves the others.
The doctor runs once per box and day: a report finding its entry in the day's report (either
profile) reuses it; --no-doctor leaves it out. Every child runs in its own process group and
dies with the report: a report stopped by a signal (a time limit's SIGTERM, Ctrl-C) kills them
and writes what they finished, and one killed outright takes them with it (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.util
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, field_validator

from engine import child, console
from engine import files
from engine.files import atomic_write_bytes
from engine.errors import UserError
from bench.common import BenchOptions
from bench import gpu_window

from bench.names import PARTS  # noqa: E402  (torch-free, for --help)
# Budgets for a first, cold run on an H100 (no compile cache, no dataset yet); a part past its
# budget keeps what it finished. ladder: the default dataset is built first (~30 s: a BPE on the
# stdlib corpus), 5 eager gpt2 rungs at ~15 s each, then 5 compiled rungs whose model changes
# each time (attention, vocab, loss), so each compiles cold: ~60-90 s for gpt2 under inductor.
# best: 4 compiled candidates (2 batches x default, reduce-overhead), ~80 s each cold (the
# CUDA-graph mode also captures), plus 25 timed steps. About 22 minutes together cold; a
# warm compile cache takes a fraction of that. tests: the switch matrix first (every supported
# uncompiled combination of the micro preset, and each compile mode x scope once), then test_gpu.py.
BUDGET_S = {"tests": 600, "ladder": 600, "best": 400, "memory": 120, "overhead": 90}
DOCTOR_BUDGET_S = 240  # its short runs: under a minute on CPU, a cold micro compile on CUDA
KILL_GRACE_S = {"full": 20, "short": 5}  # after a budget's SIGINT, before SIGKILL: the short window has no time
ROOT = Path(__file__).resolve().parents[1]  # the checkout: every part runs from here
TAIL_LINES = 15  # of a failed or interrupted part's output, kept in the report


class PartResult(BaseModel):
    command: str
    status: str  # ok | failed (exit N) | timed out after N s | skipped: why
    budget_s: int
    wall_s: float = 0.0
    ran_at: str = ""
    figures: dict[str, Any] = {}
    markdown: str = ""
    rows: list[str] = []  # the short profile: one line per finished row, written as each lands


class Report(BaseModel):
    device: str
    torch_version: str
    cuda_version: str | None
    device_memory_bytes: int | None
    cpus: int | None
    commit: str | None
    date: str
    dry_run: bool
    profile: str = "full"  # full | short (the short-window profile: bench/gpu_window.py)
    doctor: dict[str, Any] = {}  # `gpt2-tui doctor --json`, run first: what this box can run (gpu_window.DoctorEntry)
    doctor_runs: bool = False  # whether that entry has the doctor's short runs (the full report's), or only its checks
    parts: dict[str, PartResult] = {}

    @field_validator("doctor")
    @classmethod
    def _doctor(cls, value: dict[str, Any]) -> dict[str, Any]:
        return gpu_window.doctor_entry(value)  # a report read back is untrusted: rows of the shape the readers use


# ---------------------------------------------------------------- the parts


def commands(opts: BenchOptions, work: Path) -> dict[str, list[str] | str]:
    """Each part's command (argv), or why it cannot run here."""
    python = [sys.executable, "-m"]
    data = ["--data", str(Path(opts.data).resolve())] if opts.data else []  # the parts run from the checkout
    bench = [*python, "gpt2_tui", "bench", *data, *(["--vocab-size", str(opts.vocab_size)] if opts.vocab_size else [])]
    tests: list[str] | str = [*python, "pytest", "tests/train/test_switch_matrix.py", "tests/gpu/test_gpu.py", "-q",
                              "-rfE", "-p", "no:cacheprovider"]  # fmt: skip
    if opts.dry_run:
        tiny = ["--preset", "micro", "--device", "cpu", "--steps", "1", "--warmup", "1"]
        ladder = [*bench, *tiny, "--skip", "compile"]
        best = [*bench, "--best", *tiny, "--batch-sizes", "2", "--compile-modes", "eager", "--log-interval", "1"]
        memory: list[str] | str = ("skipped: it compares with torch.cuda.max_memory_allocated, which needs CUDA "
                                   "(the CPU check: python -m bench.memory_check --cpu)")  # fmt: skip
        overhead = ["--preset", "micro", "--max-steps", "10", "--rounds", "1"]
    else:
        gpt2 = ["--preset", "gpt2", "--device", "cuda", "--block-size", "1024"]
        ladder = [*bench, *gpt2, "--batch-size", "16", "--steps", "10", "--warmup", "3"]
        best = [*bench, "--best", *gpt2, "--batch-sizes", "16,32", "--compile-modes", "default,reduce-overhead",
                "--steps", "20", "--warmup", "5"]  # fmt: skip
        memory = [*python, "bench.memory_check", "--presets", "gpt2,gpt2-medium", "--batch-sizes", "4,8,16",
                  "--compile", "off"]  # fmt: skip
        overhead = ["--preset", "nano", "--max-steps", "200", "--rounds", "2"]
    if importlib.util.find_spec("pytest") is None:
        tests = ("skipped: pytest not installed here, and the part runs tests/train/test_switch_matrix.py and tests/gpu/test_gpu.py with it "
                 "(docs/gpu/README.md says how to bring it)")  # fmt: skip
    missing = [m for m in ("textual", "textual_plotext", "plotext", "rich") if importlib.util.find_spec(m) is None]
    dashboard: list[str] | str = [*python, "tui.overhead", *overhead, *data]
    if missing:
        dashboard = (f"skipped: {', '.join(missing)} not installed here, and the dashboard is what it measures "
                     "(docs/gpu/README.md says how to bring them)")  # fmt: skip
    return {"tests": tests, "ladder": [*ladder, "--out", str(work / "ladder")],
            "best": [*best, "--out", str(work / "best")], "memory": memory, "overhead": dashboard}  # fmt: skip


def run_doctor(dry_run: bool, runs: bool = True) -> dict[str, Any]:
    """`doctor --json` first, as a child (no CUDA context held here while the parts run);
    its problems are printed, and the report goes on: each part says what it could do.
    Without `runs`, only its checks (no short training runs, nothing compiled)."""
    argv = [sys.executable, "-m", "gpt2_tui", "doctor", "--json",
            *(["--no-runs"] if not runs else [] if dry_run else ["--compile"])]  # fmt: skip
    console.out.line(f"[doctor] {shown(argv)}  (budget {DOCTOR_BUDGET_S} s)", flush=True)
    rc, wall, text = run_part(argv, DOCTOR_BUDGET_S, echo=False)
    found = gpu_window.doctor_json(text)
    if not found:
        console.out.line(f"[doctor] no result ({'timed out' if rc is None else f'exit {rc}'})", flush=True)
        return {"problems": [f"doctor gave no result ({'timed out' if rc is None else f'exit {rc}'})"], "rows": []}
    for line in found.get("problems", []):
        console.out.line(f"[doctor] problem: {line}", flush=True)
    console.out.line(f"[doctor] {len(found.get('problems', []))} problems in {wall:.0f} s", flush=True)
    return found


def shown(argv: list[str]) -> str:
    """The command as a person would type it in the checkout: `python`, no --out (nor --rows-out)."""
    out = ["python"]
    args = iter(argv[1:])
    for a in args:
        if a in ("--out", "--rows-out"):
            next(args)
            continue
        out.append(os.path.relpath(a, ROOT) if os.path.isabs(a) and Path(a).is_relative_to(ROOT) else a)
    return shlex.join(out)


class Stopped(KeyboardInterrupt):
    """The report was told to stop (SIGTERM, SIGHUP): handled as Ctrl-C is, children killed first."""


def _stop(signum: int, frame: Any) -> None:
    raise Stopped(f"signal {signum}")


def run_part(
    argv: list[str], budget_s: float, echo: bool = True, poll: Callable[[str], None] | None = None,
    grace_s: float = KILL_GRACE_S["full"],
) -> tuple[int | None, float, str]:  # fmt: skip
    """Run argv from the checkout, its output echoed, `poll` called with the output so far about
    twice a second; past budget_s, interrupt it (SIGINT, then SIGKILL after grace_s) with
    everything it started. Stopped here (a signal, Ctrl-C): it and everything below it are
    killed at once, then the stop goes on up. (exit status or None, seconds, output)."""
    env = os.environ | {"PYTHONUNBUFFERED": "1"}
    t0 = time.perf_counter()
    proc = child.popen(argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT)  # its own group, killed with the report (engine.child)
    tail = child.Tail(proc.stdout, on_line=(lambda line: console.out.line("    " + line, flush=True)) if echo else None)
    rc: int | None = None
    try:
        deadline = t0 + budget_s
        while True:
            try:
                rc = proc.wait(timeout=max(0.01, min(0.5, deadline - time.perf_counter())))
                break
            except subprocess.TimeoutExpired:
                if poll is not None:
                    poll(tail.text())
                if time.perf_counter() >= deadline:
                    break
        if rc is None:
            for sig, grace in ((signal.SIGINT, grace_s), (signal.SIGKILL, 10)):
                child.kill_group(proc, sig)
                try:
                    proc.wait(timeout=grace)
                    break
                except subprocess.TimeoutExpired:
                    continue
    except BaseException:  # stopped: nothing of it may outlive the report
        child.kill_group(proc, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        raise
    finally:
        child.kill_group(proc, signal.SIGKILL)  # whatever it started and left behind
        tail.join()
    return rc, time.perf_counter() - t0, tail.text()


def figures(part: str, out: Path, text: str, command: str) -> tuple[dict[str, Any], str, str]:
    """A part's figures (for the JSON), its tables (for the markdown) and a note on what failed
    inside it, from what it wrote or printed."""
    from bench import best, ladder

    if part in ("ladder", "best") and (out / f"{part}.json").exists():
        model = ladder.LadderResult if part == "ladder" else best.BestResult
        try:  # the part's own report: untrusted input all the same (bounded, validated)
            r = model.model_validate_json(files.read_text(out / f"{part}.json", gpu_window.CAP))
        except (OSError, ValueError) as err:
            return {}, "", f"its {part}.json could not be read ({type(err).__name__})"
        r.command = command
        if isinstance(r, ladder.LadderResult):
            failed = sum(x.status == "failed" for x in r.rungs)
            return r.model_dump(mode="json"), ladder.to_markdown(r), f"{failed} rungs failed" if failed else ""
        failed = sum(c.status.startswith("failed") for c in r.candidates)
        return r.model_dump(mode="json"), best.to_markdown(r), f"{failed} candidates failed" if failed else ""
    if part == "tests":
        summary = [ln for ln in text.splitlines() if re.search(r"\d+ (passed|failed|skipped|errors?)\b", ln)]
        counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)",
                                                   summary[-1] if summary else "")}  # fmt: skip
        listed = [f"- {ln}" for ln in text.splitlines() if ln.startswith(("FAILED", "ERROR"))]
        md = "\n".join([*listed, summary[-1].strip("= ") if summary else "no pytest summary"]) + "\n"
        return counts, md, ""
    # memory, overhead: their printed markdown, from the header line of the final table on
    start = {"memory": "device: ", "overhead": "config: "}.get(part)
    lines = text.splitlines()
    heads = [i for i, ln in enumerate(lines) if start and ln.startswith(start)]
    kept = lines[heads[-1] :] if heads else [ln for ln in lines if ln.startswith("|")]
    spaced: list[str] = []  # markdown wants a blank line between a table and the text around it
    for i, ln in enumerate(kept):
        if i and ln.startswith("|") != kept[i - 1].startswith("|") and ln and kept[i - 1]:
            spaced.append("")
        spaced.append(ln)
    return {"tables": md_tables(kept)}, "\n".join(spaced) + "\n", ""


def md_tables(lines: list[str]) -> list[list[list[str]]]:
    """The markdown tables among lines: each a list of rows of cells (header first, rules dropped)."""
    tables: list[list[list[str]]] = []
    previous = False
    for ln in lines:
        row = ln.startswith("|")
        if row and not re.fullmatch(r"\|[\s:|-]+\|", ln.strip()):
            if not previous:
                tables.append([])
            tables[-1].append([c.strip() for c in ln.strip().strip("|").split("|")])
        previous = row
    return tables


# ---------------------------------------------------------------- the report


def describe(dry_run: bool) -> Report:
    import torch  # here, not at the top: bench.cli's parser reads PARTS without loading torch

    cuda = not dry_run and torch.cuda.is_available()
    try:
        commit = child.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, timeout=10, stderr=False).output.strip() or None
    except OSError:
        commit = None
    return Report(
        device=torch.cuda.get_device_name(0) if cuda else "CPU (dry run)", torch_version=torch.__version__,
        cuda_version=torch.version.cuda, cpus=os.cpu_count(), commit=commit, dry_run=dry_run,
        device_memory_bytes=torch.cuda.get_device_properties(0).total_memory if cuda else None,
        date=datetime.date.today().isoformat(),
    )  # fmt: skip


def stem(report: Report, profile: str | None = None) -> str:
    """DEVICE-DATE (the full report) or DEVICE-DATE-short: the report's file name without suffix."""
    base = re.sub(r"[^a-z0-9]+", "-", report.device.lower()).strip("-") + "-" + report.date
    return base + ("-short" if (profile or report.profile) == "short" else "")


def to_markdown(r: Report) -> str:
    from engine.text import human

    if r.profile == "short":
        return short_markdown(r)
    memory = f", {human(r.device_memory_bytes)}" if r.device_memory_bytes else ""
    lines = [
        f"# GPU report: {r.device}, {r.date}" + (" (dry run: CPU, tiniest shapes; not a GPU figure)" if r.dry_run else ""),
        "",
        f"{r.device}{memory}; torch {r.torch_version}, CUDA {r.cuda_version or 'none'}; {r.cpus} CPUs; "
        f"commit {r.commit or 'unknown'}. Written by `gpt2-tui bench --gpu-report`; each part below "
        "gives the command that reproduces its figures (docs/gpu/README.md).",
        "",
        "| part | status | wall s | budget s | ran at |",
        "|---|---|---:|---:|---|",
    ]
    if r.doctor:
        problems = r.doctor.get("problems", [])
        lines += ["", "## doctor", "", "Command: `python -m gpt2_tui doctor`", ""]
        lines += [f"- problem: {p}" for p in problems] or ["No problems found."]
        lines += ["", "| section | check | status | s | detail |", "|---|---|---|---:|---|"]
        lines += [f"| {x['section']} | {x['name']} | {x['status']} | "
                  f"{'' if x.get('seconds') is None else format(x['seconds'], '.1f')} | {x['detail']} |"
                  for x in r.doctor.get("rows", [])]  # fmt: skip
    done = [p for p in PARTS if p in r.parts]
    lines += [f"| {p} | {r.parts[p].status} | {r.parts[p].wall_s:.0f} | {r.parts[p].budget_s} | {r.parts[p].ran_at} |"
              for p in done]  # fmt: skip
    for p in done:
        part = r.parts[p]
        lines += ["", f"## {p}", "", f"Command: `{part.command}`  ", f"Status: {part.status}", "", part.markdown.rstrip()]
    return "\n".join(lines).rstrip() + "\n"


def short_markdown(r: Report) -> str:
    """The short-window report: the headline first, then each item as far as it got."""
    from engine.text import human

    memory = f", {human(r.device_memory_bytes)}" if r.device_memory_bytes else ""
    head = r.parts.get("headline")
    top = "  \n".join(head.rows) if head and head.rows else (  # each headline run's line, as it landed
        f"not measured ({head.status})" if head else "not measured yet")  # fmt: skip
    lines = [
        f"# GPU report, short window: {r.device}, {r.date}"
        + (" (dry run: CPU, tiniest shapes; not a GPU figure)" if r.dry_run else ""),
        "", f"**Headline.** {top}", "",
        f"{r.device}{memory}; torch {r.torch_version}, CUDA {r.cuda_version or 'none'}; {r.cpus} CPUs; "
        f"commit {r.commit or 'unknown'}. Written by `gpt2-tui bench --gpu-report` (the short-window profile, "
        "docs/gpu/README.md), rewritten after every finished row; each item gives the commands that reproduce it.",
        "", "| item | status | rows | wall s | budget s | ran at |", "|---|---|---:|---:|---:|---|",
    ]  # fmt: skip
    done = [i for i in gpu_window.ITEMS if i in r.parts]
    lines += [f"| {i} | {r.parts[i].status} | {len(r.parts[i].rows)} | {r.parts[i].wall_s:.0f} | {r.parts[i].budget_s} "
              f"| {r.parts[i].ran_at} |" for i in done]  # fmt: skip
    for i in done:
        item = r.parts[i]
        lines += ["", f"## {i}: {gpu_window.TITLES[i]}", "", f"Command: `{item.command}`  ", f"Status: {item.status}",
                  "", item.markdown.rstrip()]  # fmt: skip
    return "\n".join(lines).rstrip() + "\n"


def load(path: Path) -> Report | None:
    """The report at `path` written earlier (this day's, on this device), or None where there is none.
    Untrusted input: read bounded through the file boundary (a regular file, no link, under
    gpu_window.CAP) and validated by the Report model, its doctor entry included."""
    try:
        text = files.read_text(path, gpu_window.CAP)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):  # a FIFO, a link, a file past the cap, not UTF-8
        raise UserError(f"{path} exists but is not a readable GPU report; move it aside to write this one") from None
    try:
        return Report.model_validate_json(text)
    except ValueError:  # ValidationError is one
        raise UserError(f"{path} exists but is not a GPU report; move it aside to write this one") from None


def save(r: Report, out: Path) -> None:
    atomic_write_bytes(out / f"{stem(r)}.json", r.model_dump_json(indent=1).encode())
    atomic_write_bytes(out / f"{stem(r)}.md", to_markdown(r).encode())


def check(opts: BenchOptions) -> None:
    """Bad input, found before anything runs or is written."""
    import torch

    if not opts.dry_run and not torch.cuda.is_available():
        raise UserError("no CUDA GPU here: --gpu-report measures a CUDA box; "
                        "--dry-run runs its plumbing on CPU with the tiniest shapes")  # fmt: skip
    mine = {"--preset": opts.preset, "--config": opts.config, "--plain": opts.plain, "--best": opts.best,
            "--compile-cache": opts.compile_cache, "--device": opts.device != "auto"}  # fmt: skip
    clash = [flag for flag, value in mine.items() if value]
    if clash:
        raise UserError(f"--gpu-report chooses its own shapes and tools; leave {clash[0]} out")
    if opts.data and not Path(opts.data).is_dir():
        raise UserError(f"--data {opts.data}: no such directory")
    if opts.out is not None and opts.out.exists() and not opts.out.is_dir():
        raise UserError(f"--out {opts.out} is a file; give a directory for the report")


def day_doctor(out: Path, report: Report, runs: bool) -> tuple[dict[str, Any], bool] | None:
    """The doctor entry of the day's report on this device (either profile), when it has what
    is asked for (`runs`: the short runs as well as the checks): the doctor runs once per box."""
    for profile in ("full", "short"):
        earlier = load(out / f"{stem(report, profile)}.json")
        if earlier is not None and earlier.doctor.get("rows") and (earlier.doctor_runs or not runs):
            return earlier.doctor, earlier.doctor_runs
    return None


def run(opts: BenchOptions, command: str) -> int:
    """The short-window profile (no part flags) or the full report (--full, --part); a stop by
    signal kills the running child and everything below it, and keeps what it finished."""
    check(opts)
    report = describe(opts.dry_run)
    report.profile = "full" if opts.full or opts.part else "short"
    out = opts.out or (Path("runs") / "gpu-report-dry-run" if opts.dry_run else Path("docs") / "gpu")
    reused = None if opts.no_doctor else day_doctor(out, report, runs=report.profile == "full")
    if reused is not None:
        report.doctor, report.doctor_runs = reused
    if report.profile == "full":
        load(out / f"{stem(report)}.json")  # a file there that is no report: refused before anything is written
    out.mkdir(parents=True, exist_ok=True)
    main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGTERM, signal.SIGHUP)} if main else {}
    try:
        with tempfile.TemporaryDirectory(prefix="gpt2-tui-gpu-report-") as tmp:
            if report.profile == "short":
                return run_short(opts, report, out, Path(tmp), reused is not None)
            return run_full(opts, report, out, Path(tmp), reused is not None)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_full(opts: BenchOptions, report: Report, out: Path, work: Path, reused: bool) -> int:
    earlier = load(out / f"{stem(report)}.json")
    if earlier is not None:
        report.parts = earlier.parts
    parts = [p for p in PARTS if p in opts.part] if opts.part else list(PARTS)
    console.out.line(f"GPU report: {report.device}, torch {report.torch_version}; parts {', '.join(parts)} "
                     f"-> {out / stem(report)}.md and .json", flush=True)  # fmt: skip
    if opts.no_doctor:
        console.out.line("[doctor] left out (--no-doctor)", flush=True)
    elif reused:
        console.out.line("[doctor] the day's entry reused (the doctor runs once per box)", flush=True)
    else:
        report.doctor, report.doctor_runs = run_doctor(opts.dry_run), True
    save(report, out)
    planned = commands(opts, work)
    for part in parts:
        argv, budget = planned[part], opts.budget or BUDGET_S[part]
        ran_at = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
        if isinstance(argv, str):
            result = PartResult(command="-", status=argv, budget_s=budget, ran_at=ran_at)
        else:
            console.out.line(f"[{part}] {shown(argv)}  (budget {budget} s)", flush=True)
            rc, wall, text = run_part(argv, budget)
            status = "ok" if rc == 0 else f"timed out after {budget} s" if rc is None else f"failed (exit {rc})"
            figs, md, note = figures(part, work / part, text, shown(argv))
            status += f"; {note}" if note else ""
            if rc != 0:
                tail = "\n".join(text.rstrip().splitlines()[-TAIL_LINES:])
                md += f"\nThe end of its output:\n\n```\n{tail}\n```\n"
            result = PartResult(command=shown(argv), status=status, budget_s=budget, wall_s=wall, ran_at=ran_at,
                                figures=figs, markdown=md)  # fmt: skip
        console.out.line(f"[{part}] {result.status}" + (f" in {result.wall_s:.0f} s" if result.wall_s else ""),
                         flush=True)  # fmt: skip
        report.parts[part] = result
        save(report, out)
    console.out.line(f"wrote {out / stem(report)}.md and {out / stem(report)}.json")
    return 1 if any("failed" in report.parts[p].status for p in parts) else 0


def run_short(opts: BenchOptions, report: Report, out: Path, work: Path, reused: bool) -> int:
    """The short-window profile: each item under its own budget, the report saved after every row."""
    full = commands(opts, work)
    missing = {k: v for k, v in full.items() if k in ("tests", "overhead") and isinstance(v, str)}
    planned = gpu_window.commands(opts, work, missing)
    console.out.line(f"GPU report, short window: {report.device}, torch {report.torch_version}; items "
                     f"{', '.join(gpu_window.ITEMS)} -> {out / stem(report)}.md and .json", flush=True)  # fmt: skip
    save(report, out)
    for name in gpu_window.ITEMS:
        budget = opts.budget or (gpu_window.DRY_BUDGET_S if opts.dry_run else gpu_window.BUDGET_S[name])
        ran_at = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
        cmds = planned[name]
        if name == "env" and (opts.no_doctor or reused):
            why = "skipped: --no-doctor" if opts.no_doctor else "ok: the day's doctor entry, reused (once per box)"
            md = gpu_window.doctor_markdown(report.doctor) if reused else ""
            report.parts[name] = PartResult(command="python -m gpt2_tui doctor --json --no-runs", status=why,
                                            budget_s=budget, ran_at=ran_at, markdown=md)  # fmt: skip
        elif isinstance(cmds, str):
            report.parts[name] = PartResult(command="-", status=cmds, budget_s=budget, ran_at=ran_at)
        else:
            report.parts[name] = run_item(name, cmds, budget, work, report, out, opts.dry_run)
            if name == "env" and report.parts[name].figures.get("doctor"):
                report.doctor, report.doctor_runs = report.parts[name].figures["doctor"], False
        result = report.parts[name]
        console.out.line(f"[{name}] {result.status}" + (f" in {result.wall_s:.0f} s" if result.wall_s else ""),
                         flush=True)  # fmt: skip
        save(report, out)
    console.out.line(f"wrote {out / stem(report)}.md and {out / stem(report)}.json")
    return 1 if any(report.parts[i].status.startswith("failed") for i in gpu_window.ITEMS) else 0


def run_item(name: str, cmds: list[list[str]], budget: int, work: Path, report: Report, out: Path,
             dry_run: bool) -> PartResult:  # fmt: skip
    """Run an item's commands in order within `budget`; after each finished row (read as the
    commands write them) the report is saved, then the row is printed: a row printed is on disk."""
    grace = KILL_GRACE_S["short"]
    t0 = time.perf_counter()
    result = PartResult(command="; ".join(shown(c) for c in cmds), status="running", budget_s=budget,
                        ran_at=datetime.datetime.now().strftime("%Y-%m-%d %H:%M"))  # fmt: skip
    report.parts[name] = result
    texts: list[str] = []
    latest = [""]  # all the output so far, the running command's included (stopped, it returns none)

    def refresh(text: str, force: bool = False) -> gpu_window.Rows:
        latest[0] = text = text if len(text) >= len(latest[0]) else latest[0]
        rows = gpu_window.read(name, work, text, dry_run)
        if force or rows.rows != result.rows:
            new = rows.rows[len(result.rows) :] if rows.rows[: len(result.rows)] == result.rows else rows.rows
            result.rows, result.figures, result.markdown = rows.rows, rows.figures, rows.markdown
            result.wall_s = time.perf_counter() - t0
            save(report, out)
            for line in new:
                console.out.line(f"[{name}] row: {line}", flush=True)
        return rows

    rc: int | None = 0
    try:
        for argv in cmds:
            left = budget - (time.perf_counter() - t0)
            if left <= grace + 1:
                rc = None
                break
            console.out.line(f"[{name}] {shown(argv)}  ({left:.0f} s of its {budget} s budget left)", flush=True)
            rc, _, text = run_part(argv, left - grace, poll=lambda t: refresh("".join(texts) + t), grace_s=grace)
            texts.append(text)
            if rc in gpu_window.OK_EXITS.get(name, (0,)):
                rc = 0
            else:
                break
    except BaseException:
        rows = refresh(latest[0], force=True)
        result.status = f"stopped: the report was interrupted ({len(rows.rows)} rows done)"
        save(report, out)
        raise
    rows = refresh("".join(texts), force=True)
    result.wall_s = time.perf_counter() - t0
    if rc == 0:
        result.status = "ok"
    elif rc is None:
        result.status = (f"not reached: past its {budget} s budget; {len(rows.rows)} rows done, "
                         f"{len(rows.pending)} not reached")  # fmt: skip
    else:
        result.status = f"failed (exit {rc})"
    if rows.pending:
        result.markdown += f"\nNot reached ({'past the budget' if rc is None else 'the command ended first'}): " \
                           + "; ".join(rows.pending) + ".\n"
    if rc != 0:
        tail = "\n".join("".join(texts).rstrip().splitlines()[-TAIL_LINES:])
        result.markdown += f"\nThe end of its output:\n\n```\n{tail}\n```\n"
    return result
