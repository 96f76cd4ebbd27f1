"""The setup form's memory budget: engine.memory's breakdown against the device's memory.

Red, and Launch refused, when the estimate does not fit; then `fix` holds the estimator's
suggestion (a smaller micro-batch with more accumulation, same sequences per step) that
the form applies with one key. The budget defaults to the training device's memory and
can be overridden (plan a GPU run's batch from here, or leave room for other jobs).
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Input, Label, Static

from engine import memory
from engine.config import RunConfig
from engine.errors import UserError


class MemoryPanel(Vertical):
    DEFAULT_CSS = """
    MemoryPanel { height: auto; }
    MemoryPanel #mem-table { height: auto; padding: 0 1; }
    MemoryPanel.over #mem-table { color: $error; border-left: thick $error; }
    MemoryPanel.ok #mem-table { border-left: thick $success; }
    """

    def __init__(self, id: str | None = None):
        super().__init__(id=id)
        self.fits: bool | None = None  # None: nothing to judge yet
        self.fix: RunConfig | None = None
        self.estimate: memory.MemoryEstimate | None = None

    def compose(self) -> ComposeResult:
        with Horizontal(classes="row"):
            yield Label("memory budget", classes="name")
            yield Input("", placeholder="device's memory", id="mem-budget", compact=True)
            yield Static("e.g. 80GiB; blank = what train checks (GPU memory, or the RAM available now)", classes="help")
        yield Static("", id="mem-table", markup=False)

    def budget(self, device_name: str) -> tuple[int | None, str]:
        """The budget typed in, else what `train` checks against (engine.device.budget)."""
        text = self.query_one("#mem-budget", Input).value.strip()
        if text:
            return memory.parse_bytes(text), "budget given"
        from engine import device

        return device.budget(device.kind(device_name))

    def show(self, config: RunConfig | None, device: str = "auto") -> None:
        table = self.query_one("#mem-table", Static)
        self.fix, self.estimate = None, None
        if config is None:
            self.fits = None
            self.set_class(False, "over").set_class(False, "ok")
            table.update("(fix the fields marked in red to see the estimate)")
            return
        try:
            total, source = self.budget(device)
        except UserError as err:
            self.fits = False
            self.set_class(True, "over").set_class(False, "ok")
            table.update(str(err))
            return
        est = memory.estimate(config)
        self.estimate = est
        self.fits = None if total is None else est.fits(total)
        text = memory.format_table(est, total)
        if self.fits is False:
            self.fix = memory.suggest_fit(config, total)
            if self.fix is not None:
                t = self.fix.train
                text += f"\nF4: micro-batch {t.batch_size} x grad accum {t.grad_accum} fits (same sequences per step)"
            else:
                text += "\neven micro-batch 1 does not fit: a smaller model, shorter blocks or grad checkpointing"
        self.set_class(self.fits is False, "over").set_class(self.fits is True, "ok")
        table.update(f"[{source}]\n{text}")
