"""Issue 37, item 1: `bench --gpu-report` as the short-window profile, on CPU (--dry-run).

A first GPU contact may last a quarter hour and end with a kill at a time limit. So the
profile writes every finished row as it lands, and a report killed mid-part leaves nothing
running on the box. These run the real report command and its real items (tiniest shapes).
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import gpu_window
from bench import run as bench
from bench.common import BenchOptions
from engine import child
from engine.cli import guarded

ROOT = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    """A process that still runs (a zombie waiting for its reaper does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rindex(")") + 2] != "Z"


def _short(out: Path) -> dict:
    return json.loads((out / f"cpu-dry-run-{datetime.date.today().isoformat()}-short.json").read_text())


@pytest.mark.slow
def test_the_short_window_profile_runs_end_to_end_on_cpu(tmp_path, tiny_dataset, capsys):
    out = tmp_path / "r"
    opts = BenchOptions(gpu_report=True, dry_run=True, data=str(tiny_dataset), vocab_size=64, out=out)
    assert guarded(lambda: bench.run(opts)) == 0
    report = _short(out)
    assert report["profile"] == "short" and list(report["parts"]) == list(gpu_window.ITEMS)
    for name, item in report["parts"].items():
        assert item["status"] == "ok" and item["rows"], (name, item["status"])
    assert report["doctor"]["rows"] and not report["doctor_runs"]  # the checks only: nothing compiled
    md = (out / f"cpu-dry-run-{report['date']}-short.md").read_text()
    head = md.splitlines()[2]
    assert head.startswith("**Headline.** micro T32 B2 fp32 flash:") and "ms/step" in head and "tok/s" in head
    assert "MFU convention: MFU = tok/s x (6N + 12*L*H*Q*T)" in md
    assert "a dense masked kernel still computes all T" in md  # the window's FLOPs said both ways (issue 45 item 9)
    speedrun = report["parts"]["headline"]["rows"][1]  # the recipe's row at the same shape (issue 45 item 8)
    assert speedrun.startswith("speedrun L4 C128 T32 B2 fp32 flash muon") and "ms/step" in speedrun, speedrun
    window = report["parts"]["headline"]["rows"][2]  # the recipe with a window: flex's first run on a GPU
    assert window.startswith("speedrun L4 C128 T32 B2 fp32 flash muon chunked loss window 8:") and "ms/step" in window
    assert "; attention flash;" in window  # the kernel that ran: SDPA's band on a CPU, flex compiled on CUDA
    assert md.splitlines()[3:5] == [f"{speedrun}  ", window]  # under the first, in the report's opening
    assert md.index("## env") < md.index("## headline") < md.index("## matrix") < md.index("## ladder") \
        < md.index("## best") < md.index("## overhead")
    best = report["parts"]["best"]["figures"]["candidates"]
    assert [(c["batch_size"], c["status"]) for c in best] == [(1, "ran"), (2, "ran")] and "Best: micro-batch" in md
    assert "--out" not in md  # the commands as a person types them

    # the same day again, with no time for any item: the doctor's entry is reused, not run, and
    # each item is marked not reached
    assert guarded(lambda: bench.run(opts.model_copy(update={"budget": 1}))) == 0
    again = _short(out)
    assert "reused" in again["parts"]["env"]["status"] and again["doctor"] == report["doctor"]
    assert again["parts"]["ladder"]["status"] == "not reached: past its 1 s budget; 0 rows done, 1 not reached"


@pytest.mark.slow
def test_a_report_killed_mid_part_leaves_no_child_and_every_finished_row_on_disk(tmp_path, tiny_dataset):
    """SIGTERM, as a time limit sends it, while the ladder has rungs finished and more to go."""
    out = tmp_path / "r"
    argv = [sys.executable, "-m", "gpt2_tui", "bench", "--gpu-report", "--dry-run", "--no-doctor",
            "--data", str(tiny_dataset), "--vocab-size", "64", "--out", str(out)]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env=os.environ | {"PYTHONUNBUFFERED": "1"})  # fmt: skip
    assert proc.stdout is not None
    printed: list[str] = []
    try:
        for line in proc.stdout:
            printed.append(line.rstrip("\n"))
            if line.startswith("[ladder] row: "):
                break
        else:
            pytest.fail("the report ended before the ladder's first row:\n" + "\n".join(printed[-30:]))
        below = child.descendants(proc.pid)
        assert below, "the ladder runs as a child of the report"
        proc.send_signal(signal.SIGTERM)  # the report alone, not its group: it must take its children down
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    printed += rest.splitlines()
    assert proc.returncode == 130, "\n".join(printed[-30:])
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in below) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in below if _alive(p)], "a child of the report outlived it"

    report = _short(out)
    rows = [ln.split("] row: ", 1) for ln in printed if "] row: " in ln]
    assert len(rows) >= 3  # the headline's, the matrix case's, the ladder's first rung
    for item, row in ((r[0].lstrip("["), r[1]) for r in rows):
        assert row in report["parts"][item]["rows"], (item, row)
    ladder = report["parts"]["ladder"]
    assert ladder["status"].startswith("stopped: the report was interrupted")
    assert report["parts"]["headline"]["status"] == report["parts"]["matrix"]["status"] == "ok"
    assert report["parts"]["env"]["status"] == "skipped: --no-doctor" and not report["doctor"]
    assert "best" not in report["parts"]


@pytest.mark.slow
def test_a_report_killed_outright_takes_its_child_with_it(tmp_path):
    """SIGKILL cannot be caught: the child was told to die with its parent (PR_SET_PDEATHSIG)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux's")
    script = ("import sys; from bench import gpu_report; "
              "gpu_report.run_part([sys.executable, '-c', 'import os, time; print(os.getpid(), flush=True); "
              "time.sleep(300)'], 300)")  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        assert proc.stdout is not None
        child = int(proc.stdout.readline().split()[-1])
        assert _alive(child)
        proc.kill()
        proc.wait(timeout=30)
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(child)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_the_short_windows_matrix_runs_the_riskiest_cases_first_within_eight_minutes() -> None:
    """Issue 45 item 8: the first GPU window reached about 3 of the compiled cases, the default
    mode's first, and max-autotune (the likeliest to break) was cut. Every CUDA target's supported
    combinations, ordered as the plugin orders them: max-autotune, then CUDA graphs, then the
    other compiled cases, then eager. The item budgets still end the profile within its window."""
    from bench.matrix_rows import risk
    from engine import switch_matrix as matrix

    for target in matrix.CUDA_TARGETS:
        combos = sorted(matrix.combinations(target), key=risk)
        ranks = [risk(c) for c in combos]
        assert ranks == sorted(ranks) and ranks[0] == 0, target
        assert str(combos[0]["speed.compile_mode"]).startswith("max-autotune")
        assert all(c["speed.compile"] for c in combos if risk(c) < 3)
    assert sum(gpu_window.BUDGET_S.values()) + 20 <= gpu_window.WINDOW_S  # the parent's start-up beside them
    assert [out for out, _ in gpu_window.HEADLINES] == ["headline", "headline-speedrun", "headline-window"]
