"""The setup form's memory budget: engine.train.memory's breakdown against the device's memory.

Red, and Launch refused, when the estimate does not fit; then `fix` holds the estimator's
suggestion (a smaller micro-batch with more accumulation, same sequences per step; grad
checkpointing too when no micro-batch fits without it) that the form applies with one key,
and `advice` says in one line what to change when nothing the key can apply would fit. The budget defaults to the training device's memory and
can be overridden (plan a GPU run's batch from here, or leave room for other jobs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Input, Label, Static

from engine.api import RunConfig
from engine.api import UserError
from engine.api import format_table, parse_bytes, verdict

if TYPE_CHECKING:  # the estimator loads when there is something to estimate (after the form's first frame)
    from engine.api import memory


class MemoryTable(Static, can_focus=True):
    """The estimate's table: focusable, so Tab reaches the panel (and scrolls it into view)."""


class MemoryPanel(Vertical):
    DEFAULT_CSS = """
    MemoryPanel { height: auto; }
    MemoryPanel #mem-table { height: auto; padding: 0 1; }
    MemoryPanel #mem-table:focus { background: $boost; }
    MemoryPanel.over #mem-table { color: $error; border-left: thick $error; }
    MemoryPanel.ok #mem-table { border-left: thick $success; }
    """

    def __init__(self, id: str | None = None):
        super().__init__(id=id)
        self.fits: bool | None = None  # None: nothing to judge yet
        self.fix: RunConfig | None = None
        self.advice = ""  # what to change, when it does not fit
        self.estimate: memory.MemoryEstimate | None = None
        self.summary = ""  # the verdict in one line: the form keeps it in view beside every field

    def compose(self) -> ComposeResult:
        with Horizontal(classes="row"):
            yield Label("memory budget", classes="name")
            yield Input("", placeholder="device's memory", id="mem-budget", compact=True)
            yield Static("e.g. 80GiB; blank = what train checks (GPU memory, or the RAM available now)", classes="help")
        yield MemoryTable("", id="mem-table", markup=False)

    def budget(self, device_name: str) -> tuple[int | None, str]:
        """The budget typed in, else what `train` checks against (engine.device.budget)."""
        text = self.query_one("#mem-budget", Input).value.strip()
        if text:
            return parse_bytes(text), "budget given"
        from engine.api import device

        return device.budget(device.kind(device_name))

    def waiting(self) -> None:
        """Before the device is known (torch still loading): nothing to judge yet."""
        self.fits, self.fix, self.estimate, self.advice = None, None, None, ""
        self.summary = "memory: checking this machine"
        self.set_class(False, "over").set_class(False, "ok")
        self.query_one("#mem-table", Static).update("(checking this machine: the estimate appears once torch has loaded)")

    @staticmethod
    def fix_text(fix: RunConfig) -> str:
        t = fix.train
        ckpt = "grad checkpointing on, " if fix.model.grad_checkpointing else ""
        return f"{ckpt}micro-batch {t.batch_size} x grad accum {t.grad_accum} (same sequences per step)"

    def _find_fix(self, config: RunConfig, total: int) -> RunConfig | None:
        """A smaller micro-batch; failing that, grad checkpointing (with the largest micro-batch
        that then fits)."""
        from engine.api import memory

        fix = memory.suggest_fit(config, total)
        if fix is not None or config.model.grad_checkpointing:
            return fix
        ckpt = config.model_copy(update={"model": config.model.model_copy(update={"grad_checkpointing": True})})
        return ckpt if memory.estimate(ckpt).fits(total) else memory.suggest_fit(ckpt, total)

    def show(self, config: RunConfig | None, device: str = "auto") -> None:
        from engine.api import memory

        table = self.query_one("#mem-table", Static)
        self.fix, self.estimate, self.advice = None, None, ""
        if config is None:
            self.fits = None
            self.summary = "memory: no estimate until the fields marked in red are fixed"
            self.set_class(False, "over").set_class(False, "ok")
            table.update("(fix the fields marked in red to see the estimate)")
            return
        try:
            total, source = self.budget(device)
        except UserError as err:
            self.fits = False
            self.summary = f"memory budget: {err}"
            self.set_class(True, "over").set_class(False, "ok")
            table.update(str(err))
            return
        est = memory.estimate(config)
        self.estimate = est
        self.fits = None if total is None else est.fits(total)
        text = format_table(est, total)
        if self.fits is False:
            assert total is not None
            self.fix = self._find_fix(config, total)
            if self.fix is not None:
                self.advice = f"press F4 for {self.fix_text(self.fix)}, or raise the memory budget"
            else:
                self.advice = (
                    "even micro-batch 1" + ("" if config.model.grad_checkpointing else " with grad checkpointing")
                    + " does not fit: pick a smaller preset, a shorter block size, or a larger memory budget"
                )  # fmt: skip
            text += "\n" + self.advice
        self.summary = f"memory: {verdict(est, total)}" + (f"; {self.advice}" if self.advice else "")
        self.set_class(self.fits is False, "over").set_class(self.fits is True, "ok")
        table.update(f"[{source}]\n{text}")
