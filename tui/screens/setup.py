"""The setup form: preset, dataset, batch and schedule, every speed switch, memory budget.

The model (fields, values, verdicts, presets, final config, TOML) is tui.models.form, with
no Textual; this screen draws it (each field by tui.widgets.setting_input) and shows each
error at its field; Launch stays disabled while anything is refused or the memory estimate
says it will not fit. The form paints before torch is imported (seconds): a worker imports
it and reads what this machine can run (DeviceProbed); the switches the hardware cannot
use, the dataset check and the memory estimate fill in then. The first frame holds only
the rows the terminal shows (tui.widgets.first_paint).
"""

from __future__ import annotations

from pathlib import Path
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widget import MountError
from textual.widgets import Button, Header, Input, Label, Select, Static, Switch

from engine.api import rundir
from engine.api import RunConfig, preset_names, resolve
from engine.api import UserError
from tui.models import form as F
from tui.widgets import setting_input
from tui.widgets.first_paint import CHROME_ROWS, FirstPaint, Row, KeysFooter, SelectStandIn, breakpoint_classes, paint_first
from tui.widgets.memory import MemoryPanel

if TYPE_CHECKING:
    from engine.api import Capabilities

PRESET_HELP = "model shape; batch and schedule reset to the preset's"  # one line at 80 columns
# the first section's title says where a field's whole help is (each shows one line of it)
HELP_HINT = "   (a field's whole help: on focus, or ? for all)"
__all__ = ["SelectStandIn", "SetupScreen", "paint_first", "wid"]


def wid(dotted: str) -> str:
    return "f-" + dotted.replace(".", "-").replace("_", "-")


def probe_device() -> Capabilities:
    """The slow part of opening the form: imports torch and reads what this machine can run.
    Also loads the dataset reader, which imports torch too, so the UI thread never waits."""
    from engine.api import open_dataset  # noqa: F401  (the dataset reader imports torch too)
    from engine.api import device

    return device.capabilities()


class DeviceProbed(Message):
    """Posted by the probe worker: the machine's capabilities are known."""

    def __init__(self, caps: Capabilities):
        super().__init__()
        self.caps = caps


class SetupScreen(Screen):
    """Configure a run. `base` is the config the form starts from (preset, or --config file)."""

    BINDINGS = [  # short labels: at 80 columns the footer keeps them and the app's F7/F8/Quit
        Binding("f5", "launch", "Launch"),
        Binding("f6", "launch_in_app", "In-app"),
        Binding("f4", "apply_fix", "Fit memory"),
        Binding("f2", "save_config", "Save"),
        Binding("f3", "load_config", "Load"),
        Binding("question_mark", "all_help", "Help", show=False),  # F1 lists it: the footer is full at 80
    ]
    # No focus while the form's widgets mount: focusing the scrolling form restyles every
    # widget in it (~0.1-0.2 s on a 2-core VM); _after_first_frame focuses it instead.
    AUTO_FOCUS = ""

    def __init__(self, base: RunConfig | None = None):
        super().__init__()
        self.model = F.FormModel(base)  # values, verdict, presets, final config, TOML: no Textual
        self._loading = False
        self._revalidation_queued = False  # a revalidation is queued (_soon)
        self._dataset_dirty = False
        self._resumed = False
        self._complete = False  # every row mounted: the form can be read
        self._preset_asked: str | None = None  # a preset chosen before that
        self._error_lines: dict[str, Static] = {}  # the error lines mounted so far, by id
        self._paint = FirstPaint(False)  # which rows the first frame shows (paint_first), set in compose
        self._probed: Capabilities | None = None  # the probe's answer, if it came before that
        self._quit_asked = False  # ctrl+q before that: quit when it is
        self._waiting: tuple[str, Callable[[], None]] | None = None  # a key pressed before torch loaded

    @property
    def caps(self) -> Capabilities | None:
        return self.model.caps

    @property
    def config(self) -> RunConfig | None:
        return self.model.config

    # ----------------------------------------------------------------- layout

    def compose(self) -> ComposeResult:
        # the width class (-narrow/-wide) now, while the screen is empty: set at the first
        # resize, as Textual does, it would restyle every widget of the form a second time
        for name, wanted in breakpoint_classes(self.app).items():
            self.set_class(wanted, name)
        yield Header()
        self._paint = FirstPaint(paint_first(self.app.is_headless))  # decided once: compose and mount agree
        widgets = self._paint.first(self._form_items(), self.app.size.height - CHROME_ROWS + 1)
        with VerticalScroll(id="form"):
            yield from widgets
        # the memory verdict stays in view while batch, context or precision is edited (the
        # panel with its breakdown is at the form's end)
        yield Static("", id="mem-verdict", markup=False)
        yield KeysFooter()

    def _form_items(self) -> list[Row]:
        """The form, top to bottom: (about how many lines it takes, what builds its widgets).
        Error lines are not here: each is mounted below its field the first time it has
        something to say (most forms never show one), and the GPUs row once the probe finds
        more than one."""
        top: list[Row] = [
            (2, lambda: [Horizontal(  # its help below it: beside a select wide enough for the sizes, 80
                Label("preset", classes="name"),  # columns left it 10 (it wrapped mid-word)
                self._paint.select(self._preset_options(), self.model.preset(), "preset"),
                classes="row",
            ), Static(PRESET_HELP, classes="help-line")]),
            (1, lambda: [Horizontal(
                Label("dataset", classes="name"),
                Input(self.model.base["data"].get("path") or "", placeholder="default: embedded stdlib corpus", id="dataset", compact=True),
                Button("Browse", id="browse", compact=True),
                classes="row",
            )]),
            (1, lambda: [Static("", id="dataset-info", classes="help-line one-line")]),
            (1, lambda: [Horizontal(
                Label("run directory", classes="name"),
                Input(str(rundir.default_path(self.model.base.get("preset"))), id="run-dir", compact=True),
                classes="row", id="row-run-dir",
            )]),
        ]  # fmt: skip
        for title, names in F.SECTIONS:  # the speed switches first (engine.config.FORM_SECTIONS)
            hint = HELP_HINT if title == F.SECTIONS[0][0] else ""
            top.append((2, lambda title=title, hint=hint: [Static(title + hint, classes="section", markup=False)]))
            for dotted in names:  # one line each: its help's first line (app.tcss); the rest on focus or ?
                top.append((1, lambda d=dotted: [self._field_row(d)]))
                if dotted == "train.grad_accum":
                    top.append((1, lambda: [Static("", id="tokens-per-step", classes="help-line")]))
        top.append((1, lambda: [
            Static("Memory budget", classes="section"),
            MemoryPanel(id="memory"),
            Static("", id="general", classes="error"),
            Horizontal(
                Button("Launch [F5]", id="launch", variant="success", compact=True),
                Button("Launch in-app [F6]", id="launch-in-app", compact=True),
                Button("Fit memory [F4]", id="fix", compact=True),
                Input("", placeholder="TOML path", id="toml-path", compact=True),
                Button("Save [F2]", id="save", compact=True),
                Button("Load [F3]", id="load", compact=True),
                id="actions",
            ),
        ]))  # fmt: skip
        return top

    def _field_row(self, dotted: str) -> Horizontal:
        sp = F.setting(dotted)
        inputs = setting_input.widgets(sp, F.get_value(self.model.base, dotted), wid(dotted), self._paint.select)
        help_ = Static(sp.help, id="help-" + wid(dotted), classes="help", markup=False)
        return Horizontal(Label(sp.label, classes="name"), *inputs, help_, classes="row", id="row-" + wid(dotted))

    def _nproc_row(self, gpus: int) -> Horizontal:
        return Horizontal(
            Label("GPUs", classes="name"),
            Select([(str(n), n) for n in range(1, gpus + 1)], value=gpus, allow_blank=False, id="nproc", compact=True),
            Static(
                "processes, one per GPU, under torchrun (DDP, or FSDP2 when only a shard fits); "
                "more than 1 launches in its own process (F5)",
                classes="help",
            ),
            classes="row", id="nproc-row",
        )  # fmt: skip

    def _preset_options(self) -> list[tuple[str, str]]:
        """Each preset with its size and the vocab that size assumes (memory.size_text, the
        rule `estimate` and the ladder use): the dataset's, once the probe has loaded torch."""
        if self.caps is None:
            return [(name, name) for name in preset_names()]
        from engine.api import memory

        path = self.query_one("#dataset", Input).value.strip() or None
        data = {"data.path": path, "data.vocab_size": self.model.base["data"].get("vocab_size", 50257)}
        return [(f"{name}  {memory.size_text(resolve(name, overrides=data), short=True)}", name) for name in preset_names()]

    def _refresh_presets(self) -> None:
        select = self.query_one("#preset", Select)
        value = select.value
        options = self._preset_options()
        select.set_options(options)
        # set_options picks the first; the stale Changed it posts is ignored. Setting the same
        # value again would leave the shown label as it was (no change, no redraw): pass by
        # another value first, without a Changed, so the label shows the new size
        other = next((v for _, v in options if v != value), value)
        with select.prevent(Select.Changed):
            select.value = other
        select.value = value

    def on_screen_resume(self, event: events.ScreenResume) -> None:
        """The first resume follows the mount, which has just styled every widget: skip
        Textual's second pass over them (a ~0.1-0.2 s share of the first paint). Handlers run
        along the class hierarchy, this one before Screen's, which reads the flag."""
        if not self._resumed:
            self._resumed = True
            event.refresh_styles = False

    def on_mount(self) -> None:
        self.title = "gpt2-tui - set up a run"
        if not self._paint.split:  # complete already: check it all now
            self._complete = True
            self.device_known(probe_device())
        else:  # what the first frame can show before the whole form is checked
            self.query_one("#dataset-info", Static).update("checking the dataset once torch has loaded...")
            self._show_tokens_per_step(self.model.base_config)
        self.call_after_refresh(self._after_first_frame)

    async def _after_first_frame(self) -> None:
        """Start the torch import (seconds: Launch waits for it), then focus the form (see
        AUTO_FOCUS), put the real selects in, mount the rows below the first screen and
        check the form. All of it waited for the first frame: the import holds the GIL for
        long stretches, and the rest would have delayed that frame."""
        form = self.query_one("#form")
        if not self._complete:
            self.run_worker(self._probe, thread=True, exclusive=True, group="probe")
        self.focus_first()
        if self._complete:
            return
        try:
            await self._paint.complete(self.app, form)
        except MountError:  # the app is quitting (ctrl+q before the form was complete)
            return
        if not (self.query("#actions") and self.query("#" + wid(F.ALL_FIELDS[-1]))):
            return  # the same: a closing app's mount adds nothing
        self._complete = True
        if self._quit_asked:
            self.app.exit()
            return
        if self._preset_asked is not None:
            self._apply_preset(self._preset_asked)
        if self._probed is not None:  # torch was quicker than the form
            self.device_known(self._probed)
        else:
            self.revalidate()

    def action_all_help(self) -> None:
        """?: every field's whole help, or one line each again (a field's own shows on focus)."""
        self.toggle_class("-all-help")

    def on_descendant_focus(self, event: events.DescendantFocus) -> None:
        """The dataset's description is one line too: whole while its field has the focus."""
        for info in self.query("#dataset-info"):
            info.set_class(event.widget.id in ("dataset", "browse"), "-focus")
        row = next((w for w in event.widget.ancestors if w.has_class("row")), None)
        if row is not None:  # its whole help, below the field, in view once drawn
            self.call_after_refresh(row.scroll_visible, animate=False)

    def focus_first(self) -> None:
        """The form takes the focus (now, not after a refresh, as Widget.focus would), unless a
        key typed before this frame moved it already. Also asked by the app before the first
        key it hands this screen (GPT2App.on_event): a Tab then moves from here, as later."""
        if self.focused is None:
            self.set_focus(self.query_one("#form"), scroll_visible=False)

    def hold_quit(self) -> bool:
        """ctrl+q before the rows below the first screen have mounted: quit once they have
        (GPT2App.action_quit asks). A Select whose mount the app's teardown cuts short fails
        inside Textual, and the app would exit with a traceback."""
        if self._complete:
            return False
        self._quit_asked = True
        return True

    def loading(self) -> bool:
        """True while torch loads (or the rows below the first screen mount): Launch and
        the memory fix cannot be checked yet."""
        return self.caps is None or not self._complete

    def when_loaded(self, what: str, action: Callable[[], None]) -> bool:
        """A key pressed while torch loads is kept, not dropped: `action` runs once the form
        is checked (the last such key wins; it is checked again then, and a refusal then is
        shown as usual). True if it was kept for later, False if the form is ready now."""
        if not self.loading():
            return False
        self._waiting = (what, action)
        self.notify(f"{what} as soon as torch has loaded", timeout=10)
        return True

    def _run_waiting(self) -> None:
        if self._waiting is not None and not self.loading():
            _, action = self._waiting
            self._waiting = None
            action()

    def _probe(self) -> None:  # on a worker thread
        self.post_message(DeviceProbed(probe_device()))

    def on_device_probed(self, message: DeviceProbed) -> None:
        if self._complete:
            self.device_known(message.caps)
        else:  # applied once every field is mounted
            self._probed = message.caps

    def device_known(self, caps: Capabilities) -> None:
        """The machine is known: disable what it cannot run (saying why), offer its GPUs,
        check the dataset, size the presets and estimate the memory."""
        from engine.api import device

        self.model.caps = caps
        for dotted, why in device.disabled(caps).items():
            if dotted in F.ALL_FIELDS:
                self.query_one("#" + wid(dotted)).disabled = True
                self.query_one("#help-" + wid(dotted), Static).update(f"[disabled: {why}] {F.setting(dotted).help}")
        if caps.gpus > 1:
            after = "#err-run-dir" if "err-run-dir" in self._error_lines else "#row-run-dir"
            self.query_one("#form").mount(self._nproc_row(caps.gpus), after=after)
        self._check_dataset()
        self._refresh_presets()
        self.revalidate()
        if self._waiting is not None:  # after the revalidation's refresh: the form as the user sees it
            self.call_after_refresh(self._run_waiting)

    # ----------------------------------------------------------------- values

    def values(self) -> dict[str, Any]:
        out = {d: setting_input.read(F.setting(d), self.query_one("#" + wid(d))) for d in F.ALL_FIELDS}
        out["data.path"] = self.query_one("#dataset", Input).value.strip() or None
        return out

    def set_values(self, data: dict[str, Any]) -> None:
        """Fill every field from a config dict (preset change, loaded TOML)."""
        self._loading = True
        try:
            for dotted in F.ALL_FIELDS:
                setting_input.write(F.setting(dotted), self.query_one("#" + wid(dotted)), F.get_value(data, dotted))
            self.query_one("#dataset", Input).value = data.get("data", {}).get("path") or ""
        finally:
            self._loading = False
        self._check_dataset()
        self.revalidate()

    # ----------------------------------------------------------------- validation

    def revalidate(self) -> None:
        if not self._complete:  # checked once the rest of the form has mounted
            return
        vals = self.values()
        self.model.check(vals)
        for dotted in F.ALL_FIELDS:
            self._show_error("err-" + wid(dotted), self.model.errors.get(dotted), "#" + wid(dotted))
        self.query_one("#general", Static).update("\n".join(self.model.general))
        self._show_tokens_per_step(self.model.validated)
        panel = self.query_one(MemoryPanel)
        if self.caps is None:
            panel.waiting()
        elif self.config is not None and (self.model.dataset_info is not None or vals["data.path"] is None):
            panel.show(self.config, vals.get("speed.device", "auto"))
        else:
            panel.show(None)
        line = self.query_one("#mem-verdict", Static)
        line.update(panel.summary)
        line.set_class(panel.fits is False, "over").set_class(panel.fits is True, "ok")
        self._update_launch()

    def _show_tokens_per_step(self, config: RunConfig | None) -> None:
        if not self.query("#tokens-per-step"):  # not in a short terminal's first frame: shown once mounted
            return
        self.query_one("#tokens-per-step", Static).update(
            ""
            if config is None
            else f"effective: {config.train.batch_size} x {config.train.grad_accum} x {config.seq_len} = "
            f"{config.tokens_per_step:,} tokens per optimizer step" + "".join("\n" + n for n in self.model.notes)
        )  # the notes: what the check decided on its own (a warmup that follows max steps), as the CLI says

    def _show_error(self, err_id: str, why: str | None, field_sel: str | None = None) -> None:
        """The line below a field that says why it is refused; mounted the first time."""
        err = self._error_lines.get(err_id)
        if err is None and why:
            err = self._error_lines[err_id] = Static("", id=err_id, classes="error")
            anchor = {"err-dataset": "#dataset-info", "err-run-dir": "#row-run-dir"}.get(err_id, "#row-" + err_id[4:])
            self.query_one("#form").mount(err, after=anchor)
        if err is not None:
            err.update(f"  ^ {why}" if why else "")
            err.display = bool(why)
        if field_sel:
            self.query_one(field_sel).set_class(bool(why), "invalid")

    def error_shown(self, err_id: str) -> str:
        """What the error line `err_id` says now ("" when it says nothing or was never needed)."""
        err = self._error_lines.get(err_id)
        return str(err.render()) if err is not None and err.display else ""

    def _run_dir_error(self) -> str | None:
        text = self.query_one("#run-dir", Input).value.strip()
        if not text:
            return "give a directory for the run"
        try:
            rundir.check_new(Path(text))
        except UserError as err:
            return F.form_words(err)
        return None

    def _update_launch(self) -> None:
        run_err = self._run_dir_error()
        self._show_error("err-run-dir", run_err, "#run-dir")
        ok = self.ready() and run_err is None
        self.query_one("#launch", Button).disabled = not ok
        self.query_one("#launch-in-app", Button).disabled = not ok
        panel = self.query_one(MemoryPanel)
        self.query_one("#fix", Button).disabled = panel.fix is None and panel.fits is not False

    def ready(self) -> bool:
        return self.refusal() is None

    def refusal(self) -> str | None:
        """Why Launch is refused, naming the part of the form to change; None: it is not."""
        why = self.model.refusal()
        if why is not None:
            return why
        if self.error_shown("err-dataset"):
            return "fix the dataset first (marked in red)"
        if self.config is None:
            return "fix the fields marked in red first"
        panel = self.query_one(MemoryPanel)
        if panel.fits is False:
            return f"the memory budget refuses this run (the memory panel, in red): {panel.advice}"
        run_err = self._run_dir_error()
        if run_err:
            return f"run directory: {run_err}"
        return None

    def _check_dataset(self) -> None:
        path = self.query_one("#dataset", Input).value.strip()
        info_w = self.query_one("#dataset-info", Static)
        self.model.dataset_info = None
        if self.caps is None:  # the probe imports the dataset reader (torch); checked when it is done
            return
        from engine.api import open_dataset

        if not path:
            from engine.api import DEFAULT_VOCAB

            info_w.update(f"the embedded stdlib corpus (BPE {DEFAULT_VOCAB}), built once on first launch (~6 s on 2 cores)")
            self._show_error("err-dataset", None, "#dataset")
            return
        try:
            ds = open_dataset(Path(path), vocab_size=self.model.base["data"].get("vocab_size", 50257), preload=False)
        except UserError as err:
            info_w.update("")
            self._show_error("err-dataset", F.form_words(err), "#dataset")
            return
        self.model.dataset_info = ds.info
        i = ds.info
        info_w.update(
            f"{i.format}: {i.train_tokens:,} train + {i.val_tokens:,} val tokens, {i.dtype}, vocab {i.vocab_size:,}"
            + ("" if i.tokenizer else ", no tokenizer (no samples)")
        )
        self._show_error("err-dataset", None, "#dataset")

    # ----------------------------------------------------------------- events

    def _soon(self, dataset: bool = False) -> None:
        """Check the form once for a burst of Changed messages (mounting posts one per field,
        a preset or a loaded TOML one per value): one revalidation, not one each."""
        self._dataset_dirty |= dataset
        if not self._revalidation_queued:
            self._revalidation_queued = True
            self.call_later(self._settle)

    def _settle(self) -> None:
        self._revalidation_queued = False
        if self._dataset_dirty:
            self._dataset_dirty = False
            self._check_dataset()
            if self.caps is not None:
                self._refresh_presets()
        self.revalidate()

    @on(Input.Changed)
    def _input_changed(self, event: Input.Changed) -> None:
        if self._loading or event.input.id == "toml-path":
            return
        self._soon(dataset=event.input.id == "dataset")

    @on(Switch.Changed)
    def _switch_changed(self, event: Switch.Changed) -> None:
        setting_input.switch_changed(self, event)
        if not self._loading:
            self._soon()

    @on(Select.Changed)
    def _select_changed(self, event: Select.Changed) -> None:
        if self._loading:
            return
        if event.value != event.select.value:  # stale: set_options' pick, already replaced
            return
        if event.select.id == "preset" and event.value != self.model.base.get("preset"):
            if not self._complete:  # its fields are not all mounted yet: applied when they are
                self._preset_asked = str(event.value)
                return
            self._apply_preset(str(event.value))
            return
        self._soon()

    def _apply_preset(self, name: str) -> None:
        """A new preset: its model shape and its train/optim values; speed and data kept."""
        current = self.values()
        self.model.apply_preset(name)
        self.set_values(self.model.base)
        for dotted in F.KEPT_ON_PRESET:  # the device and speed switches stay as the user set them
            self._set_one(dotted, current[dotted])
        self.query_one("#run-dir", Input).value = str(rundir.default_path(name))
        self.revalidate()

    def _set_one(self, dotted: str, value: Any) -> None:
        self._loading = True
        try:
            setting_input.write(F.setting(dotted), self.query_one("#" + wid(dotted)), value)
        finally:
            self._loading = False

    @on(Button.Pressed)
    def _button(self, event: Button.Pressed) -> None:
        action = {
            "launch": self.action_launch, "launch-in-app": self.action_launch_in_app, "fix": self.action_apply_fix,
            "save": self.action_save_config, "load": self.action_load_config, "browse": self._browse,
        }.get(event.button.id or "")  # fmt: skip
        if action:
            action()

    def _browse(self) -> None:
        from tui.screens.modals import PickDirectory

        def picked(path: Path | None) -> None:
            if path is not None:
                self.query_one("#dataset", Input).value = str(path)

        current = Path(self.query_one("#dataset", Input).value.strip() or ".").expanduser().resolve()
        start = current if current.is_dir() else current.parent if current.parent.is_dir() else Path.cwd()
        self.app.push_screen(PickDirectory(start), picked)

    # ----------------------------------------------------------------- actions

    def final_config(self) -> RunConfig | None:
        self.revalidate()
        why = self.refusal()
        if why is not None:
            self.notify(why, severity="error")
            return None
        return self.model.launch_config()

    def action_launch(self, detached: bool = True) -> None:
        """The default launch is detached: the headless CLI in its own process, so the run
        survives the terminal and the dashboard cannot slow it through the GIL (see
        docs/benchmarks.md); F6 trains on a thread of this app instead. Pressed while torch
        loads, it launches once it has (when_loaded)."""
        if self.when_loaded("launching" if detached else "launching in-app", lambda: self.action_launch(detached)):
            return
        config = self.final_config()
        if config is None:
            return
        nproc = self.query_one("#nproc", Select).value if self.caps and self.caps.gpus > 1 else 1
        if nproc > 1 and not detached:
            self.notify(f"{nproc} GPUs run as torchrun processes: launch with F5", severity="error")
            return
        run_dir = Path(self.query_one("#run-dir", Input).value.strip())
        self.app.launch(config, run_dir, detached=detached, nproc=nproc)  # type: ignore[attr-defined]

    def action_launch_in_app(self) -> None:
        self.action_launch(detached=False)

    def opening(self) -> bool:
        """True (and says so) while the rows below the first screen are still mounting."""
        if not self._complete:
            self.notify("the form is still opening: press again in a moment", severity="warning")
        return not self._complete

    def action_apply_fix(self) -> None:
        if self.when_loaded("fitting the memory", self.action_apply_fix):
            return
        panel = self.query_one(MemoryPanel)
        fix = panel.fix
        if fix is None:
            if panel.fits is False:
                self.notify(panel.advice, title="F4: no micro-batch fits", severity="warning", timeout=10)
            elif panel.fits is True:
                self.notify("nothing to fix: the run fits the memory budget")
            else:
                self.notify(self.refusal() or "no estimate to fix yet", severity="warning")
            return
        self._set_one("train.batch_size", str(fix.train.batch_size))
        self._set_one("train.grad_accum", str(fix.train.grad_accum))
        if fix.model.grad_checkpointing:
            self._set_one("model.grad_checkpointing", True)
        self.revalidate()
        self.notify(f"applied: {panel.fix_text(fix)}")

    def toml_path(self) -> Path:
        """Where F2 offers to save the form (and F3 loads from): the path typed beside the
        buttons, else run.toml in the runs' root (the run directory's parent), else beside
        the dataset, else in the home directory; never the current directory unasked."""
        typed = self.query_one("#toml-path", Input).value.strip()
        if typed:
            return Path(typed).expanduser().resolve()
        run_dir = self.query_one("#run-dir", Input).value.strip()
        data = self.query_one("#dataset", Input).value.strip()
        base = Path(run_dir).expanduser().resolve().parent if run_dir else (
            Path(data).expanduser().resolve().parent if data else Path.home())
        return base / "run.toml"

    def action_save_config(self) -> None:
        """F2: asks where (a path shown whole, editable), writes nothing until confirmed,
        and asks again before overwriting a file."""
        if self.opening():
            return
        if self.config is None:
            self.notify("fix the fields marked in red before saving", severity="error")
            return
        text = self.model.toml_text()
        from tui.screens.modals import AskPath, ConfirmScreen

        def where(path: Path | None) -> None:
            if path is None:
                self.notify("not saved")
                return
            self.query_one("#toml-path", Input).value = str(path)

            def write(yes: bool | None = True) -> None:
                if not yes:
                    self.notify(f"not saved: {path} left as it was")
                    return
                from engine.api import atomic_write_bytes

                try:
                    path.parent.mkdir(parents=True, exist_ok=True)  # the runs' root, before the first run
                    atomic_write_bytes(path, text.encode())
                except OSError as err:
                    self.notify(f"cannot write {path}: {err.strerror}", severity="error")
                    return
                self.notify(f"saved {path}")

            if path.exists():
                self.app.push_screen(ConfirmScreen(f"{path} exists. Overwrite it with this form?"), write)
            else:
                write()

        self.app.push_screen(AskPath("Save the form as TOML to:", self.toml_path()), where)

    def action_load_config(self) -> None:
        if self.opening():
            return
        path = self.toml_path()
        try:
            config = F.load_file(path)
        except UserError as err:
            self.notify(F.form_words(err), severity="error")
            return
        self.load(config)
        self.notify(f"loaded {path}")

    def load(self, config: RunConfig) -> None:
        self.model.load(config)
        self._loading = True
        self.query_one("#preset", Select).value = self.model.preset()
        self._loading = False
        self.set_values(self.model.base)

