"""The Benchmark screen: runs the speed ladder (bench.ladder) and draws it live.

The ladder runs on a worker thread (each rung is the real Trainer; torch.compile is
fine there). The UI must not slow what it measures, so nothing is posted per step: the
worker writes its latest step into a field that a slow timer shows, and the table and
the bar chart are rebuilt only when a rung lands. The status says how long the rest will
take and warns when the machine is already busy (a shared machine makes every rung slower);
notes (why a rung was skipped or partly applied) go below the table, wrapped, not in a
column cut at the screen's edge.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import Button, DataTable, Footer, Header, Input, Label, Select, Static, Switch
from textual_plotext import PlotextPlot

from bench import ladder as bench
from bench.common import default_out, load_average
from engine.api import preset_names
from engine.api import UserError
from engine.api import clock_text
from tui.screens import BACK
from tui.plain import PlainTable

TICK_S = 0.5
SHORT = {"precision": "prec", "vs baseline": "vs base", "first step s": "1st step s", "startup s": "start s"}  # fits 120 columns
BUSY_LOAD = 0.5  # a 1-minute load average above this share of the CPUs before the ladder: shared


def sharing_warning(app_runs: int = 0, process_runs: int = 0) -> str | None:
    """Why the ladder's timings would be slower than this machine can do, or None.
    `app_runs`: live runs on this app's thread; `process_runs`: live runs this app opened
    that train in their own process (launched with F5, or attached)."""
    if app_runs:
        return "a run is training in this app: the ladder shares the machine with it, its timings will be slower"
    if process_runs:
        return ("a run this app follows is training in its own process on this machine: the ladder shares "
                "the machine with it, its timings will be slower")  # fmt: skip
    try:
        one = os.getloadavg()[0]
    except (OSError, AttributeError):
        return None
    if one < BUSY_LOAD * (os.cpu_count() or 1):
        return None
    return f"load average {load_average()}: another run shares this machine, the timings will be slower and noisier"


class BenchmarkScreen(Screen):
    """Pick a preset and a step count, run the ladder, watch the table and bars fill in."""

    BINDINGS = [
        Binding("r", "run", "Run ladder"),
        Binding("s", "stop", "Stop"),
        BACK,
    ]
    DEFAULT_CSS = """
    BenchmarkScreen #bench-form { height: 3; padding: 0 1; }
    BenchmarkScreen #bench-form Label { height: 3; content-align: left middle; padding: 0 1 0 0; }
    BenchmarkScreen #bench-preset { width: 18; }
    BenchmarkScreen #bench-compile { width: 8; padding: 0 1; }
    BenchmarkScreen #bench-run { min-width: 9; width: auto; }  /* whole at 80 columns */
    BenchmarkScreen #bench-steps { width: 8; }
    BenchmarkScreen #bench-form Label.gap { padding: 0 1 0 1; }
    BenchmarkScreen #bench-status { height: 3; padding: 0 1; background: $boost; }
    BenchmarkScreen #bench-table { height: auto; max-height: 14; }
    BenchmarkScreen #bench-notes { height: auto; max-height: 8; padding: 0 1; color: $text-muted; }
    BenchmarkScreen #bench-chart { height: 1fr; min-height: 10; }
    """

    def __init__(self, config: bench.BenchConfig | None = None, out: Path | None = None):
        super().__init__()
        self.config = config or bench.BenchConfig()
        self.out = out
        self.result: bench.LadderResult | None = None
        self.rungs: list[bench.RungResult] = []
        self.error: str | None = None
        self.running = False
        self._stop = threading.Event()
        self._live: tuple[str, int, float] | None = None  # (rung, step, s/step), written by the worker
        self._thread: threading.Thread | None = None
        self._drawn = -1
        self.out_used: Path | None = None
        self.warning: str | None = None  # the machine looked shared when the ladder started
        self._to_run: list[str] = []  # the rungs that will run here (the plan), for the ETA
        self._started = 0.0
        self._rung_started = 0.0

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="bench-form"):
            yield Label("preset")
            names = preset_names()
            value = self.config.preset if self.config.preset in names else names[0]
            yield Select([(n, n) for n in names], value=value, allow_blank=False, id="bench-preset")
            yield Label("steps", classes="gap")  # timed steps per rung
            yield Input(str(self.config.steps), id="bench-steps", type="integer")
            yield Label("compile", classes="gap")
            on = "compile" not in self.config.skip
            yield Switch(on, id="bench-compile")
            yield Label("on " if on else "off", id="bench-compile-state")  # in words, not a bare box
            yield Button("Run [r]", id="bench-run", variant="primary")
        yield Static("r: run the ladder (each rung adds one optimization); s: stop; esc: back",
                     id="bench-status", markup=False)  # fmt: skip
        yield PlainTable(id="bench-table", zebra_stripes=True)
        yield Static("", id="bench-notes", markup=False)
        yield PlotextPlot(id="bench-chart")
        yield Footer()

    def on_switch_changed(self, event: Switch.Changed) -> None:
        if event.switch.id == "bench-compile":
            self.query_one("#bench-compile-state", Label).update("on " if event.value else "off")

    def on_mount(self) -> None:
        self.title = "gpt2-tui - speed ladder"
        table = self.query_one("#bench-table", DataTable)
        header = bench.table_rows(bench.LadderResult(preset=""))[0][:-1]  # notes: below the table
        table.add_columns(*(SHORT.get(h, h) for h in header))
        self.set_interval(TICK_S, self.tick)

    # ----------------------------------------------------------------- running

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "bench-run":
            self.action_run()

    def _form_config(self) -> bench.BenchConfig:
        steps_text = self.query_one("#bench-steps", Input).value.strip()
        if not steps_text.isdigit() or int(steps_text) < 1:
            raise UserError(f"timed steps must be a whole number >= 1 (got {steps_text!r})")
        skip = [s for s in self.config.skip if s != "compile"]
        if not self.query_one("#bench-compile", Switch).value:
            skip.append("compile")
        preset = str(self.query_one("#bench-preset", Select).value)
        return self.config.model_copy(update={"preset": preset, "steps": int(steps_text), "skip": skip})

    def action_run(self) -> None:
        if self.running:
            self.notify("the ladder is already running; s stops it", severity="warning")
            return
        try:
            config = self._form_config()
        except UserError as err:
            self.notify(str(err), severity="error")
            return
        out = self.out or default_out(config.preset)
        self.config, self.out_used = config, out
        self.rungs, self.result, self.error, self._live = [], None, None, None
        self._stop.clear()
        live = [s for s in getattr(self.app, "sessions", []) if s.alive()]
        in_app = [s for s in live if getattr(s, "thread", None) is not None]
        self.warning = sharing_warning(len(in_app), len(live) - len(in_app))
        self._to_run = self._planned(config)
        self._started = self._rung_started = time.monotonic()
        self.running = True
        self._drawn = -1
        self._thread = threading.Thread(target=self._work, args=(config, out), name="speed-ladder", daemon=True)
        self._thread.start()
        self.tick()

    def _work(self, config: bench.BenchConfig, out: Path) -> None:
        def on_step(rung: str, e: Any) -> None:
            self._live = (rung, e.step, e.step_time_s)

        def on_rung(r: bench.RungResult) -> None:
            self.rungs.append(r.model_copy(deep=True))
            self._rung_started = time.monotonic()

        try:
            self.result = bench.run_ladder(config, out, stop=self._stop, on_step=on_step, on_rung=on_rung,
                                           command=f"TUI Benchmark screen: {config.model_dump_json()}")  # fmt: skip
        except UserError as err:
            self.error = str(err)
        except Exception as err:  # shown on screen, never a crash of the app
            self.error = f"{type(err).__name__}: {err}"
        finally:
            self.running = False

    def _planned(self, config: bench.BenchConfig) -> list[str]:
        """The rungs that will run on this device (skips are known up front)."""
        try:
            from engine.api import pick

            device = pick(config.device)
            return [p.spec.name for p in bench.plan(config, device, config.vocab_size or bench.GPT2_VOCAB) if p.overrides]
        except Exception:  # a bad device or --skip: the ladder itself says so
            return [r.name for r in bench.LADDER if r.name not in config.skip]

    def eta(self) -> float | None:
        """Seconds left: the current rung's steps at its live pace, then each rung still to
        run as long as the rungs so far took (or the current pace while none has landed)."""
        if not self.running or self._live is None:
            return None
        rung, step, s = self._live
        total = self.config.warmup + self.config.steps
        landed = [r.name for r in self.rungs]
        left = [n for n in self._to_run if n not in landed and n != rung]
        ran = [r for r in self.rungs if r.status == "ran"]
        per_rung = (self._rung_started - self._started) / len(ran) if ran else total * s
        return max(0, total - step) * s + len(left) * per_rung

    def action_stop(self) -> None:
        if self.running:
            self._stop.set()
            self.notify("stopping the ladder at the next step boundary")

    def action_back(self) -> None:
        self._stop.set()
        self.app.pop_screen()

    def on_unmount(self) -> None:
        self._stop.set()

    # ----------------------------------------------------------------- drawing

    def status_line(self) -> str:
        if self.error:
            return f"error: {self.error}"
        total = self.config.warmup + self.config.steps
        warning = f"\nwarning: {self.warning}" if self.warning else ""
        if self.running:
            live = ""
            if self._live is not None:
                rung, step, s = self._live
                eta = self.eta()
                live = f"  {rung}: step {step}/{total}, {1000 * s:.1f} ms/step" + (f"  ETA {clock_text(eta)}" if eta is not None else "")
            stopping = "stopping at the next step boundary: " if self._stop.is_set() else ""
            return f"{stopping}running the ladder on {self.config.preset}: {len(self.rungs)}/{len(bench.LADDER)} rungs done{live}{warning}"
        if self.result is not None:
            ran = sum(r.status == "ran" for r in self.rungs)
            if self._stop.is_set():
                what = f"{ran} rung(s) measured" if ran else "nothing measured (no rung finished)"
                return f"stopped: {what}; tables in {self.out_used}{warning}"
            return f"done: {ran} of {len(self.rungs)} rungs ran; tables in {self.out_used}{warning}"
        idle = "r: run the ladder (each rung adds one optimization); s: stop; esc: back"
        return idle + (f"\nwarning: {w}" if (w := sharing_warning()) else "")

    def tick(self) -> None:
        self.query_one("#bench-status", Static).update(self.status_line())
        if len(self.rungs) != self._drawn:
            self._drawn = len(self.rungs)
            self._draw_table()
            self._draw_chart()

    def _draw_table(self) -> None:
        table = self.query_one("#bench-table", DataTable)
        table.clear()
        partial = bench.LadderResult(preset=self.config.preset, rungs=list(self.rungs))
        notes = []
        for row in bench.table_rows(partial)[1:]:
            table.add_row(*row[:-1])
            if row[-1]:
                notes.append(f"{row[0]}: {row[-1]}")
        self.query_one("#bench-notes", Static).update("\n".join(notes))

    def _draw_chart(self) -> None:
        chart = self.query_one("#bench-chart", PlotextPlot)
        plt = chart.plt
        plt.clear_data()
        plt.clear_figure()
        ran = [r for r in self.rungs if r.status == "ran" and r.tokens_per_s]
        if ran:
            plt.bar([r.name for r in ran], [r.tokens_per_s for r in ran], orientation="horizontal", width=0.5)
        plt.title("tokens/s per rung (higher is faster)")
        chart.refresh()


def open_benchmark() -> BenchmarkScreen:
    """The factory the app's EXTRA_SCREENS entry calls."""
    return BenchmarkScreen()

