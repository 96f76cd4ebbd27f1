"""The ladder on a busy machine (issue 39: a default `gpt2-tui bench` on a busy 2-core machine
skipped 6 of 9 rungs for its time budget and printed AMP at 0.25x without a word): when it
falls behind its budget it re-plans the rungs left to fewer steps instead of skipping them,
and every rung timed under contention is marked, with one line saying how many. Real short
ladders on CPU (micro, compile left out), one with CPU burners beside it."""

from __future__ import annotations

import json
import time

import pytest

from bench import ladder as bench
from bench import to_loss
from engine.train import contention
from gpt2_tui import main
from harness import busy_machine

FAST = ["--preset", "micro", "--device", "cpu", "--vocab-size", "64", "--skip", "compile"]


def _budget_reasons(result: bench.LadderResult) -> list[str]:
    return [f"{r.name}: {r.reason}" for r in result.rungs if r.status != "ran" and "budget" in (r.reason or "")]


@pytest.mark.slow  # a real ladder on a busy CPU: minutes on the 2-core box
def test_on_a_busy_machine_under_a_tiny_budget_every_rung_runs_and_is_marked(
    tmp_path, tiny_dataset, capsys, monkeypatch
) -> None:
    """The real shape probe, then a pause as long as the budget: every rung starts behind it on
    any machine (CI's, quicker than ours, fitted a 3 s budget's rungs and never re-planned)."""
    out = tmp_path / "ladder"
    real_probe = bench._probe

    def probe_then_linger(*args: object, **kwargs: object) -> tuple[float, float]:
        got = real_probe(*args, **kwargs)
        time.sleep(1.0)
        return got

    monkeypatch.setattr(bench, "_probe", probe_then_linger)
    with busy_machine():
        code = main(["bench", *FAST, "--data", str(tiny_dataset), "--budget", "1", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0
    result = bench.LadderResult.model_validate_json((out / "ladder.json").read_text())
    ran = [r for r in result.rungs if r.status == "ran"]
    assert not _budget_reasons(result), _budget_reasons(result)  # none skipped for time
    assert len(ran) >= 5 and all(r.status == "ran" or r.reason for r in result.rungs)  # the rest: this device, --skip
    assert all(r.steps is not None and r.steps >= 1 for r in ran)
    assert "re-planned" in result.replan_note and "over its 1 s budget: every rung ran" in result.replan_note
    assert "the fewest; the ladder will outlast its budget" in printed  # said as it happened
    # each rung timed under the burners is marked, and one line says so
    assert all(r.contention is not None and r.contention.contended for r in ran), [r.contention for r in ran]
    table = printed[printed.index("rung "):]
    for r in ran:
        row = next(line for line in table.splitlines() if line.startswith(r.label + " "))
        assert f"{1000 * r.median_step_s:.1f}{contention.MARK}" in row, row
        assert f"{r.label}: " in printed and contention.MARK + " busy: load " in printed
    line = f"contention: {len(ran)} of {len(ran)} rungs timed on a busy machine, marked {contention.MARK}"
    assert line in printed and line in (out / "ladder.md").read_text()
    assert json.loads((out / "ladder.json").read_text())["rungs"][0]["contention"]["contended"] is True


@pytest.mark.slow  # a real ladder on a busy CPU: minutes on the 2-core box
def test_a_ladder_behind_its_budget_measures_fewer_steps_on_the_rungs_left(
    tmp_path, tiny_dataset, capsys, monkeypatch
) -> None:
    """The batch given (no shape probe): the baseline runs as asked, and the rungs after it
    re-plan from what it took."""
    out = tmp_path / "ladder"
    real_rung = bench._run_rung

    lingered: list[str] = []

    def rung_then_linger(r: bench.RungResult, *args: object, **kwargs: object) -> None:
        real_rung(r, *args, **kwargs)
        if not lingered:  # on a quick machine the first rung's 15 micro steps fit in 1 s: put the ladder behind
            lingered.append(r.name)
            time.sleep(1.5)

    monkeypatch.setattr(bench, "_run_rung", rung_then_linger)
    code = main(["bench", *FAST, "--data", str(tiny_dataset), "--batch-size", "2", "--warmup", "3", "--steps", "12",
                 "--budget", "1", "--out", str(out)])  # fmt: skip
    printed = capsys.readouterr().out
    assert code == 0
    result = bench.LadderResult.model_validate_json((out / "ladder.json").read_text())
    ran = [r for r in result.rungs if r.status == "ran"]
    assert not _budget_reasons(result) and len(ran) >= 5
    assert lingered == [ran[0].name] and (ran[0].warmup, ran[0].steps) == (3, 12)  # nothing measured yet to re-plan from
    assert all((r.warmup, r.steps) == (1, bench.MIN_STEPS) for r in ran[1:]), [(r.warmup, r.steps) for r in ran]
    assert "re-planned" in printed and "the rest measure 1 + 3 steps, not 3 + 12" in printed
    assert all("1 + 3 steps (re-planned for the budget)" in row[-1] for row in bench.table_rows(result)[2:]
               if row[2] != "-")  # fmt: skip


def test_replan_shrinks_the_warmup_then_the_steps_never_to_none() -> None:
    start = bench.Shape(8, 5, 20)
    assert bench.replan(start, 1.0, 0.1, 4, 100.0) == (start, True)  # 4 x (1 + 2.5) s fits 100 s
    assert bench.replan(start, 1.0, 0.1, 4, 4 * (1 + 2.1)) == (start._replace(warmup=1), True)  # 21 steps fit
    shape, fits = bench.replan(start, 1.0, 0.1, 4, 4 * (1 + 1.0))  # 10 steps fit
    assert fits and shape == start._replace(warmup=1, steps=9)
    assert bench.replan(start, 1.0, 0.1, 4, 1.0) == (start._replace(warmup=1, steps=bench.MIN_STEPS), False)
    assert bench.replan(bench.Shape(8, 1, 1), 1.0, 0.1, 4, 0.0) == (bench.Shape(8, 1, 1), False)  # never above asked


@pytest.mark.slow  # a real ladder on a busy CPU: minutes on the 2-core box
def test_to_loss_marks_the_rungs_timed_on_a_busy_machine(tmp_path, tiny_dataset, capsys) -> None:
    out = tmp_path / "to-loss"
    with busy_machine():
        code = main(["bench", "--to-loss", "100", "--preset", "micro", "--device", "cpu", "--data", str(tiny_dataset),
                     "--steps", "5", "--skip", "compile", "--skip", "muon", "--skip", "wsd", "--out", str(out)])  # fmt: skip
    printed = capsys.readouterr().out
    assert code == 0
    result = to_loss.ToLossResult.model_validate_json((out / "to_loss.json").read_text())
    reached = [r for r in result.rungs if r.status == "reached"]
    assert reached and all(r.contention is not None and r.contention.contended for r in reached)
    for row in to_loss.table_rows(result)[1:]:
        if row[0] != "-":
            assert row[3].endswith(contention.MARK), row
    assert f"contention: {len(reached)} of {len(reached)} rungs timed on a busy machine" in printed


@pytest.mark.slow  # a real short ladder on CPU
def test_a_rung_still_running_says_so_at_each_heartbeat(tmp_path, tiny_dataset, capsys, monkeypatch) -> None:
    """Issue 47 minor: a ladder beside a hog printed nothing for 6.5 minutes. A rung (and the shape
    probe) still running says which and how far it got, every HEARTBEAT_S (here 0.05 s); the
    heartbeat's thread is gone when the ladder returns."""
    import threading

    monkeypatch.setattr(bench, "HEARTBEAT_S", 0.05)
    out = tmp_path / "ladder"
    assert main(["bench", *FAST, "--data", str(tiny_dataset), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    beats = [x.strip() for x in printed.splitlines() if "still measuring" in x]
    assert any(x.startswith("still measuring baseline: step ") and " of " in x and " s so far)" in x for x in beats), (
        printed)  # fmt: skip
    assert any(x.startswith("still measuring the two baseline steps") for x in beats), printed
    assert not [t for t in threading.enumerate() if t.name == "ladder-heartbeat"]
