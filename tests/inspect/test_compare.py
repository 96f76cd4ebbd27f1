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
                "settled_step_time_s", "tokens_per_s", "mfu", "peak_mem_bytes", "compiled", "compile_s", "compile_source", "too_short_to_settle", "best_val_loss", "to_target", "contention", "settings"]  # fmt: skip


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


@pytest.mark.slow
def test_compare_json_two_runs_and_the_resumed_ones_segments(runs, capsys) -> None:
    from gpt2_tui import main

    a, b = runs
    capsys.readouterr()
    assert main(["compare", str(a), str(b), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out) == ["runs", "target_val_loss", "target_from", "differs"]
    assert [r["run_dir"] for r in out["runs"]] == [str(a), str(b)]
    ra, rb = out["runs"]
    assert list(ra) == ["run_dir", "best_val_loss", "segments", "final_val_loss", "to_target", "to_target_vs_first",
                        "recipe"]  # fmt: skip
    assert ra["recipe"] == rb["recipe"] == {}  # GPT-2 as published
    assert len(ra["segments"]) == 1 and len(rb["segments"]) == 2
    first, second = rb["segments"]
    assert list(second) == SEGMENT_KEYS
    assert (first["from_step"], first["to_step"], first["reason"]) == (0, 3, "start")
    assert (second["from_step"], second["to_step"], second["reason"]) == (3, 6, "resume")
    assert first["switches"]["data.prefetch"] is True and second["switches"]["data.prefetch"] is False
    assert second["changed"] == {"data.prefetch": [True, False]}
    # what differs between the rows: the switch; B's first segment trained to 3 steps, and its
    # resume kept the schedule's decay to step 3 (the resume said so)
    assert out["differs"] == {"data": ["data.prefetch"], "optim": ["optim.decay_steps"], "train": ["train.max_steps"]}
    assert [s["settings"] for s in ra["segments"] + rb["segments"]] == [
        {"data.prefetch": True, "optim.decay_steps": None, "train.max_steps": 6},
        {"data.prefetch": True, "optim.decay_steps": None, "train.max_steps": 3},
        {"data.prefetch": False, "optim.decay_steps": 3, "train.max_steps": 6},
    ]  # fmt: skip
    events, _ = ev.read_events(b / rundir.EVENTS)
    times = [e.step_time_s for e in events if isinstance(e, ev.Step) and e.step > 3]
    assert second["settled_step_time_s"] == ev.settled_step_time(times) and second["first_step_time_s"] == times[0]
    vals = [e.val_loss for e in events if isinstance(e, ev.Eval)]
    assert rb["best_val_loss"] == min(vals)
    assert all(s["mfu"] is None and s["peak_mem_bytes"] is None for r in out["runs"] for s in r["segments"])


@pytest.mark.slow
def test_compare_table_marks_what_differs(runs, capsys, monkeypatch) -> None:
    from gpt2_tui import main

    a, b = runs
    monkeypatch.setenv("COLUMNS", "400")  # one table
    capsys.readouterr()
    assert main(["compare", str(a), str(b)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("same in all: ") and "prefetch" not in lines[0] and "compile=off" in lines[0]
    assert lines[1] == "differs: data: prefetch; optim: decay_steps; train: max_steps"
    header, *body = lines[2:6]
    note, target, *busy = lines[6:]
    assert len(busy) <= 1  # on a busy machine, a line that says so
    # the payoff first, the settings that differ last (issues 22, 39: at 80 columns the figures stay on screen)
    assert header.split()[:5] == ["run", "steps", "why", "ms/step", "tok/s"] and header.split()[-1] == "differs"
    order = ["tok/s", "vs prev", "vs first", "best val", "to target", "target vs first", "warm-up", "compile",
             "differs"]  # fmt: skip
    assert [header.index(c) for c in order] == sorted(header.index(c) for c in order)
    assert [r.split()[:3] + r.split()[-2:] for r in body] == [
        ["A", "0-6", "start", "decay_steps=auto", "max_steps=6"],
        ["B", "0-3", "start", "decay_steps=auto", "max_steps=3*"],
        ["B", "3-6", "resume", "decay_steps=3*", "max_steps=6"],
    ]  # fmt: skip
    assert [r.split()[-3] for r in body] == ["prefetch=on", "prefetch=on", "prefetch=off*"]
    assert body[0].split()[6] == "1.00x"  # the first row against itself (vs first; vs prev is "-")
    assert note.startswith("* differs from the first row")
    assert target.startswith("to target: training time (sum of step times) and tokens to first reach val loss")


@pytest.mark.slow
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


@pytest.mark.slow
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
        cell = table.get_row_at(2)[-1]  # what differs: the last column
        assert cell.plain == "prefetch=off decay_steps=3 max_steps=6"
        assert any("yellow" in str(s.style) for s in cell.spans)
        loss = screen.query_one("#compare-loss", OverlayChart)
        assert loss.drawn == ["A", "A val", "B", "B val"]
        await pilot.press("x")
        assert screen.axis == "tokens" and loss.axis == "tokens"  # said by the charts' x label
        toks = screen.query_one("#compare-toks", OverlayChart)
        assert toks.drawn == ["A", "B"] and toks.axis == "tokens"

    on_compare_screen(runs, (160, 50), check)


@pytest.mark.slow
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
            assert second[-1].plain == "prefetch=off decay_steps=3 max_steps=6"  # what differs: last, the change first
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_runs_lists_the_time_to_the_target(runs, capsys) -> None:
    from gpt2_tui import main

    a, _ = runs
    capsys.readouterr()
    assert main(["runs", str(a.parent)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "to target" in lines[0]
    row = next(x for x in lines if x.startswith("A "))
    assert " tok" in row and " s " in row


@pytest.mark.slow
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


@pytest.mark.slow
def test_at_80x24_the_compare_legend_leaves_to_the_table_what_the_table_says(runs) -> None:
    """Issue 47 minor: at 80x24 the legend took 10 of 24 lines, repeating each run's time to the
    target (the table's `to target`), its settings and segment starts (the table's `differs` and
    rows), the keys (the footer's) and the x axis (the charts' label)."""

    async def check(pilot, screen) -> None:
        await pilot.pause()
        legend = screen.query_one("#compare-legend")
        text = str(legend.render())
        assert "(step " not in text and "esc back" not in text and "x: " not in text, text
        assert "max_steps=" not in text and "prefetch" not in text, text  # the settings: the table's `differs`
        assert text.count("\u2588\u2588") == len(runs) and "(the table's `to target`)" in text, text
        assert legend.size.height <= 2 * len(runs) + 1, (legend.size, text)  # a run wraps once at most; the target

    on_compare_screen(runs, (80, 24), check)


@pytest.mark.slow
def test_compare_tui_times_the_runs_to_the_target_given(runs, monkeypatch) -> None:
    """`compare --tui --target X` opens the screen timed to X, as the table is (issue 39: it was ignored)."""
    from gpt2_tui import main
    from tui.screens.compare import CompareApp, CompareScreen

    events, _ = ev.read_events(runs[0] / rundir.EVENTS)
    target = max(e.val_loss for e in events if isinstance(e, ev.Eval))  # the first eval reaches it: not the default
    seen: list[str] = []

    async def drive(pilot) -> None:
        await until(pilot, lambda: isinstance(pilot.app.screen, CompareScreen) and pilot.app.screen.loaded, "runs loaded")
        seen.append(str(pilot.app.screen.query_one("#compare-legend").render()))
        await pilot.press("ctrl+q")

    real_run = CompareApp.run
    monkeypatch.setattr(CompareApp, "run", lambda self, *a, **k: real_run(self, headless=True, size=(200, 50),
                                                                        auto_pilot=drive))  # fmt: skip
    assert main(["compare", "--tui", "--target", str(target), *map(str, runs)]) == 0
    assert f"to val {loss_text(target)} (--target)" in seen[0], seen
    step, _, _ = _reach(runs[0], target)
    assert f"(step {step})" in seen[0]


# ------------------------------------------------------------------ issue 39: what differs, at any width


@pytest.fixture(scope="module")
def recipes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """Three runs that differ in what they compute, not in a speed switch: AdamW with cosine; Muon
    (and another seed); AdamW with WSD decaying over half the steps."""
    from harness import bigram_tokens, write_gpt2tui

    from gpt2_tui import main

    root = tmp_path_factory.mktemp("recipes")
    data = write_gpt2tui(root / "data", bigram_tokens(20_000, 64, 1), bigram_tokens(4_000, 64, 2), 64)
    runs = root / "runs"
    out = (runs / "adamw", runs / "muon", runs / "wsd")
    recipe = ([], ["--optimizer", "muon", "--seed", "7"], ["--schedule", "wsd", "--decay-fraction", "0.5"])
    for d, extra in zip(out, recipe):
        assert main(["train", *TRAIN, "--data", str(data), "--max-steps", "6", "--out", str(d), *extra]) == 0
    return out


DIFFERS = {"optim": ["optim.schedule", "optim.decay_fraction", "optim.optimizer"], "train": ["train.seed"]}


@pytest.mark.slow
def test_compare_json_names_every_setting_that_differs_and_the_time_to_target_ratio(recipes, capsys) -> None:
    """Issue 39: AdamW vs Muon vs WSD had no optimizer or schedule in the JSON."""
    from gpt2_tui import main

    capsys.readouterr()
    assert main(["compare", *map(str, recipes), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["differs"] == DIFFERS  # by the config's section, in its order
    settings = [r["segments"][0]["settings"] for r in out["runs"]]
    muon = {"optim.muon_lr": 0.02, "optim.muon_momentum": 0.95, "optim.muon_momentum_warmup": 0}
    assert settings == [  # a setting shows where it acts: Muon's with Muon, the decay fraction with wsd
        {"optim.schedule": "cosine", "optim.optimizer": "adamw", "train.seed": 1337},
        {"optim.schedule": "cosine", "optim.optimizer": "muon", **muon, "train.seed": 7},
        {"optim.schedule": "wsd", "optim.decay_fraction": 0.5, "optim.optimizer": "adamw", "train.seed": 1337},
    ]  # fmt: skip
    base = out["runs"][0]["to_target"]  # the worst final val loss: every run reached it
    for r in out["runs"]:
        assert r["to_target_vs_first"] == pytest.approx(base["train_time_s"] / r["to_target"]["train_time_s"])
    assert out["runs"][0]["to_target_vs_first"] == 1.0


@pytest.mark.slow
def test_compare_table_names_what_differs_with_a_time_to_target_ratio(recipes, capsys, monkeypatch) -> None:
    from gpt2_tui import main

    monkeypatch.setenv("COLUMNS", "400")  # one table
    capsys.readouterr()
    assert main(["compare", *map(str, recipes)]) == 0
    lines = capsys.readouterr().out.splitlines()
    # every setting a row lists, with those a differing optimizer brings (issue 47: Muon's were not named)
    assert ("differs: optim: schedule decay_fraction optimizer muon_lr muon_momentum muon_momentum_warmup; "
            "train: seed") in lines  # fmt: skip
    header = next(x for x in lines if x.startswith("run "))
    rows = {x.split()[0]: x for x in lines if x.split()[0] in ("adamw", "muon", "wsd")}
    assert rows["adamw"].endswith("schedule=cosine optimizer=adamw seed=1337")
    assert rows["muon"].endswith("schedule=cosine optimizer=muon* muon_lr=0.02* muon_momentum=0.95* "
                                 "muon_momentum_warmup=0* seed=7*")  # Muon's own, at their defaults
    assert rows["wsd"].endswith("schedule=wsd* decay_fraction=0.5* optimizer=adamw seed=1337")
    col = header.index("target vs first") + len("target vs first")  # right-aligned under its header
    assert rows["adamw"][:col].endswith(" 1.00x") and rows["muon"][:col].rstrip()[-1] == "x"
    assert any("target vs first = the first run's time to target over this one's" in x for x in lines)


@pytest.mark.slow
def test_compare_at_80_columns_keeps_each_row_on_one_line_payoff_first(recipes, runs, capsys, monkeypatch) -> None:
    """Issue 39: at 80 columns each row wrapped into 3 lines; now the table comes in blocks of
    whole columns that fit, the payoff (speed, speed-ups, best val) in the first."""
    from gpt2_tui import main

    monkeypatch.setenv("COLUMNS", "80")
    for dirs in (recipes, runs):
        capsys.readouterr()
        assert main(["compare", *map(str, dirs)]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert max(map(len, lines)) <= 80, "\n".join(x for x in lines if len(x) > 80)
        headers = [x for x in lines if x.startswith("run ")]
        assert len(headers) >= 2 and all(h.split()[:2] == ["run", "steps"] for h in headers)
        assert all(c in headers[0] for c in ("ms/step", "tok/s", "vs prev", "vs first", "best val"))
        assert "differs" in headers[-1] and "warm-up" not in headers[0]
        segments = {"adamw": 1, "muon": 1, "wsd": 1} if dirs is recipes else {"A": 1, "B": 2}
        for name, n in segments.items():  # one line per segment in each block
            assert sum(x.split()[0] == name for x in lines if x.strip()) == n * len(headers), (name, lines)


@pytest.mark.slow
def test_runs_says_what_its_target_is(recipes, capsys) -> None:
    from gpt2_tui import main

    root = recipes[0].parent
    finals = []
    for d in recipes:
        events, _ = ev.read_events(d / rundir.EVENTS)
        finals.append([e.val_loss for e in events if isinstance(e, ev.Eval)][-1])
    capsys.readouterr()
    assert main(["runs", str(root)]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("to target: training time (sum of step times) and tokens to first reach val loss "
                           f"{loss_text(max(finals))} (the worst final val loss among these runs)"), last  # fmt: skip
    assert main(["runs", str(root), "--target", "0.01"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "val loss 0.01 (--target)" in out[-1]
    end = out[0].index("to target") + len("to target")  # right-aligned under its header
    assert [x[:end].split()[-1] for x in out[1:-1]] == ["-", "-", "-"]  # nobody reached it


@pytest.mark.slow
def test_the_compare_screen_names_what_differs(recipes) -> None:
    from tui.widgets.segments import SegmentTable

    async def check(pilot, screen) -> None:
        legend = str(screen.query_one("#compare-legend").render())
        lines = {x.split()[1]: x for x in legend.splitlines() if x.startswith("\u2588")}
        assert "optimizer=muon" in lines["muon"] and "seed=7" in lines["muon"] and "schedule=wsd" in lines["wsd"]
        table = screen.query_one(SegmentTable)
        assert table.get_row_at(1)[-1].plain == ("schedule=cosine optimizer=muon muon_lr=0.02 muon_momentum=0.95 "
                                                 "muon_momentum_warmup=0 seed=7")  # Muon's own shown with it
        assert "decay_fraction" not in table.get_row_at(1)[-1].plain  # a cosine row has none to show
        assert str(table.get_row_at(0)[COLUMNS.index("target vs first")]) == "1.00x"

    on_compare_screen(recipes, (200, 50), check)


def screen_text(app) -> str:
    """What the terminal shows, as plain text lines (what is scrolled off-screen is absent)."""
    import html
    import re

    rows: dict[float, list[tuple[float, str]]] = {}
    for attrs, body in re.findall(r"<text([^>]*)>(.*?)</text>", app.export_screenshot(), re.S):
        x, y = re.search(r'\bx="([\d.]+)"', attrs), re.search(r'\by="([\d.]+)"', attrs)
        if x and y:
            rows.setdefault(float(y.group(1)), []).append((float(x.group(1)), re.sub(r"<[^>]+>", "", body)))
    lines = ("".join(t for _, t in sorted(parts)) for _, parts in sorted(rows.items()))
    return "\n".join(html.unescape(line).replace("\xa0", " ") for line in lines)


def on_segments_tab(run_dir: Path, size: tuple[int, int], check) -> None:
    """The dashboard attached to `run_dir`, read to its end, charts drawn: `await check(pilot, app)`."""
    from tui.app import GPT2App
    from tui.widgets.charts import MetricChart

    async def body() -> None:
        app = GPT2App(attach_dir=run_dir)
        async with app.run_test(size=size) as pilot:
            await until(pilot, lambda: app.session is not None and app.session.state.step == 6, "the run read")
            chart = app.screen.query_one("#chart-steptime", MetricChart)
            await until(pilot, lambda: chart.markers_drawn, "charts drawn")
            await check(pilot, app)

    asyncio.run(body())


@pytest.mark.slow
def test_the_segments_tab_fills_at_once_when_first_opened(runs) -> None:
    """Issue 39: it showed only its header until the dashboard's next redraw (~5 s on a live run,
    where drawing stretches the redraw interval up to MAX_INTERVAL). The redraw timer is held
    still here, so that the next redraw is as far away as it may be."""
    from tui.widgets.segments import SegmentTable

    async def check(pilot, app) -> None:
        table = app.screen.query_one("#segments", SegmentTable)
        assert table.row_count == 0  # not drawn while hidden
        app.screen._timer.pause()
        app.screen.query_one("#tabs").active = "tab-segments"
        await pilot.pause(0.5)
        assert table.row_count == 2

    on_segments_tab(runs[1], (120, 40), check)


@pytest.mark.slow
def test_the_segments_tab_shows_the_payoff_at_80x24(runs) -> None:
    """Issue 39: at 80 columns `vs prev`, `vs first` and best val were off screen."""
    from tui.widgets.segments import SegmentTable

    async def check(pilot, app) -> None:
        app.screen.query_one("#tabs").active = "tab-segments"
        table = app.screen.query_one("#segments", SegmentTable)
        await until(pilot, lambda: table.row_count == 2, "the segments drawn")
        await pilot.pause()
        shown = screen_text(app).splitlines()
        header = next(x for x in shown if "steps" in x and "why" in x)
        assert all(c in header for c in ("ms/step", "tok/s", "vs prev", "vs first", "best val")), header
        second = next(x for x in shown if "3-6" in x)
        r = table.rows_shown[1]
        assert "resume prefetch=off" in second and f"{r.vs_prev:.2f}x" in second, second
        assert loss_text(r.best_val_loss) in second, second

    on_segments_tab(runs[1], (80, 24), check)


# ------------------------------------------------------------------ issue 40: each row's recipe


@pytest.fixture(scope="module")
def switched(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """GPT-2 as published, and a run with three of the speedrun's switches and Muon."""
    from harness import bigram_tokens, write_gpt2tui

    from gpt2_tui import main

    root = tmp_path_factory.mktemp("switched")
    data = write_gpt2tui(root / "data", bigram_tokens(20_000, 64, 1), bigram_tokens(4_000, 64, 2), 64)
    gpt2, tricks = root / "gpt2", root / "tricks"
    assert main(["train", *TRAIN, "--data", str(data), "--max-steps", "6", "--out", str(gpt2)]) == 0
    assert main(["train", *TRAIN, "--data", str(data), "--max-steps", "6", "--out", str(tricks), "--mlp", "relu2",
                 "--qk-norm", "--no-tie-head", "--optimizer", "muon"]) == 0  # fmt: skip
    return gpt2, tricks


RECIPE_CELL = "mlp=relu2 qk_norm tie_head=off optimizer=muon"  # the config's order; a switch on by its name


@pytest.mark.slow
def test_compare_shows_each_rows_recipe_from_its_config(switched, recipes, capsys, monkeypatch) -> None:
    """Issue 40: which of the speedrun's tricks a row trained with, against GPT-2's defaults."""
    from gpt2_tui import main

    capsys.readouterr()
    assert main(["compare", *map(str, switched), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["recipe"] for r in out["runs"]] == [
        {}, {"model.mlp": "relu2", "model.qk_norm": True, "model.tie_head": False, "optim.optimizer": "muon"}]
    monkeypatch.setenv("COLUMNS", "400")  # one table
    for dirs, want in ((switched, {"gpt2": "GPT-2", "tricks": RECIPE_CELL}),
                       (recipes, {"adamw": "GPT-2", "muon": "optimizer=muon", "wsd": "schedule=wsd"})):  # fmt: skip
        assert main(["compare", *map(str, dirs)]) == 0
        lines = capsys.readouterr().out.splitlines()
        header = next(x for x in lines if x.startswith("run "))
        at, end = header.index("recipe"), header.index("differs")  # left-aligned under its header
        assert header.split()[-2:] == ["recipe", "differs"]
        rows = {x.split()[0]: x for x in lines if x.split() and x.split()[0] in want}
        assert {name: row[at:end].strip() for name, row in rows.items()} == want


@pytest.mark.slow
def test_the_compare_screen_shows_each_rows_recipe(switched) -> None:
    from tui.widgets.segments import SegmentTable

    async def check(pilot, screen) -> None:
        legend = str(screen.query_one("#compare-legend").render())
        lines = {x.split()[1]: x for x in legend.splitlines() if x.startswith("\u2588")}
        assert "recipe GPT-2" in lines["gpt2"] and f"recipe {RECIPE_CELL}" in lines["tricks"]
        table = screen.query_one(SegmentTable)
        col = COLUMNS.index("recipe")
        assert [str(table.get_row_at(i)[col]) for i in (0, 1)] == ["GPT-2", RECIPE_CELL]

    on_compare_screen(switched, (200, 50), check)


def test_a_recipe_switch_left_unset_reads_off_not_auto() -> None:
    """`logit_softcap=auto` told a new user the softcap was chosen for them; None there is no softcap."""
    from engine.inspect.compare import setting_value

    assert setting_value("model.logit_softcap", None) == "off" and setting_value("model.attn_window", None) == "off"
    assert setting_value("model.logit_softcap", 30.0) == "30.0"
    assert setting_value("optim.decay_steps", None) == "auto" and setting_value("optim.fused", None) == "auto"
