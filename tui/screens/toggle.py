"""The live run's switches: change speed switches of a running run from its dashboard.

Each switch of engine.run.segments.SWITCHES gets the widget its setting's kind calls for
(tui.widgets.setting_input, as in the setup form), with the run's current value; micro-batch x grad-accum is one choice of
the pairs that keep the tokens per optimizer step. What this machine cannot use is disabled
with engine.device's reason. As the user edits, the memory estimate of the new set is shown
against the budget the trainer will check it against; Apply runs the engine's own toggle
judgement (engine.run.toggle.judge, the launch's preflight) and writes the request
(engine.run.toggle.request) only when it passes, so the screen refuses exactly what the
trainer would, and nothing is written then.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Footer, Label, Select, Static, Switch

from engine.api import device, memory
from engine.api import toggle
from engine.api import RunConfig, overlay
from engine.api import UserError
from engine.api import change_text, format_table, human, verdict
from engine.api import SWITCHES, changed, switches
from engine.api import setting
from tui.screens.modals import ARROWS
from tui.models.form import form_words
from tui.widgets import setting_input
from tui.widgets.memory import MemoryPanel

BATCH = "train.batch_size"  # with train.grad_accum: one widget, the pairs of the same product
ACCUM = "train.grad_accum"


def wid(dotted: str) -> str:
    return "sw-" + dotted.replace(".", "-").replace("_", "-")


def pairs(batch: int, accum: int) -> list[tuple[int, int]]:
    """(micro-batch, grad-accum) with the same product: the same tokens per optimizer step."""
    n = batch * accum
    return [(d, n // d) for d in range(n, 0, -1) if n % d == 0]


def pair_text(b: int, a: int) -> str:
    return f"{b} x {a}"


def with_switches(config: RunConfig, values: dict[str, Any]) -> RunConfig:
    """`config` with `values` ({dotted: value}) set, validated as a config file would be."""
    return overlay(config.model_dump(mode="json", exclude_none=True), values)


class ToggleScreen(ModalScreen[dict[str, Any] | None]):
    """Dismissed with the switches requested ({dotted: new value}), or None if cancelled."""

    DEFAULT_CSS = """
    ToggleScreen { align: center middle; }
    ToggleScreen #toggle-dialog { width: 100; max-width: 100%; height: 90%; border: thick $primary;
                                  background: $surface; padding: 0 1; }
    ToggleScreen #toggle-title { text-style: bold; }
    ToggleScreen #toggle-pending { color: $warning; padding: 0 1; height: auto; }
    ToggleScreen #toggle-rows { height: 1fr; }
    ToggleScreen .row .name { width: 22; }
    ToggleScreen .row Select { width: 30; }
    ToggleScreen #toggle-verdict { height: auto; padding: 0 1; }
    ToggleScreen #toggle-verdict.over { color: $error; border-left: thick $error; }
    ToggleScreen #toggle-verdict.ok { border-left: thick $success; }
    ToggleScreen #toggle-memory { height: auto; padding: 0 1; color: $text-muted; }
    ToggleScreen .buttons { height: auto; }
    ToggleScreen Button { margin-right: 2; }
    """
    # Apply a key away (not ~12 Tabs); `a` is no switch's key, and no row takes typed text. The
    # dialog's own footer says so while it is up (the dashboard's keys do nothing here)
    BINDINGS = [Binding("a", "apply", "Apply"), Binding("escape", "cancel", "Cancel"), *ARROWS]

    def __init__(self, run_dir: Path, config: RunConfig, *, world_size: int = 1, sharding: memory.Sharding = "ddp",
                 steerable: Callable[[], bool] = lambda: True, send: Callable[[Any], None] | None = None,
                 held: int | None = None, pending: dict[str, Any] | None = None) -> None:  # fmt: skip
        """`config`: what the run trains with now; `steerable`: asked again at Apply (the run
        may have ended, or its writer gone, while this screen was open); `send`: the session's
        steer (else the request goes to the run directory's mailbox); `held`: the device memory
        the run holds now (device.held_bytes() when it trains in this process; else what its
        events last reported), which a toggle's new segment takes over; `pending`: switches
        asked for already and not yet applied ({dotted: value}, RunState.pending_switches)."""
        super().__init__()
        self.run_dir, self.config = Path(run_dir), memory.with_dataset_vocab(config)
        self.world_size, self.sharding, self.steerable, self.send = world_size, sharding, steerable, send
        self.held = device.held_bytes() if held is None else held
        self.current = switches(self.config)
        self.pending = {n: v for n, v in (pending or {}).items() if n in self.current and self.current[n] != v}
        self.caps = device.capabilities()
        self.off = device.disabled(self.caps)  # switch -> why this machine cannot use it
        self.problem: str | None = "nothing changed yet"  # why Apply is refused now (None: it may go)
        self.fits: bool | None = None
        self.memory_line = ""  # the estimate's verdict in one line (the table is in the scroll)
        self.notes: list[str] = []  # the run's own judgement's warnings on the new set (engine.run.toggle.judge)

    # ----------------------------------------------------------------- building

    def compose(self) -> ComposeResult:
        with Vertical(id="toggle-dialog"):
            yield Static("Switches of the live run", id="toggle-title")
            yield Static(f"{self.run_dir}: applied at the next step boundary, from a checkpoint of exactly "
                         "that state, as a new segment of the run", classes="help-line", markup=False)  # fmt: skip
            if self.pending:
                yield Static(f"asked, not applied yet: {self.pending_text()}", id="toggle-pending", markup=False)
            with VerticalScroll(id="toggle-rows"):
                for dotted in SWITCHES:
                    if dotted == ACCUM:
                        continue
                    yield from self._row(dotted)
                yield Static("", id="toggle-memory", markup=False)
            yield Static("", id="toggle-verdict", markup=False)
            with Horizontal(classes="buttons"):
                yield Button("Apply [a]", id="apply", variant="primary")
                yield Button("Cancel [esc]", id="cancel")
        yield Footer()

    def _row(self, dotted: str) -> ComposeResult:
        value, why = self.current[dotted], self.off.get(dotted)
        if dotted == BATCH:
            b, a = self.current[BATCH], self.current[ACCUM]
            label, help_ = "micro-batch x accum", "same tokens per optimizer step; a smaller micro-batch needs less memory"
            options = [(pair_text(p, q), pair_text(p, q)) for p, q in pairs(b, a)]
            inputs = [setting_input.compact_select(options, pair_text(b, a), wid(dotted))]
        else:
            sp = setting(dotted)
            label, help_ = sp.label, sp.help
            inputs = setting_input.widgets(sp, value, wid(dotted))
        inputs[0].disabled = why is not None
        with Horizontal(classes="row"):
            yield Label(label, classes="name")
            yield from inputs
            yield Static(f"cannot change here: {why}" if why else help_, classes="help", markup=False,
                         id="help-" + wid(dotted))  # fmt: skip

    def pending_text(self, names: Any = None) -> str:
        """'compile off -> on (pending), ...' for the pending switches (or those of `names`)."""
        keys = self.pending if names is None else [n for n in names if n in self.pending]
        return ", ".join(f"{change_text({n: [self.current[n], self.pending[n]]})} (pending)" for n in keys)

    def on_mount(self) -> None:
        self.evaluate()

    # ----------------------------------------------------------------- judging

    def values(self) -> dict[str, Any]:
        """Every switch as the widgets have it now."""
        out = dict(self.current)
        for dotted in SWITCHES:
            if dotted == ACCUM:
                continue
            w = self.query_one("#" + wid(dotted))
            if dotted == BATCH:
                b, a = str(w.value).split(" x ")  # type: ignore[attr-defined]
                out[BATCH], out[ACCUM] = int(b), int(a)
            else:
                out[dotted] = setting_input.read(setting(dotted), w)
        return out

    def changes(self) -> dict[str, Any]:
        """{dotted: new value} of the switches the user changed."""
        return {n: new for n, (_, new) in changed(self.current, self.values()).items()}

    def on_switch_changed(self, event: Switch.Changed) -> None:
        setting_input.switch_changed(self, event)
        self.evaluate()

    def on_select_changed(self, _: Select.Changed) -> None:
        self.evaluate()

    def evaluate(self) -> None:
        """The memory estimate of the new set, and why Apply would be refused (if it would)."""
        changes = self.changes()
        self.problem, self.fits = self._judge(changes)
        verdict = self.query_one("#toggle-verdict", Static)
        if self.problem is None:
            line = f"Apply: {change_text(changed(self.current, self.values()))}"
            line += "".join(f"\nnote: {n}" for n in self.notes)  # the preflight's warnings (an emulated precision)
        else:
            line = f"cannot apply: {self.problem}"
        verdict.update(f"memory: {self.memory_line}\n{line}" if self.memory_line else line)
        verdict.set_class(self.problem is not None and bool(changes), "over").set_class(self.problem is None, "ok")

    def _judge(self, changes: dict[str, Any]) -> tuple[str | None, bool | None]:
        self.notes = []
        mem = self.query_one("#toggle-memory", Static)
        try:
            new = with_switches(self.config, changes)
            est = memory.estimate(new, self.world_size, self.sharding)
        except UserError as err:
            mem.update("")
            self.memory_line = ""
            return form_words(err), None
        total, source = device.budget(est.target, held=self.held)  # the running segment's memory is the new one's
        self.memory_line = verdict(est, total)
        mem.update(f"memory of the new set [{source}]\n{format_table(est, total)}")
        fits = None if total is None else est.fits(total)
        if not changes:
            return "nothing changed: pick a switch to change first", fits
        again = [n for n, v in changes.items() if n in self.pending and self.pending[n] == v]
        if again:  # asked once already: a second request would only be dropped (or toggle twice)
            return f"already pending: {self.pending_text(again)}; it applies at the next step boundary", fits
        if fits is False:
            assert total is not None
            return self._memory_fix(new, total), False
        try:  # the run's own judgement (engine.run.toggle.judge: preflight): what passes here passes there
            judged = toggle.judge(self.config, changes, held=self.held, caps=self.caps)
        except UserError as err:
            return form_words(err), fits
        at = {id(why): n for n, why in judged.errors.items()}
        for why in sorted(judged.found, key=lambda w: at.get(id(w)) not in changes):  # the changed switches first
            n = at.get(id(why))
            return (f"{setting(n).label}: {form_words(why)}" if n else form_words(why)), fits
        self.notes = [form_words(why) for why in judged.warnings]
        return None, fits

    def _memory_fix(self, new: RunConfig, total: int) -> str:
        """Why the new set does not fit, and what to change, in this screen's words."""
        head = f"the new set needs {human(memory.estimate(new, self.world_size, self.sharding).peak_bytes)}, " \
               f"more than the {human(total)} available"  # fmt: skip
        fix = memory.suggest_fit(new, total, self.world_size, self.sharding)
        if fix is not None:
            return f"{head}; choose {MemoryPanel.fix_text(fix)}"
        return f"{head}; even micro-batch 1 does not fit: turn grad checkpointing on, or the chunked loss, or bf16"

    # ----------------------------------------------------------------- keys

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "apply":
            self.action_apply()
        else:
            self.action_cancel()

    def action_apply(self) -> None:
        self.evaluate()
        if self.problem is not None:
            self.notify(f"not applied: {self.problem}", severity="error", timeout=10)
            return
        if not self.steerable():  # it said why
            return
        changes = self.changes()
        try:
            self.send(toggle.ask(changes)) if self.send else toggle.request(self.run_dir, changes)
        except (UserError, OSError) as err:
            self.notify(f"not applied: {err}", severity="error", timeout=10)
            return
        self.app.notify(f"applies at the next step boundary: {change_text(changed(self.current, self.values()))}")
        self.dismiss(changes)

    def action_cancel(self) -> None:
        self.dismiss(None)


__all__ = ["ToggleScreen", "pairs"]
