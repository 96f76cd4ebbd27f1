"""The GPU report: the figures a CUDA box owes docs/gpu/, in one command.

    gpt2-tui bench --gpu-report                      every part, about 22 minutes cold on an H100, less warm
    gpt2-tui bench --gpu-report --part memory        one part (repeatable), merged into the day's report
    gpt2-tui bench --gpu-report --dry-run --out DIR  the same plumbing on CPU, with the tiniest shapes

Each part is a command of its own, run as a child process from the checkout under a time
budget; what it writes or prints becomes the part's figures, recorded with the command
that gives them (its --out left out: the tool then picks a fresh directory):

    tests     pytest tests/train/test_switch_matrix.py tests/gpu/test_gpu.py: every supported switch
              combination on this GPU (engine/switch_matrix.py), then the CUDA code paths
    ladder    the speed ladder, gpt2 at B16 T1024 (ladder.py)
    best      every optimization on; micro-batch 16, 32 x compile default, reduce-overhead (best.py)
    memory    the estimator vs torch.cuda.max_memory_allocated, gpt2 and gpt2-medium (memory_check.py)
    overhead  what the dashboard costs the run it shows (tui/overhead.py, run as a command; needs textual)

A part past its budget is interrupted and keeps what it finished (the ladder and the sweep
save after every rung). The report, docs/gpu/DEVICE-DATE.json and .md, is rewritten after
every part; a part run again the same day replaces its own entry and leaves the others.
"""

from __future__ import annotations

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
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from engine.files import atomic_write_bytes
from engine.errors import UserError
from bench.common import BenchOptions

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


class Report(BaseModel):
    device: str
    torch_version: str
    cuda_version: str | None
    device_memory_bytes: int | None
    cpus: int | None
    commit: str | None
    date: str
    dry_run: bool
    doctor: dict[str, Any] = {}  # `gpt2-tui doctor --json`, run first: what this box can run
    parts: dict[str, PartResult] = {}


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


def run_doctor(dry_run: bool) -> dict[str, Any]:
    """`doctor --json` first, as a child (no CUDA context held here while the parts run);
    its problems are printed, and the report goes on: each part says what it could do."""
    import json

    argv = [sys.executable, "-m", "gpt2_tui", "doctor", "--json", *([] if dry_run else ["--compile"])]
    print(f"[doctor] {shown(argv)}  (budget {DOCTOR_BUDGET_S} s)", flush=True)
    rc, wall, text = run_part(argv, DOCTOR_BUDGET_S, echo=False)
    try:
        start = text.find('{\n "rows"')  # the JSON, after whatever torch may have warned on stderr
        found = json.loads(text[start:]) if start >= 0 else {}
    except ValueError:
        found = {}
    if not found:
        print(f"[doctor] no result ({'timed out' if rc is None else f'exit {rc}'})", flush=True)
        return {"problems": [f"doctor gave no result ({'timed out' if rc is None else f'exit {rc}'})"], "rows": []}
    for line in found.get("problems", []):
        print(f"[doctor] problem: {line}", flush=True)
    print(f"[doctor] {len(found.get('problems', []))} problems in {wall:.0f} s", flush=True)
    return found


def shown(argv: list[str]) -> str:
    """The command as a person would type it in the checkout: `python`, no --out."""
    out = ["python"]
    args = iter(argv[1:])
    for a in args:
        if a == "--out":
            next(args)
            continue
        out.append(os.path.relpath(a, ROOT) if os.path.isabs(a) and Path(a).is_relative_to(ROOT) else a)
    return shlex.join(out)


def run_part(argv: list[str], budget_s: int, echo: bool = True) -> tuple[int | None, float, str]:
    """Run argv from the checkout, its output echoed; past budget_s, interrupt it (SIGINT,
    then SIGKILL) with everything it started. (exit status or None, seconds, output)."""
    env = os.environ | {"PYTHONUNBUFFERED": "1"}
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # fmt: skip
    assert proc.stdout is not None
    lines: list[str] = []

    def pump() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if echo:
                print(f"    {line}", end="", flush=True)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        rc: int | None = proc.wait(timeout=budget_s)
    except subprocess.TimeoutExpired:
        rc = None
        for sig, grace in ((signal.SIGINT, 20), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=grace)
                break
            except (subprocess.TimeoutExpired, ProcessLookupError):
                continue
    reader.join(timeout=10)
    return rc, time.perf_counter() - t0, "".join(lines)


def figures(part: str, out: Path, text: str, command: str) -> tuple[dict[str, Any], str, str]:
    """A part's figures (for the JSON), its tables (for the markdown) and a note on what failed
    inside it, from what it wrote or printed."""
    from bench import best, ladder

    if part == "ladder" and (out / "ladder.json").is_file():
        r = ladder.LadderResult.model_validate_json((out / "ladder.json").read_text())
        r.command = command
        failed = sum(x.status == "failed" for x in r.rungs)
        return r.model_dump(mode="json"), ladder.to_markdown(r), f"{failed} rungs failed" if failed else ""
    if part == "best" and (out / "best.json").is_file():
        b = best.BestResult.model_validate_json((out / "best.json").read_text())
        b.command = command
        failed = sum(c.status.startswith("failed") for c in b.candidates)
        return b.model_dump(mode="json"), best.to_markdown(b), f"{failed} candidates failed" if failed else ""
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
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                timeout=10).stdout.strip() or None  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        commit = None
    return Report(
        device=torch.cuda.get_device_name(0) if cuda else "CPU (dry run)", torch_version=torch.__version__,
        cuda_version=torch.version.cuda, cpus=os.cpu_count(), commit=commit, dry_run=dry_run,
        device_memory_bytes=torch.cuda.get_device_properties(0).total_memory if cuda else None,
        date=datetime.date.today().isoformat(),
    )  # fmt: skip


def stem(report: Report) -> str:
    """DEVICE-DATE: the report's file name without suffix."""
    return re.sub(r"[^a-z0-9]+", "-", report.device.lower()).strip("-") + "-" + report.date


def to_markdown(r: Report) -> str:
    from engine.text import human

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


def load(path: Path) -> Report | None:
    if not path.exists():
        return None
    try:
        return Report.model_validate_json(path.read_text())
    except (OSError, ValidationError, ValueError):
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


def run(opts: BenchOptions, command: str) -> int:
    check(opts)
    report = describe(opts.dry_run)
    out = opts.out or (Path("runs") / "gpu-report-dry-run" if opts.dry_run else Path("docs") / "gpu")
    earlier = load(out / f"{stem(report)}.json")
    if earlier is not None:
        report.parts = earlier.parts
    parts = [p for p in PARTS if p in opts.part] if opts.part else list(PARTS)
    print(f"GPU report: {report.device}, torch {report.torch_version}; parts {', '.join(parts)} "
          f"-> {out / stem(report)}.md and .json", flush=True)  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    report.doctor = run_doctor(opts.dry_run)
    save(report, out)
    with tempfile.TemporaryDirectory(prefix="gpt2-tui-gpu-report-") as tmp:
        work = Path(tmp)
        planned = commands(opts, work)
        for part in parts:
            argv, budget = planned[part], opts.budget or BUDGET_S[part]
            ran_at = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
            if isinstance(argv, str):
                result = PartResult(command="-", status=argv, budget_s=budget, ran_at=ran_at)
            else:
                print(f"[{part}] {shown(argv)}  (budget {budget} s)", flush=True)
                rc, wall, text = run_part(argv, budget)
                status = "ok" if rc == 0 else f"timed out after {budget} s" if rc is None else f"failed (exit {rc})"
                figs, md, note = figures(part, work / part, text, shown(argv))
                status += f"; {note}" if note else ""
                if rc != 0:
                    tail = "\n".join(text.rstrip().splitlines()[-TAIL_LINES:])
                    md += f"\nThe end of its output:\n\n```\n{tail}\n```\n"
                result = PartResult(command=shown(argv), status=status, budget_s=budget, wall_s=wall, ran_at=ran_at,
                                    figures=figs, markdown=md)  # fmt: skip
            print(f"[{part}] {result.status}" + (f" in {result.wall_s:.0f} s" if result.wall_s else ""), flush=True)
            report.parts[part] = result
            save(report, out)
    print(f"wrote {out / stem(report)}.md and {out / stem(report)}.json")
    return 1 if any("failed" in report.parts[p].status for p in parts) else 0
