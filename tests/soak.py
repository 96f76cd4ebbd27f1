"""Soak test (not collected by pytest): train on the CPU for a long time while killing the run
at random moments, and resume it every time. Reports runs, kills, resumes and lost steps.

    .venv/bin/python tests/soak.py --minutes 60            # the one-hour soak
    .venv/bin/python tests/soak.py --minutes 8 --out /tmp/soak

Each kill is `kill -9` (most) or SIGTERM (some, which must lose nothing); after each one the
run directory must hold a loadable latest checkpoint and a readable events.jsonl, and
`--resume` must continue from that checkpoint. A fresh run starts every --kills-per-run kills.
"""

from __future__ import annotations

import argparse
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.train import checkpoint as ckpt  # noqa: E402
from engine import rundir  # noqa: E402
from engine.events import read_events  # noqa: E402


@dataclass
class Tally:
    runs: int = 0
    kills: int = 0  # SIGKILL
    sigterms: int = 0
    resumes: int = 0
    lost_steps: int = 0
    max_lost: int = 0
    lost_on_sigterm: int = 0
    mid_write: int = 0  # kills that left a half-written checkpoint temp file behind
    torn_lines: int = 0
    steps: int = 0  # optimizer steps that ended in a checkpoint
    failures: list[str] = field(default_factory=list)


def _latest_step(run: Path) -> int | None:
    path = ckpt.CheckpointDir(run / rundir.CHECKPOINTS).latest()
    return None if path is None else ckpt.load(path)["step"]  # raises if not loadable


def _last_logged_step(run: Path) -> tuple[int, int]:
    """(highest step the last process logged, unreadable lines in the whole file)."""
    events, problems = read_events(run / rundir.EVENTS)
    start = max(i for i, e in enumerate(events) if e.event == "run_started")
    steps = [e.step for e in events[start:] if e.event == "step"]
    return (max(steps) if steps else events[start].start_step), len(problems)


def soak(minutes: float, out: Path, seed: int, kills_per_run: int, preset: str, extra: list[str]) -> Tally:
    rng = random.Random(seed)
    t = Tally()
    deadline = time.monotonic() + 60 * minutes
    run: Path | None = None
    kills_this_run = 0
    torn_before = 0
    while time.monotonic() < deadline:
        if run is None or kills_this_run >= kills_per_run:
            run, kills_this_run, torn_before = out / f"run{t.runs:03d}", 0, 0
            argv = ["--preset", preset, "--device", "cpu", "--out", str(run), "--max-steps", "1000000",
                    "--ckpt-interval", str(rng.choice([5, 10, 20])), "--eval-interval", "50", "--eval-batches", "4", *extra]  # fmt: skip
            t.runs += 1
            start = None
        else:
            argv = ["--resume", str(run)]
            start = _latest_step(run) or 0
            t.resumes += 1
        proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "train", *argv], cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
        time.sleep(min(rng.uniform(8, 60), max(0.0, deadline - time.monotonic()) + 1))
        if proc.poll() is not None:
            t.failures.append(f"{run}: exited early with {proc.returncode}: {proc.stderr.read()[-300:]}")
            run = None
            continue
        term = rng.random() < 0.2
        proc.send_signal(signal.SIGTERM if term else signal.SIGKILL)
        _, err = proc.communicate(timeout=300)
        kills_this_run += 1
        try:
            latest = _latest_step(run)
            logged, torn = _last_logged_step(run)
        except Exception as e:  # noqa: BLE001 - a soak reports every failure, whatever it is
            t.failures.append(f"{run}: after a kill: {type(e).__name__}: {e}")
            run = None
            continue
        if start is not None:
            events, _ = read_events(run / rundir.EVENTS)
            began = [e.start_step for e in events if e.event == "run_started"][-1]
            if began != start:  # (a run killed before its first checkpoint starts over at 0)
                t.failures.append(f"{run}: resumed at step {began}, latest checkpoint was {start}")
        lost = max(0, logged - (latest or 0))
        t.torn_lines += torn - torn_before
        torn_before = torn
        t.mid_write += bool(list((run / rundir.CHECKPOINTS).glob(".*.tmp")))
        t.steps += (latest or 0) - (start or 0)
        if term:
            t.sigterms += 1
            t.lost_on_sigterm += lost
            if proc.returncode != 0:
                t.failures.append(f"{run}: SIGTERM exit {proc.returncode}: {err[-300:]}")
        else:
            t.kills += 1
            t.lost_steps += lost
            t.max_lost = max(t.max_lost, lost)
    return t


def report(t: Tally, minutes: float, wall_s: float) -> str:
    rows = [
        ("duration asked / ran", f"{minutes:g} min / {wall_s / 60:.1f} min"),
        ("runs started", t.runs), ("kill -9", t.kills), ("SIGTERM", t.sigterms), ("resumes", t.resumes),
        ("steps kept in checkpoints", t.steps),
        ("steps lost to kill -9 (done after the last checkpoint)", f"{t.lost_steps} (max {t.max_lost} per kill)"),
        ("steps lost to SIGTERM", t.lost_on_sigterm),
        ("kills that left a half-written checkpoint temp file", t.mid_write),
        ("torn events.jsonl lines (skipped with a warning)", t.torn_lines),
        ("failures", len(t.failures)),
    ]  # fmt: skip
    lines = ["| | |", "|---|---|", *(f"| {a} | {b} |" for a, b in rows)]
    lines += [f"- failure: {f}" for f in t.failures]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--out", type=Path, help="where the runs go (default: a temp dir)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kills-per-run", type=int, default=8)
    p.add_argument("--preset", default="nano", help="model preset of the soaked runs (micro on a busy CPU)")
    args, extra = p.parse_known_args()  # anything else goes to `gpt2-tui train`
    out = args.out or Path(tempfile.mkdtemp(prefix="gpt2-tui-soak-"))
    out.mkdir(parents=True, exist_ok=True)
    if "--data" not in extra:  # prepare the default dataset once, so kills land in training
        from engine.prep.prepare import default_dataset

        default_dataset()
    t0 = time.monotonic()
    tally = soak(args.minutes, out, args.seed, args.kills_per_run, args.preset, extra)
    print(report(tally, args.minutes, time.monotonic() - t0))
    print(f"\nruns in {out}")
    return 1 if tally.failures else 0


if __name__ == "__main__":
    sys.exit(main())
