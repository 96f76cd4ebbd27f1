"""Text read from a run directory reaches the dashboard screens through the one printable rule
(issue 21, item 9): a run's name, its device name and preset, and a warning in its events,
holding terminal escapes and Textual markup, show as plain characters on the Runs screen, the
Compare screen and an attached dashboard. None of them may write an escape sequence to the
terminal, and none may be read as markup (a `[/]` in a run's preset must not crash a
screen, and `[red]` must show as written).

Each screen is rendered to its SVG screenshot: the text a terminal would show, with escapes
left in if any got through."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from engine import events as ev
from engine import rundir
from tui.app import GPT2App
from tui.screens.compare import CompareApp, CompareScreen
from tui.screens.dashboard import DashboardScreen
from tui.screens.runs import RunsScreen
from harness import runs_app, until

TITLE = "\x1b]0;pwned\x07"  # retitles the terminal (or the tmux pane) when written raw
CLEAR = "\x1b[2J"
NAMES = [f"a{TITLE}b", "m[b]k", "[red]r"]  # a name cannot hold "/": closing tags are in the fields


def hostile_run(root: Path, name: str, t0: float) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / rundir.CONFIG).write_text('preset = "nano"\n')
    cfg = {"preset": f"n{CLEAR}[/]p", "model": {"vocab_size": 8192}, "train": {"max_steps": 10}}
    lines = [
        ev.RunStarted(time=t0, config=cfg, n_params=1_858_304, device="cpu", device_name=f"C{TITLE}[/i]U",
                      precision="fp32", flops_per_token=1),  # fmt: skip
        ev.Step(time=t0 + 1, step=1, loss=5.0, lr=1e-3, grad_norm=1.0, step_time_s=0.1, tokens_per_s=10.0, tokens=8,
                mfu=None, mem_bytes=None),
        ev.Warning_(time=t0 + 2, message=f"w{CLEAR}[/]{TITLE}[b]x[/b]"),
        ev.Eval(time=t0 + 3, step=1, val_loss=5.5),
        ev.RunFinished(time=t0 + 4, step=1, reason="completed"),
    ]
    (d / rundir.EVENTS).write_text("".join(e.model_dump_json() + "\n" for e in lines))
    return d


def shown(app) -> str:
    """What the screen's tables held and its screenshot's text said: a failure's own evidence."""
    import html
    import re

    from textual.widgets import DataTable

    rows = [[list(map(str, t.get_row_at(i))) for i in range(t.row_count)] for t in app.screen.query(DataTable)]
    text = "".join(html.unescape(t) for t in re.findall(r"<text[^>]*>([^<]*)</text>", app.export_screenshot()))
    return f"tables: {rows!r}\nscreenshot text: {text[:3000]!r}"


def assert_printable(svg: str, *literal: str) -> None:
    assert "\x1b" not in svg and "\x07" not in svg, "an escape from a run's files reached the screen"
    for text in literal:
        assert text in svg, f"{text!r} is not shown as written"


@pytest.mark.parametrize("screen", ["runs", "compare"])
def test_the_runs_and_compare_screens_show_hostile_names_as_text(tmp_path: Path, screen: str) -> None:
    runs = [hostile_run(tmp_path, name, 1000.0 + i) for i, name in enumerate(NAMES)]
    app, kind = (runs_app(tmp_path), RunsScreen) if screen == "runs" else (CompareApp(runs[1:]), CompareScreen)

    async def go() -> None:
        async with app.run_test(size=(160, 50)) as pilot:
            await until(pilot, lambda: isinstance(app.screen, kind) and app.screen.loaded, f"the {screen} screen read")
            # the rows are in the table once `loaded`; on a loaded machine its first paint of them can
            # come later than a pause (CI: a screenshot without them), so wait for the names as written
            try:
                await until(pilot, lambda: all(t in app.export_screenshot() for t in ("m[b]k", "[red]r")),
                            "the hostile names shown as written")  # fmt: skip
            except AssertionError as err:  # CI saw this 2 times in ~6 full runs, never alone: say what was there
                raise AssertionError(f"{err}\n{shown(app)}") from None
            assert_printable(app.export_screenshot(), "m[b]k", "[red]r")

    asyncio.run(go())


def test_an_attached_dashboard_shows_hostile_fields_as_text(tmp_path: Path) -> None:
    run = hostile_run(tmp_path, "m[b]k", 1000.0)

    async def go() -> None:
        app = GPT2App(attach_dir=run)
        async with app.run_test(size=(160, 50)) as pilot:
            await until(pilot, lambda: isinstance(app.screen, DashboardScreen) and app.session.state.finished, "read")
            await pilot.pause()
            assert_printable(app.export_screenshot(), "[b]x[/b]")

    asyncio.run(go())


def test_every_table_and_app_in_the_tui_is_a_plain_one() -> None:
    """The class, not the three screens above: a new DataTable or App anywhere in tui/ would read
    str cells and notifications as markup again. tui/plain.py is the only place they are used."""
    import ast

    tui = Path(__file__).resolve().parents[2] / "tui"
    found = []
    for path in sorted(tui.rglob("*.py")):
        if path.name == "plain.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ClassDef):
                names = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases]
            elif isinstance(node, ast.Call):
                names = [node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")]
            found += [f"{path.relative_to(tui)}:{node.lineno} {n}" for n in names if n in ("DataTable", "App")]
    assert not found, f"use tui.plain.PlainTable / PlainApp instead: {found}"
