"""The setup form and the app's chrome as a new user meets them (issue 13, items 8-10, 13):
first paint before torch, refusals that name what to change, the memory panel reachable and
fixable, one parameter-count rule, a footer and a help overlay that fit 80x24.

Pilot tests (App.run_test); waits are bounded polls on the app's own state.
"""

from __future__ import annotations

import asyncio
import re
import threading
import tomllib
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Input, Select, Switch

from engine.train import memory
from engine.cli import main as cli_main
from engine.config import resolve
from engine.errors import UserError
from tui.models import form as F
from tui.app import GPT2App
from tui.screens import setup as setup_mod
from tui.screens.modals import HELP, AskPath, ConfirmScreen, HelpScreen, PickDirectory
from tui.screens.setup import SetupScreen, wid
from tui.widgets.memory import MemoryPanel
from harness import DATA, python_c, until

SIZE = (120, 40)


def micro(dataset: Path, **over: Any) -> Any:
    return resolve("micro", overrides={"data.path": str(dataset), **over})


def run(coro_fn) -> None:
    asyncio.run(coro_fn())


def notes(app: GPT2App) -> list[str]:
    """Every notification the app shows, as text (recorded by wrapping App.notify)."""
    seen: list[str] = []
    original = app.notify

    def record(message: str, *args: Any, **kw: Any) -> None:
        seen.append(str(message))
        original(message, *args, **kw)

    app.notify = record  # type: ignore[method-assign]
    return seen


def text_of(screen, selector: str) -> str:
    if selector.startswith("#err-") and not screen.query(selector):
        return ""  # an error line is mounted below its field the first time it has something to say
    w = screen.query_one(selector)
    return str(w.render()) if w.display else ""


def outside_backticks(text: str) -> str:
    """A message minus its shell commands (`...`): what must not name CLI flags."""
    return "".join(text.split("`")[0::2])


async def set_value(pilot, screen, selector: str, value: Any) -> None:
    screen.query_one(selector).value = value
    await pilot.pause()


async def open_form(pilot, app: GPT2App) -> SetupScreen:
    await until(pilot, lambda: isinstance(app.screen, SetupScreen) and app.screen.caps is not None, "the form")
    await pilot.pause()
    return app.screen  # type: ignore[return-value]


# ------------------------------------------------------------------ item 8: first paint


@pytest.mark.slow
def test_the_bare_command_paints_before_torch_is_imported() -> None:
    """The app's modules and the bare command's path to the form import no torch (it takes
    seconds: the form would wait for it)."""
    code = (
        "import sys, gpt2_tui, tui.app, tui.screens.setup, tui.widgets.memory\n"
        "gpt2_tui._app = lambda config: 0  # stop where the app would open\n"
        "assert gpt2_tui.main([]) == 0\n"
        "assert 'torch' not in sys.modules, 'torch imported before the form'\n"
    )
    out = python_c(code)
    assert out.returncode == 0, out.stderr


def test_the_form_paints_first_and_the_device_fills_in_when_probed(
    tiny_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    real_probe = setup_mod.probe_device

    def slow_probe():  # stands in for a cold `import torch`
        release.wait(60)
        return real_probe()

    monkeypatch.setattr(setup_mod, "paint_first", lambda headless: True)
    monkeypatch.setattr(setup_mod, "probe_device", slow_probe)

    async def go() -> None:
        app = GPT2App(micro(tiny_dataset))
        async with app.run_test(size=SIZE) as pilot:
            seen = notes(app)
            await until(pilot, lambda: isinstance(app.screen, SetupScreen), "the form")
            form = app.screen
            await set_value(pilot, form, "#run-dir", str(tmp_path / "run"))
            assert form.caps is None and form.query_one("#preset").display  # painted, device unknown
            assert "once torch has loaded" in text_of(form, "#mem-table")
            assert form.query_one("#launch").disabled is True
            # issue 22: a key pressed while torch loads is kept (the last one wins) and runs once it has
            await pilot.press("f5")
            assert any("launching as soon as torch has loaded" in n for n in seen) and not (tmp_path / "run").exists()
            await pilot.press("f4")  # replaces the launch: the form stays, so it can be read below
            assert any("fitting the memory as soon as torch has loaded" in n for n in seen)
            release.set()
            await until(pilot, lambda: form.caps is not None, "the probe's answer")
            await until(pilot, lambda: any("nothing to fix" in n for n in seen), "the kept F4, run once loaded")
            assert app.screen is form and not (tmp_path / "run").exists()  # F5 was replaced, not run too
            # the first frame's stand-ins and the rows below it gave way to the whole form, in order
            assert not form.query(setup_mod.SelectStandIn)
            fields = [w.id for w in form.query("#form Input, #form Select, #form Switch")]
            assert [f for f in fields if f in {wid(d) for d in F.ALL_FIELDS}] == [wid(d) for d in F.ALL_FIELDS]
            assert all(isinstance(form.query_one("#" + wid(d)), (Select, Input, Switch)) for d in F.ALL_FIELDS)
            assert fields[-1] == "toml-path"  # the actions row, mounted last, is at the bottom
            assert form.query_one(MemoryPanel).fits is True  # the estimate filled in
            assert "vocab 64" in text_of(form, "#dataset-info")
            assert form.query_one("#launch").disabled is False

    run(go)


# ------------------------------------------------------------------ item 9: form friction


def test_f5_refused_for_memory_names_the_memory_panel_and_the_fix(tiny_dataset: Path, tmp_path: Path) -> None:
    async def go() -> None:
        app = GPT2App(micro(tiny_dataset))
        async with app.run_test(size=SIZE) as pilot:
            seen = notes(app)
            form = await open_form(pilot, app)
            await set_value(pilot, form, "#run-dir", str(tmp_path / "run"))
            cfg = memory.with_dataset_vocab(form.config)
            one = memory.estimate(memory.with_batch(cfg, 1, 4)).peak_bytes
            two = memory.estimate(memory.with_batch(cfg, 2, 2)).peak_bytes
            await set_value(pilot, form, "#mem-budget", str((one + two) // 2))
            await pilot.press("f5")
            refusal = seen[-1]
            assert "memory" in refusal and "F4" in refusal and "micro-batch 1" in refusal
            assert "fields marked in red" not in refusal
            assert not (tmp_path / "run").exists()

    run(go)


def test_f4_when_no_micro_batch_fits_turns_on_grad_checkpointing_or_says_what_to_change(tiny_dataset: Path) -> None:
    async def go() -> None:
        app = GPT2App(micro(tiny_dataset, **{"train.batch_size": 1, "model.n_embd": 256, "model.n_head": 4,
                                             "model.n_layer": 8, "model.block_size": 256}))  # fmt: skip
        async with app.run_test(size=SIZE) as pilot:
            seen = notes(app)
            form = await open_form(pilot, app)
            cfg = memory.with_dataset_vocab(form.config)
            plain = memory.estimate(cfg).peak_bytes
            ckpt = cfg.model_copy(update={"model": cfg.model.model_copy(update={"grad_checkpointing": True})})
            with_ckpt = memory.estimate(ckpt).peak_bytes
            assert with_ckpt < plain
            await set_value(pilot, form, "#mem-budget", str((plain + with_ckpt) // 2))
            assert form.query_one(MemoryPanel).fits is False
            await pilot.press("f4")
            await pilot.pause()
            assert form.query_one("#" + wid("model.grad_checkpointing")).value is True
            assert form.query_one(MemoryPanel).fits is True and "grad checkpointing" in seen[-1]

            await set_value(pilot, form, "#mem-budget", "1KiB")  # nothing fits: say what to change
            await pilot.press("f4")
            advice = seen[-1]
            assert "nothing to fix" not in advice
            assert "smaller preset" in advice and "block size" in advice and "memory budget" in advice

    run(go)


@pytest.mark.slow
def test_tab_reaches_the_memory_panel(tiny_dataset: Path) -> None:
    async def go() -> None:
        app = GPT2App(micro(tiny_dataset))
        async with app.run_test(size=SIZE) as pilot:
            form = await open_form(pilot, app)
            for _ in range(len(form.focus_chain) + 1):
                await pilot.press("tab")
                if app.focused is not None and app.focused.id == "mem-table":
                    break
            assert app.focused is not None and app.focused.id == "mem-table"
            assert form.query_one("#mem-table").region.height > 0  # scrolled into view

    run(go)


@pytest.mark.parametrize("size", [(120, 40), (80, 24)])
@pytest.mark.parametrize("field", ["train.batch_size", "train.block_size", "speed.precision"])
def test_the_memory_verdict_is_in_view_where_batch_context_and_precision_are_edited(
    tiny_dataset: Path, size: tuple[int, int], field: str
) -> None:
    """The panel with its breakdown is at the form's end; its verdict line stays on screen,
    above the footer, while the field that moves memory is being edited, and follows it."""

    async def go() -> None:
        app = GPT2App(micro(tiny_dataset))
        async with app.run_test(size=size) as pilot:
            form = await open_form(pilot, app)
            line = form.query_one("#mem-verdict")
            await until(pilot, lambda: str(line.render()).startswith("memory: fits"), "the verdict")
            edited = form.query_one("#" + wid(field))
            edited.focus()
            await pilot.pause()
            screen_rows = range(1, size[1] - 1)  # below the header, above the footer
            assert edited.region.height and edited.region.y in screen_rows, edited.region
            assert line.region.height == 1 and line.region.y in screen_rows, line.region
            assert not line.region.overlaps(edited.region)
            await set_value(pilot, form, "#mem-budget", "1MiB")  # now nothing fits
            await until(pilot, lambda: "does not fit" in str(line.render()), "the verdict follows")
            assert line.has_class("over")

    run(go)


def test_browse_can_leave_the_working_directory(tiny_dataset: Path, tmp_path: Path, monkeypatch) -> None:
    start = tmp_path / "work"
    start.mkdir()
    monkeypatch.chdir(start)

    async def go() -> None:
        app = GPT2App(resolve("micro"))
        async with app.run_test(size=SIZE) as pilot:
            form = await open_form(pilot, app)
            await pilot.click("#browse")
            await until(pilot, lambda: isinstance(app.screen, PickDirectory), "the directory picker")
            picker = app.screen
            assert picker.root == start.resolve()
            await pilot.press("backspace")
            await pilot.pause()
            assert picker.root == tmp_path.resolve()
            assert str(tmp_path.resolve()) in text_of(picker, "#where")
            await pilot.press("escape")
            await until(pilot, lambda: app.screen is form, "back to the form")

    run(go)


def test_a_text_file_as_dataset_advises_prepare_in_the_forms_words(tmp_path: Path) -> None:
    text = tmp_path / "shakespeare.txt"
    text.write_text("To be, or not to be, that is the question.\n" * 50)

    async def go() -> None:
        app = GPT2App(resolve("micro"))
        async with app.run_test(size=SIZE) as pilot:
            form = await open_form(pilot, app)
            await set_value(pilot, form, "#dataset", str(text))
            err = text_of(form, "#err-dataset")
            assert "gpt2-tui prepare" in err and str(text) in err
            assert "--" not in outside_backticks(err)  # no CLI flag named in the form's own words
            await set_value(pilot, form, "#dataset", str(tmp_path / "missing"))
            assert "--" not in outside_backticks(text_of(form, "#err-dataset"))
            assert "dataset field" in text_of(form, "#err-dataset")

    run(go)


def test_warmup_at_or_past_max_steps_is_refused_in_the_form(tiny_dataset: Path) -> None:
    """Issue 22: the preset's warmup follows a shorter max steps; only a warmup the user typed
    that does not end before the run is refused."""

    async def go() -> None:
        app = GPT2App(resolve("nano", overrides={"data.path": str(tiny_dataset)}))
        async with app.run_test(size=SIZE) as pilot:
            seen = notes(app)
            form = await open_form(pilot, app)
            assert form.query_one("#launch").disabled is False
            await set_value(pilot, form, "#" + wid("train.max_steps"), "30")  # nano warms up for 50: scaled to 3
            assert text_of(form, "#err-" + wid("optim.warmup_steps")) == ""
            assert form.query_one("#launch").disabled is False
            await set_value(pilot, form, "#" + wid("optim.warmup_steps"), "40")  # the user's own: refused
            err = text_of(form, "#err-" + wid("optim.warmup_steps"))
            assert "warmup steps 40 is not below max steps 30" in err and "--" not in err
            assert form.query_one("#launch").disabled is True
            await pilot.press("f5")
            assert "warmup steps" in seen[-1]
            await set_value(pilot, form, "#" + wid("optim.warmup_steps"), "3")
            assert text_of(form, "#err-" + wid("optim.warmup_steps")) == ""

    run(go)


def test_warmup_at_or_past_max_steps_is_refused_by_the_cli(tmp_path: Path, capsys) -> None:
    with pytest.raises(UserError, match="warmup steps 50 is not below max steps 50"):
        resolve("nano", overrides={"train.max_steps": 50, "optim.warmup_steps": 50})
    run_dir = tmp_path / "run"
    assert cli_main(["train", "--preset", "nano", "--max-steps", "30", "--warmup-steps", "40", "--out", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--warmup-steps 29 or less" in err and "--max-steps 41" in err
    assert not run_dir.exists()
    assert resolve("nano", overrides={"train.max_steps": 51}).optim.warmup_steps == 50  # the warmup fits: kept
    assert resolve("nano", overrides={"train.max_steps": 30}).optim.warmup_steps == 3  # issue 22: follows the run


def test_switch_states_read_without_colour(tiny_dataset: Path) -> None:
    async def go() -> None:
        app = GPT2App(micro(tiny_dataset))
        async with app.run_test(size=SIZE) as pilot:
            form = await open_form(pilot, app)
            sel = "#" + wid("data.preload")
            state = "#state-" + wid("data.preload")
            assert form.query_one(sel).value is True and text_of(form, state) == "on"
            form.query_one(sel).toggle()
            await pilot.pause()
            assert text_of(form, state) == "off"

    run(go)


@pytest.mark.slow
def test_f2_writes_the_vocab_once_and_asks_before_overwriting(tmp_path: Path) -> None:
    target = tmp_path / "run.toml"

    async def go() -> None:
        app = GPT2App(resolve("nano"))
        async with app.run_test(size=SIZE) as pilot:
            form = await open_form(pilot, app)
            await set_value(pilot, form, "#toml-path", str(target))

            async def save() -> None:  # issue 22: F2 asks where (the path typed here, shown whole), Enter saves
                await pilot.press("f2")
                await until(pilot, lambda: isinstance(app.screen, AskPath), "where to save")
                assert app.screen.query_one("#path").value == str(target)
                await pilot.press("enter")

            await save()
            await until(pilot, lambda: target.exists(), "the TOML written")
            text = target.read_text()
            assert text.count("vocab_size") <= 1
            assert resolve(None, target).train.max_steps == 600  # loads back

            target.write_text("# mine\n")
            await save()
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the overwrite question")
            await pilot.press("n")
            await until(pilot, lambda: app.screen is form, "back to the form")
            assert target.read_text() == "# mine\n"
            await save()
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the overwrite question")
            await pilot.press("y")
            await until(pilot, lambda: target.read_text() != "# mine\n", "the TOML overwritten")
            assert tomllib.loads(target.read_text())["preset"] == "nano"

    run(go)


# ------------------------------------------------------------------ item 10: one size rule


def test_one_parameter_count_rule_with_its_vocab_everywhere(tiny_dataset: Path, capsys) -> None:
    from bench.ladder import LadderResult, header_lines

    gpt2 = resolve("gpt2")
    embedded = memory.size_text(gpt2)  # no dataset: the embedded corpus's vocab
    assert embedded == "124.5M params (vocab 50257; 92.1M with this dataset's 8192-token vocab)"
    full = memory.size_text(resolve("gpt2", overrides={"model.vocab_size": 50257}))
    assert full == "124.5M params (vocab 50257)"

    assert cli_main(["estimate", "--preset", "gpt2"]) in (0, 1)
    assert capsys.readouterr().out.startswith(embedded)
    assert cli_main(["estimate", "--preset", "gpt2", "--vocab-size", "50257"]) in (0, 1)
    assert capsys.readouterr().out.startswith(full)
    ladder = LadderResult(preset="gpt2", n_params=memory.param_count(resolve("gpt2", overrides={"model.vocab_size": 50257})),
                          vocab_size=50257)  # fmt: skip
    assert f"({full})" in header_lines(ladder)[0]

    async def go() -> None:
        app = GPT2App(resolve("nano"))
        async with app.run_test(size=SIZE) as pilot:
            form = await open_form(pilot, app)
            labels = {v: str(p) for p, v in form.query_one("#preset")._options}
            assert labels["gpt2"] == f"gpt2  {memory.size_text(gpt2, short=True)}"  # one line in the select
            await set_value(pilot, form, "#dataset", str(tiny_dataset))  # the dataset's vocab, 64
            labels = {v: str(p) for p, v in form.query_one("#preset")._options}
            assert labels["gpt2"].endswith("at vocab 64)")  # the preset's own size, and what this dataset makes of it
            assert form.query_one("#preset").value == "nano"  # relabelling keeps the choice

    run(go)


# ------------------------------------------------------------------ item 13: chrome at 80x24


def _footer_keys(app: GPT2App) -> dict[str, Any]:
    from textual.widgets._footer import FooterKey

    return {k.key: k for k in app.screen.query(FooterKey)}


@pytest.mark.parametrize("attach", [False, True], ids=["form", "dashboard"])
def test_the_footer_keeps_f7_f8_and_quit_at_80_columns(attach: bool) -> None:
    async def go() -> None:
        app = GPT2App(attach_dir=DATA / "tui-run") if attach else GPT2App()
        async with app.run_test(size=(80, 24)) as pilot:
            if attach:
                await until(pilot, lambda: app.session is not None and app.session.state.finished, "the run read")
            else:
                await open_form(pilot, app)
            await pilot.pause()
            keys = _footer_keys(app)
            for key in ("f7", "f8", "ctrl+q"):
                assert key in keys, key
                r = keys[key].region
                assert r.width > 0 and r.right <= 80, (key, r)

    run(go)


@pytest.mark.slow
def test_a_live_runs_footer_keeps_its_keys_at_80_columns(tiny_dataset: Path, tmp_path: Path) -> None:
    """A live in-app run's dashboard shows more keys than a finished one (pause, save, stop,
    switches): at 80 columns every one stays on screen, with F7/F8 and Quit, and the status
    lines wrap rather than run off the edge."""
    from tui.screens.dashboard import DashboardScreen

    async def go() -> None:
        app = GPT2App(micro(tiny_dataset, **{"train.max_steps": 100000, "train.ckpt_interval": 100000}))
        async with app.run_test(size=(80, 24)) as pilot:
            form = await open_form(pilot, app)
            await set_value(pilot, form, "#run-dir", str(tmp_path / "run"))
            await pilot.press("f6")
            await until(pilot, lambda: isinstance(app.screen, DashboardScreen), "the dashboard")
            await until(pilot, lambda: app.session.state.step >= 1, "a step")
            await pilot.pause()
            keys = _footer_keys(app)
            for key in ("p", "s", "q", "o", "question_mark", "f7", "f8", "ctrl+q"):
                assert key in keys, key
                r = keys[key].region
                assert r.width > 0 and r.right <= 80, (key, r)
            status = app.screen.query_one("#status")
            text = str(status.render())
            assert "[in this app]" in text and status.region.right <= 80
            width = status.content_size.width
            needed = sum(-(-len(line) // width) for line in text.splitlines())
            assert status.content_size.height >= needed  # every line shown whole (wrapped, never cut)
            await pilot.press("ctrl+q")  # the run saves and stops, then the app quits
            await until(pilot, lambda: app.return_code is not None, "the app's exit")
        assert (tmp_path / "run" / "checkpoints").is_dir()

    run(go)


def test_help_names_f8_and_tab_switching_and_wraps_nothing_at_80x24() -> None:
    assert "F8" in HELP and "switch tabs" in HELP

    async def go() -> None:
        app = GPT2App()
        async with app.run_test(size=(80, 24)) as pilot:
            await open_form(pilot, app)
            await pilot.press("f1")
            await until(pilot, lambda: isinstance(app.screen, HelpScreen), "the help")
            await pilot.pause()
            body = app.screen.query("Static").first()
            assert body.size.height == len(HELP.splitlines())  # one screen line a text line: no wraps
            assert body.region.bottom <= 24
            await pilot.press("escape")

    run(go)


def test_left_right_switch_dashboard_tabs_as_the_help_says() -> None:
    from textual.widgets import TabbedContent

    async def go() -> None:
        app = GPT2App(attach_dir=DATA / "tui-run")
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.session is not None and app.session.state.finished, "the run read")
            tabs = app.screen.query_one(TabbedContent)
            first = tabs.active
            await pilot.press("tab", "shift+tab", "right")  # away and back to the tab bar, then along it
            await pilot.pause()
            assert tabs.active != first
            assert re.search(r"Left/Right\s+switch tabs", HELP)

    run(go)
