"""`gpt2-tui compare` and the Compare screen, on real runs from the CLI: A trained to 6
steps; B trained to 3, then resumed to 6 with --no-prefetch (a new segment)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from harness import until

from engine import events as ev
from engine import rundir
from engine.inspect.compare import COLUMNS
from engine.text import loss_text

TRAIN = ["--preset", "micro", "--device", "cpu", "--precision", "fp32", "--eval-interval", "3",
         "--ckpt-interval", "3", "--log-interval", "1"]  # fmt: skip
SEGMENT_KEYS = ["from_step", "to_step", "switches", "changed", "reason", "first_step_time_s",
                "settled_step_time_s", "tokens_per_s", "mfu", "peak_mem_bytes", "compiled", "compile_s", "compile_source", "too_short_to_settle", "best_val_loss", "to_target"]  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from harness import bigram_tokens, write_gpt2tui

    from gpt2_tui import main

    root = tmp_path_factory.mktemp("compare")
    data = write_gpt2tui(root / "data", bigram_tokens(20_000, 64, 1), bigram_tokens(4_000, 64, 2), 64)  # learnable: the loss falls
    a, b = root / "A", root / "B"
    assert main(["train", *TRAIN, "--data", str(data), "--max-steps", "6", "--out", str(a)]) == 0
    assert main(["train", *TRAIN, "--data", str(data), "--max-steps", "3", "--out", str(b)]) == 0
    assert main(["train", "--resume", str(b), "--max-steps", "6", "--no-prefetch"]) == 0
    return a, b


def test_compare_json_two_runs_and_the_resumed_ones_segments(runs, capsys) -> None:
    from gpt2_tui import main

    a, b = runs
    capsys.readouterr()
    assert main(["compare", str(a), str(b), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out) == ["runs", "target_val_loss", "target_from"] and [r["run_dir"] for r in out["runs"]] == [str(a), str(b)]
    ra, rb = out["runs"]
    assert list(ra) == ["run_dir", "best_val_loss", "segments", "final_val_loss", "to_target"]
    assert len(ra["segments"]) == 1 and len(rb["segments"]) == 2
    first, second = rb["segments"]
    assert list(second) == SEGMENT_KEYS
    assert (first["from_step"], first["to_step"], first["reason"]) == (0, 3, "start")
    assert (second["from_step"], second["to_step"], second["reason"]) == (3, 6, "resume")
    assert first["switches"]["data.prefetch"] is True and second["switches"]["data.prefetch"] is False
    assert second["changed"] == {"data.prefetch": [True, False]}
    events, _ = ev.read_events(b / rundir.EVENTS)
    times = [e.step_time_s for e in events if isinstance(e, ev.Step) and e.step > 3]
    assert second["settled_step_time_s"] == ev.settled_step_time(times) and second["first_step_time_s"] == times[0]
    vals = [e.val_loss for e in events if isinstance(e, ev.Eval)]
    assert rb["best_val_loss"] == min(vals)
    assert all(s["mfu"] is None and s["peak_mem_bytes"] is None for r in out["runs"] for s in r["segments"])


def test_compare_table_marks_what_differs(runs, capsys) -> None:
    from gpt2_tui import main

    a, b = runs
    capsys.readouterr()
    assert main(["compare", str(a), str(b)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("same in all: ") and "prefetch" not in lines[0] and "compile=off" in lines[0]
    header, *body, note, target = lines[1:]
    # the speed first, the switches last (issue 22: at 80 columns the figures stay on screen)
    assert header.split()[:6] == ["run", "steps", "why", "warm-up", "ms/step", "tok/s"] and header.split()[-1] == "switches"
    assert [r.split()[:3] + r.split()[-1:] for r in body] == [
        ["A", "0-6", "start", "prefetch=on"], ["B", "0-3", "start", "prefetch=on"], ["B", "3-6", "resume", "prefetch=off*"],
    ]  # fmt: skip
    assert body[0].split()[-7] == "1.00x"  # the first row against itself (then best val, to target, switches)
    assert note.startswith("* differs from the first row")
    assert target.startswith("to target: training time (sum of step times) and tokens to first reach val loss")


@pytest.mark.parametrize("case", ["missing", "empty", "no-start"])
def test_a_bad_run_dir_is_one_line_and_exit_2(runs, tmp_path: Path, capsys, case: str) -> None:
    from harness import cli_fails

    bad = tmp_path / case
    if case != "missing":
        bad.mkdir()
    if case == "no-start":
        (bad / rundir.EVENTS).write_text('{"event": "eval", "step": 1, "val_loss": 2.0}\n')
    word = {"missing": "does not exist", "empty": "is not a run directory", "no-start": "never started"}[case]
    cli_fails(capsys, ["compare", str(runs[0]), str(bad), "--json"], str(bad), word)
    assert capsys.readouterr().out == ""  # nothing printed for the good run either
    cli_fails(capsys, ["compare", "--tui", str(bad)], word)  # refused before the screen opens


def on_compare_screen(runs, size: tuple[int, int], check) -> None:
    """The Compare screen over `runs`, loaded: `await check(pilot, screen)`, then escape quits it."""
    from tui.screens.compare import CompareApp, CompareScreen

    async def body() -> None:
        app = CompareApp(list(runs))
        async with app.run_test(size=size) as pilot:
            await until(pilot, lambda: isinstance(app.screen, CompareScreen) and app.screen.loaded, "runs loaded")
            await check(pilot, app.screen)
            await pilot.press("escape")
        assert app.return_code == 0

    asyncio.run(body())


def test_the_compare_screen_overlays_runs_and_shows_their_segments(runs) -> None:
    from tui.screens.compare import OverlayChart
    from tui.widgets.segments import SegmentTable

    async def check(pilot, screen) -> None:
        assert [r.label for r in screen.runs] == ["A", "B"]
        rb = screen.runs[1]
        assert [s[0] for s in rb.starts] == [0, 3]  # a marker where the resumed segment starts
        assert rb.series["step_time"].step == [1, 2, 3, 4, 5, 6] and rb.series["val"].step == [3, 6]
        legend = str(screen.query_one("#compare-legend").render())
        assert "step 3: prefetch on -> off (resume)" in legend
        table = screen.query_one(SegmentTable)
        assert table.row_count == 3
        assert [(r.run, r.segment.from_step) for r in table.rows_shown] == [("A", 0), ("B", 0), ("B", 3)]
        cell = table.get_row_at(2)[-1]  # switches: the last column
        assert cell.plain == "prefetch=off" and any("yellow" in str(s.style) for s in cell.spans)
        loss = screen.query_one("#compare-loss", OverlayChart)
        assert loss.drawn == ["A", "A val", "B", "B val"]
        await pilot.press("x")
        assert screen.axis == "tokens" and "x: tokens" in str(screen.query_one("#compare-legend").render())
        toks = screen.query_one("#compare-toks", OverlayChart)
        assert toks.drawn == ["A", "B"] and toks.axis == "tokens"

    on_compare_screen(runs, (160, 50), check)


def test_the_segment_table_widget_follows_a_runs_events(runs) -> None:
    """The dashboard's widget: fed one event at a time, it draws on its own timer."""
    from textual.app import App, ComposeResult

    from tui.widgets.segments import SegmentTable

    events, _ = ev.read_events(runs[1] / rundir.EVENTS)
    cut = next(i for i, e in enumerate(events) if isinstance(e, ev.RunFinished)) + 1

    class Host(App):
        def compose(self) -> ComposeResult:
            yield SegmentTable(refresh_s=0.05)

    async def body() -> None:
        async with Host().run_test(size=(160, 20)) as pilot:
            table = pilot.app.query_one(SegmentTable)
            for e in events[:cut]:  # the first process's events: one segment
                table.feed(e)
            await until(pilot, lambda: table.row_count == 1, "one segment drawn")
            for e in events[cut:]:  # the resume with --no-prefetch
                table.feed(e)
            await until(pilot, lambda: table.row_count == 2, "the resumed segment drawn")
            first, second = (table.get_row_at(i) for i in range(2))
            assert [str(c) for c in first[:2]] == ["0-3", "start"]
            assert [str(c) for c in second[:2]] == ["3-6", "resume prefetch=off"]  # no run column for one run
            assert second[-1].plain == "prefetch=off"  # switches: the last column
            r = table.rows_shown[1]
            assert r.vs_prev == pytest.approx(r.segment.tokens_per_s / table.rows_shown[0].segment.tokens_per_s)
            assert str(second[COLUMNS[1:].index("vs prev")]) == f"{r.vs_prev:.2f}x"
            own = min(e.val_loss for e in events if isinstance(e, ev.Eval) and e.step <= 3)  # the segment's, not the run's
            assert str(first[COLUMNS[1:].index("best val")]) == loss_text(own)

    asyncio.run(body())


def test_compare_reads_a_long_log_without_holding_its_events(tmp_path: Path) -> None:
    """100,000 step lines: `compare` folds each event into its segment and drops it, so the
    Python memory it peaks at is a few MB (the step times), not the events (issue 21 item 12:
    holding them took 1.83 GB for 1M lines). Measured with tracemalloc, not by time."""
    import tracemalloc

    from engine.inspect.compare import compare

    run = tmp_path / "long"
    run.mkdir()
    (run / rundir.CONFIG).write_text('preset = "nano"\n')
    cfg = {"preset": "nano", "model": {"vocab_size": 8192}, "train": {"max_steps": 100_000}}
    step = ev.Step(time=1.0, step=1, loss=5.0, lr=1e-3, grad_norm=1.0, step_time_s=0.1, tokens_per_s=10.0, tokens=8,
                   mfu=None, mem_bytes=None).model_dump_json()  # fmt: skip
    with open(run / rundir.EVENTS, "w") as f:
        f.write(ev.RunStarted(time=1.0, config=cfg, n_params=1, device="cpu", device_name="CPU", precision="fp32",
                              flops_per_token=1).model_dump_json() + "\n")  # fmt: skip
        f.writelines(step.replace('"step":1,', f'"step":{i},', 1) + "\n" for i in range(1, 100_001))
    tracemalloc.start()
    try:
        result = compare([run])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.runs[0].segments[0].to_step == 100_000
    assert peak < 30 * 2**20, f"compare peaked at {peak / 2**20:.0f} MiB of Python memory on 100k step lines"


def _reach(run_dir: Path, target: float) -> tuple[int, float, int]:
    """(step, training time, tokens) of a run's first eval at or below `target`, from its events:
    the time is the sum of the step times up to it (log interval 1: one step a report)."""
    events, _ = ev.read_events(run_dir / rundir.EVENTS)
    hit = next(e for e in events if isinstance(e, ev.Eval) and e.val_loss <= target)
    steps = {e.step: e for e in events if isinstance(e, ev.Step)}  # a resume re-trains none here: B resumed at its checkpoint
    return hit.step, sum(s.step_time_s for n, s in steps.items() if n <= hit.step), hit.step * 4 * 32


def test_compare_json_holds_each_runs_time_and_tokens_to_the_target(runs, capsys) -> None:
    from gpt2_tui import main

    a, b = runs
    capsys.readouterr()
    assert main(["compare", str(a), str(b), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    finals = []
    for d in (a, b):
        events, _ = ev.read_events(d / rundir.EVENTS)
        finals.append([e.val_loss for e in events if isinstance(e, ev.Eval)][-1])
    target = max(finals)  # the worst final val loss: every run reaches it
    assert out["target_val_loss"] == target and out["target_from"] == "worst final val loss"
    for d, r in zip((a, b), out["runs"]):
        step, spent, tokens = _reach(d, target)
        reach = r["to_target"]
        assert reach is not None and reach["val_loss"] <= target
        assert reach["step"] == step and reach["tokens"] == tokens
        assert reach["train_time_s"] == pytest.approx(spent, rel=1e-6) and spent > 0 and step > 0
        assert sum(s["to_target"] is not None for s in r["segments"]) >= 1  # the segment it was reached in
    rb = out["runs"][1]
    seg = next(s for s in rb["segments"] if s["to_target"] is not None)
    assert seg["from_step"] <= rb["to_target"]["step"] <= seg["to_step"]

    assert main(["compare", str(a), str(b), "--json", "--target", "0.01"]) == 0  # never reached: null, not invented
    out = json.loads(capsys.readouterr().out)
    assert out["target_val_loss"] == 0.01 and out["target_from"] == "--target"
    assert [r["to_target"] for r in out["runs"]] == [None, None]
    with pytest.raises(SystemExit) as exit_:  # argparse's one line
        main(["compare", str(a), "--target", "nan"])
    assert exit_.value.code == 2 and "not a val loss" in capsys.readouterr().err


def test_runs_lists_the_time_to_the_target(runs, capsys) -> None:
    from gpt2_tui import main

    a, _ = runs
    capsys.readouterr()
    assert main(["runs", str(a.parent)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "to target" in lines[0]
    row = next(x for x in lines if x.startswith("A "))
    assert " tok" in row and " s " in row


def test_the_compare_screen_shows_the_time_to_the_target(runs) -> None:
    from tui.widgets.segments import SegmentTable

    async def check(pilot, screen) -> None:
        target = max(r.final_val_loss for r in screen.runs)
        legend = str(screen.query_one("#compare-legend").render())
        assert f"to val {loss_text(target)}:" in legend and "(the worst final val loss)" in legend
        for r, d in zip(screen.runs, runs):
            step, spent, tokens = _reach(d, target)
            assert r.to_target is not None and (r.to_target.step, r.to_target.tokens) == (step, tokens)
            assert f"(step {step})" in legend
        table = screen.query_one(SegmentTable)
        col = COLUMNS.index("to target")
        cells = [str(table.get_row_at(i)[col]) for i in range(table.row_count)]
        assert cells[0].endswith(" tok") and any(c.endswith(" tok") for c in cells[1:])

    on_compare_screen(runs, (200, 50), check)
