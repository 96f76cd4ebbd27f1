"""The live dashboard of one run: status, charts, checkpoints, samples, log.

Everything on it is drawn from a RunState at a slow, adaptive rate: events only update
the state (cheap); a timer redraws what changed and is visible. The redraw interval
grows when drawing gets expensive, so the UI thread never takes more than a small share
of the time the trainer needs (the GIL is shared with an in-process run).

The footer offers only what works: p/s/q while the run can be steered from here (this
app's run, or any run of this user on this host, by signals: tui/session.py), the status
line naming whom they reach or why the run is watch-only; once the run is over, q asks
what next (tui/screens/run_end.py).
"""

from __future__ import annotations

import time
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, RichLog, Static, TabbedContent, TabPane

from engine.api import rundir
from engine.api import build
from engine.api import UserError
from engine.api import change_text, clock_text, contention_text, describe, human, printable, shown
from tui.models.runstate import X_AXES, RunState, XAxis
from tui.session import RunSession
from tui.widgets.charts import Line, MetricChart
from tui.widgets.gpu_panel import GpuPanel
from tui.widgets.segments import SegmentTable
from tui.plain import PlainTable

MIN_INTERVAL = 0.5  # s between redraws: at most 2 Hz
MAX_INTERVAL = 10.0
TOAST_WITHIN_S = 60.0  # a toggle's segment event this recent is news (older: an attached run's history)
LIVENESS_S = 1.0  # s between looks at whether a tailed run's writer still lives (whatever the redraw rate)
UI_SHARE = 0.03  # aim: the UI thread busy (GIL held, a core taken) at most this share of the time


def _tokens(n: float) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.1f}K"


SPINNER = "|/-\\"
PHASES = {  # long phases no step report shows: a spinner, the seconds so far, and what is going on
    "building dataset": "first run: the default dataset is built once",
    "compiling": "torch.compile warm-up: the first step compiles the model",
    "stopping": "finishing the step, then eval + sample + checkpoint",
}


def state_label(state: RunState, now: float | None = None) -> str:
    label = state.state.upper()
    if state.state in PHASES:
        secs = state.phase_seconds(now) or 0.0
        note = PHASES[state.state]
        what, fraction = state.building_step or ("", None)
        if state.state == "building dataset" and what:  # what the build does now, how far
            note += f": {what}" + ("" if fraction is None else f" {fraction:.0%}")
        label += f" {SPINNER[int(secs) % len(SPINNER)]} {secs:.0f} s ({note})"
    return label


def status_text(state: RunState, session: RunSession, now: float | None = None,
                steering: tuple[bool, str] | None = None) -> str:  # fmt: skip
    """Two status lines (also what tests and the tmux check read; wrapped, not cut, where the
    terminal is narrower). `steering`: the session's (computed here when not given)."""
    total = state.max_steps
    last = state.last_step
    settled = state.settled_step_time()
    speed = "-"
    if last is not None:
        speed = f"{1000 * last.step_time_s:.1f} ms/step ({last.tokens_per_s:,.0f} tok/s)"
        if settled:
            speed += f" vs settled {1000 * settled:.1f} ms"
        if busy := contention_text(state.contention(), short=True):  # timed on a busy machine: say so
            speed += f" [{busy}]"
        ranks = last.rank_step_times
        if ranks and len(ranks) > 1:  # step_time_s is already the slowest rank's
            slow = max(range(len(ranks)), key=ranks.__getitem__)
            speed += f"  {len(ranks)} ranks: slowest rank {slow} ({1000 * min(ranks):.1f}-{1000 * max(ranks):.1f} ms)"
    best = "-" if state.best_val_loss is None else f"{state.best_val_loss:.4f}"
    mfu = "unknown" if last is None or last.mfu is None else f"{100 * last.mfu:.1f}%"
    where = state.started.device_name if state.started else "-"
    if state.started and state.started.attention:  # the SDPA kernel that runs (on CUDA: measured fastest)
        where += f", attention {state.started.attention}"
    label = state_label(state, now)
    if state.gone:  # the one liveness rule, looked at as the events are read (RunSession.poll)
        label = "WRITER GONE (died without finishing; --resume it)"
    line1 = (
        f"{label}  step {state.step}/{total or '?'}  ETA {clock_text(state.eta())}  "
        f"elapsed {clock_text(state.elapsed(now))}  tokens {_tokens(state.tokens)}  best val {best}"
    ) if state.started else label
    if state.started and (tuning := state.tune_status()):
        line1 += f"  {tuning}"
    steer = ""
    if state.live and session.control is None:
        ok, who = steering or session.steering()
        steer = f", steering {who}" if ok else f", watch only: {who}"
    line2 = f"{speed}  MFU {mfu}  on {where}  [{session.label}{steer}]"  # the run dir: in the title
    if state.failed:
        line2 = f"FAILED: {state.failed.error}"
    return f"{shown(line1)}\n{shown(line2)}"  # device name, error: read from the run's files


def tune_table(state: RunState) -> str:
    """The tune's trials so far, one line each: what it changed, its warm-up, its settled step
    time, how it compares with the start, whether the machine was busy; '' without a tune."""
    if state.tune_plan is None:
        return ""
    head = state.tune_status() or "tuning"
    rows = [f"{head}: {len(state.tune_plan.trials)} trials planned, budget {state.tune_plan.budget}",
            f"{'#':>2}  {'trial':<28} {'warm-up':>8} {'ms/step':>9} {'vs start':>8}  status"]  # fmt: skip
    for i in sorted(state.tune_trials):
        t = state.tune_trials[i]
        ms = "-" if t.settled_step_time_s is None else f"{1000 * t.settled_step_time_s:.1f}"
        warm = "-" if t.warmup_s is None else f"{t.warmup_s:.1f} s"
        vs = "-" if t.vs_start is None else f"{t.vs_start:.2f}x"
        status = t.status + (" !" if t.status == "contended" else "") + (f": {t.reason}" if t.reason else "")
        rows.append(f"{t.index:>2}  {t.label[:28]:<28} {warm:>8} {ms:>9} {vs:>8}  {status}")
    if state.tune_done is not None:
        rows.append(describe(state.tune_done))
    return "\n".join(printable(r) for r in rows)  # labels and reasons come from the run's files


def checkpoint_due_text(state: RunState, now: float | None = None) -> str:
    """When the next checkpoint comes (the first one especially: nothing is saved before it)."""
    due = state.next_checkpoint()
    if due is None:
        return "" if state.live else f"run {state.state}: no more checkpoints"
    every = state.started.setting("train.ckpt_interval")  # next_checkpoint found it
    settled = state.settled_step_time()
    eta = f", in about {clock_text((due - state.step) * settled)}" if settled else ""
    which = "next" if state.checkpoints else "first"
    return f"{which} checkpoint due at step {due}{eta} (every {every} steps, at the end and on stop; s saves one now)"


# the dashboard's tabs in order: `t` steps through them, 1-5 jump to one (the help lists both)
TABS = {"tab-charts": "Charts", "tab-ckpt": "Checkpoints", "tab-sample": "Sample", "tab-segments": "Segments",
        "tab-gpu": "GPU"}  # fmt: skip


class DashboardScreen(Screen):
    BINDINGS = [  # short labels: at 80 columns a live run's footer keeps every key shown, and
        # F7/F8/Quit (x is in the help, ?, with every key)
        Binding("p", "pause", "Pause"),
        Binding("s", "save", "Save"),
        Binding("q", "stop", "Stop"),
        Binding("q", "next", "What next"),  # once the run is over: form, resume, another run
        Binding("l", "logy", "Log-y"),
        Binding("x", "xaxis", "X-axis", show=False),
        Binding("o", "switches", "Switches"),  # the live run's optimizations (tui/screens/toggle.py)
        Binding("t", "next_tab", "Tab"),  # every tab by keyboard, wherever the focus is (over SSH: no mouse)
        *(Binding(str(i), f"show_tab('{tab}')", name, show=False) for i, (tab, name) in enumerate(TABS.items(), 1)),
        Binding("question_mark", "help", "Help", key_display="?"),
    ]

    def __init__(self, session: RunSession):
        super().__init__()
        self.session = session
        self.axis: XAxis = "step"
        self.logy = False
        self.interval = MIN_INTERVAL
        self._log_seen = 0
        self._samples_seen = 0
        self._gpu_seen = 0
        self._ckpt_key: Any = None
        self._status_key: Any = None
        self._state_seen = session.state  # a tail reset (file truncated) brings a new one
        self._steer: tuple[bool, str] = (session.control is not None, "")
        self._bindings_key: Any = None
        self._end_noted = False
        self._segments_seen = 0  # segment events turned into markers/toasts
        self._segments_drawn = -1  # the state version the segment table shows

    @property
    def state(self) -> RunState:
        return self.session.state

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("", id="status", markup=False)
        with TabbedContent(id="tabs"):
            with TabPane(TABS["tab-charts"], id="tab-charts"):
                with VerticalScroll(id="charts-scroll"):
                    # the two the product exists for, side by side on the first screen at any size
                    # from 80x24: the loss, and the step time where the compile warm-up settles
                    with Grid(id="chart-top"):
                        yield MetricChart("loss", [Line("loss", "raw", "gray"), Line("ema", "EMA", "cyan"),
                                                   Line("val", "val", "orange", scatter=True)], id="chart-loss")  # fmt: skip
                        yield MetricChart("s/step", [Line("step_time", "s/step", "yellow")], unit=" s", id="chart-steptime")
                    with Grid(id="chart-grid"):
                        yield MetricChart("tok/s", [Line("tokens_per_s", "tok/s", "blue")], id="chart-toks")
                        yield MetricChart("grad norm (pre-clip)", [Line("grad_norm", "norm", "magenta")], id="chart-norm")
                        yield MetricChart("lr", [Line("lr", "lr", "green")], id="chart-lr")
                        yield MetricChart("MFU %", [Line("mfu", "MFU", "cyan")], id="chart-mfu",
                                          unmeasured="no peak FLOP/s is known for this device")  # fmt: skip
                        yield MetricChart("memory GiB", [Line("mem", "GiB", "red")], id="chart-mem",
                                          unmeasured="no device memory counter off CUDA")  # fmt: skip
                    yield Static("", id="unmeasured", markup=False)
            with TabPane(TABS["tab-ckpt"], id="tab-ckpt"):
                yield Static("", id="ckpt-due", markup=False)
                yield PlainTable(id="ckpts", cursor_type="row", zebra_stripes=True)
            with TabPane(TABS["tab-sample"], id="tab-sample"):
                with VerticalScroll():
                    yield Static("(a short generation appears at each eval when the dataset has a tokenizer)", id="sample", markup=False)
            with TabPane(TABS["tab-segments"], id="tab-segments"):  # one row per set of switches the run trained with
                yield Static("", id="tune", markup=False)  # the tune's trials so far (--tune), when there is one
                yield SegmentTable(refresh_s=0, id="segments")
            with TabPane(TABS["tab-gpu"], id="tab-gpu"):
                with VerticalScroll():
                    yield GpuPanel(unavailable=self._gpu_unavailable(), id="gpu")
        yield RichLog(id="log", max_lines=500, wrap=True, markup=False)
        yield Footer()

    def _gpu_unavailable(self) -> str | None:
        """None when readings can come (this machine has NVML, or the run recorded some);
        else the one line the GPU tab shows instead."""
        if self.state.gpu_count:
            return None
        from engine.api import available

        ok, why = available()
        return None if ok else why

    def on_mount(self) -> None:
        self.title = f"gpt2-tui - {self.session.run_dir}"
        table = self.query_one("#ckpts", DataTable)
        table.add_columns("step", "val loss", "size", "age", "")
        self._timer = self.set_interval(MIN_INTERVAL, self.tick)
        if self.session.tail is not None:
            self.set_interval(LIVENESS_S, self._check_writer)
        self.tick()

    # ----------------------------------------------------------------- feeding

    def feed(self, events: list[Any]) -> None:
        for e in events:
            self.state.feed(e)

    def tick(self) -> None:
        """Poll a tailed run, redraw what changed, then adapt the rate: the UI thread's own
        CPU time since the last tick (plotext, layout, compositing, all of it) over the wall
        time since then is kept near UI_SHARE by stretching or shrinking the interval."""
        self.feed(self.session.poll())
        if self.state is not self._state_seen:  # the events file started over: so does the view
            self._state_seen = self.state
            self._log_seen = self._samples_seen = self._gpu_seen = self._segments_seen = 0
            self._ckpt_key = self._status_key = None
            self.query_one("#log", RichLog).clear()
            for chart in self.query(MetricChart):
                chart._drawn = None
        self._fit_top()
        self.redraw()
        cpu, wall = time.thread_time(), time.perf_counter()
        last = getattr(self, "_last_clock", None)
        self._last_clock = (cpu, wall)
        if last is None or wall - last[1] <= 0:
            return
        share = (cpu - last[0]) / (wall - last[1])
        want = self.interval * 1.5 if share > UI_SHARE else self.interval / 1.25 if share < UI_SHARE / 2 else self.interval
        want = min(MAX_INTERVAL, max(MIN_INTERVAL, want))
        if want != self.interval:
            self.interval = want
            self._timer.stop()
            self._timer = self.set_interval(self.interval, self.tick)

    def _check_writer(self) -> None:
        """A dead writer is news at once, not at the next (maybe 10 s away) redraw."""
        if self.session.writer_died():
            self.tick()

    def _fit_top(self) -> None:
        """The loss and s/step charts as tall as the charts' view (at least 10 rows): on the
        first screen at any size, the others below them (a scroll away)."""
        view = self.query_one("#charts-scroll", VerticalScroll).scrollable_content_region.height
        top = self.query_one("#chart-top", Grid)
        want = max(10, view)
        if view and top.styles.height != want:
            top.styles.height = want

    def on_resize(self) -> None:
        self.call_after_refresh(self._fit_top)

    def on_tabbed_content_tab_activated(self) -> None:
        """A tab opened shows its content at once, not at the next redraw (seconds away when slow)."""
        if self._status_key is not None:  # drawn before: not the first tab's, as the screen mounts
            self.redraw()

    def redraw(self) -> None:
        state = self.state
        key = (state.version, int(time.time()))
        if key != self._status_key:
            self._status_key = key
            if state.live and self.session.control is None:  # who p/s/q reach: looked up once a second
                self._steer = self.session.steering()
            self.query_one("#status", Static).update(status_text(state, self.session, steering=self._steer))
            self._update_bindings()
        self._note_segments()
        clip = state.grad_clip
        self.query_one("#chart-norm", MetricChart).hline = clip or None
        tabs = self.query_one("#tabs", TabbedContent)
        if tabs.active == "tab-charts":
            self._update_unmeasured()
            for chart in self.query(MetricChart):
                chart.maybe_redraw(state, self.axis, self.logy)
        elif tabs.active == "tab-ckpt":
            self._update_checkpoints()
        elif tabs.active == "tab-sample":
            self._update_sample()
        elif tabs.active == "tab-segments":
            self._update_segments()
        self._update_gpu()
        self._update_log()

    def _update_bindings(self) -> None:
        """The footer offers only what works: p/s/q while the run can be steered from
        here, q for what next once it is over. Said once when the run ends."""
        key = (self.state.live, self._steer[0])
        if key != self._bindings_key:
            self._bindings_key = key
            self.refresh_bindings()
        if not self.state.live and not self._end_noted:
            self._end_noted = True
            self.notify(f"run {self.state.state} at step {self.state.step}: q for what next "
                        "(back to the form, resume it, another run)", timeout=10)  # fmt: skip

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("pause", "save", "stop"):
            return self.state.live and self._steer[0]
        if action == "next":
            return not self.state.live
        if action == "switches":  # shown while the run is live; a watch-only run's key says why
            return self.state.live
        return True

    def _update_unmeasured(self) -> None:
        """Charts of what this device does not report (MFU without a known peak, memory
        off CUDA) give way to one line saying so, once step reports show they stay empty."""
        notes = []
        for chart in self.query(MetricChart):
            if chart.unmeasured is None:
                continue
            empty = self.state.last_step is not None and not chart.has_data(self.state)
            chart.display = not empty
            if empty:
                notes.append(f"{chart.title_text}: not measured on this device ({chart.unmeasured})")
        line = self.query_one("#unmeasured", Static)
        line.display = bool(notes)
        line.update("   ".join(notes))

    def _update_gpu(self) -> None:
        """Hand new GPU readings to the panel (it stores them; it draws on its own timer,
        only when visible)."""
        rounds = self.state.gpu_since(self._gpu_seen)
        self._gpu_seen = self.state.gpu_count
        if not rounds:
            return
        panel = self.query_one("#gpu", GpuPanel)
        if panel.unavailable is not None:
            panel.set_unavailable(None)  # an attached run recorded on a GPU box
        for samples in rounds:
            panel.add_samples(samples)

    def _update_checkpoints(self) -> None:
        rows = self.state.checkpoint_rows()
        now = time.time()
        key = (self.state.version, int(now) // 5, len(rows))
        if key == self._ckpt_key:
            return
        self._ckpt_key = key
        self.query_one("#ckpt-due", Static).update(checkpoint_due_text(self.state))
        table = self.query_one("#ckpts", DataTable)
        table.clear()
        for row, latest in rows:
            marks = " ".join(m for m, on in (("best", row.best), ("latest", latest)) if on)
            val = "-" if row.val_loss is None else f"{row.val_loss:.4f}"
            table.add_row(str(row.step), val, human(row.size_bytes), clock_text(now - row.time), marks)

    def _note_segments(self) -> None:
        """Segment starts become markers on the speed charts; a live toggle that took also
        gets a toast (not the ones in an attached run's history)."""
        new = self.state.segment_events[self._segments_seen :]
        if not new:
            return
        self._segments_seen = len(self.state.segment_events)
        markers = [(e.step, change_text(e.changed) or e.reason) for e in self.state.segment_events if e.reason != "start"]
        for chart in (self.query_one("#chart-steptime", MetricChart), self.query_one("#chart-toks", MetricChart)):
            chart.markers = markers
        for e in new:
            if e.reason == "toggle" and time.time() - e.time < TOAST_WITHIN_S:
                self.notify(describe(e), timeout=10)

    def _update_segments(self) -> None:
        if self.state.version != self._segments_drawn:
            self._segments_drawn = self.state.version
            self.query_one("#segments", SegmentTable).show_run(self.state.segments, self.state.best_val_loss)
            table = tune_table(self.state)
            tune = self.query_one("#tune", Static)
            tune.display = bool(table)
            tune.update(table)

    def _update_sample(self) -> None:
        if len(self.state.samples) != self._samples_seen:
            self._samples_seen = len(self.state.samples)
            step, text = self.state.samples[-1]
            self.query_one("#sample", Static).update(f"step {step}:\n{printable(text)}")

    def _update_log(self) -> None:
        log = self.query_one("#log", RichLog)
        lines, total = self.state.log, self.state.log_count
        new = min(total - self._log_seen, len(lines))
        for line in lines[len(lines) - new :] if new > 0 else []:
            style = {"warning": "yellow", "error": "bold red"}.get(line.level, "")
            log.write(Text(time.strftime("%H:%M:%S ", time.localtime(line.time)) + line.text, style=style))
        self._log_seen = total

    # ----------------------------------------------------------------- keys

    def action_pause(self) -> None:
        if not self._steerable("pause"):
            return
        pausing = self._steer_now(self.session.toggle_pause)
        if pausing is not None:
            self.notify("pausing at the next step boundary" if pausing else "resuming")

    def _steer_now(self, act: Any) -> Any:
        """Do it; a writer that went away since the check is a notice, not a crash."""
        try:
            return act()
        except (UserError, OSError) as err:
            self.notify(f"could not reach the run: {err}", severity="warning")
            return None

    def action_save(self) -> None:
        if self._steerable("save") and self._steer_now(lambda: self.session.save_now() or True):
            if self.state.paused:
                self.notify("saving a checkpoint now (the run stays paused)")
            else:
                self.notify("a checkpoint will be saved at the end of this step")

    def _steerable(self, what: str) -> bool:
        if not self.state.live or not self.session.alive():
            self.notify(f"the run is not running: nothing to {what}", severity="warning")
            return False
        ok, who = self.session.steering()
        if not ok:
            self.notify(f"watch only: {who}", severity="warning")
            return False
        return True

    def action_stop(self) -> None:
        from tui.screens.modals import ConfirmScreen

        if not self._steerable("stop"):
            return

        def answer(yes: bool | None) -> None:
            if yes and self._steerable("stop") and self._steer_now(lambda: self.session.request_stop() or True):
                self.notify("stopping: eval, sample and a checkpoint at the next step boundary")

        self.app.push_screen(ConfirmScreen("Stop the run? It saves a checkpoint at the next step boundary."), answer)

    def action_next(self) -> None:
        """Once the run is over: back to the form, resume it, or open another run."""
        from tui.screens.run_end import RunEndScreen, ask_and_resume, back_to_form
        from tui.screens.runs import RunsScreen

        state, run_dir = self.state, self.session.run_dir

        def answer(what: str | None) -> None:
            if what == "form":
                back_to_form(self.app, run_dir)
            elif what == "resume":
                ask_and_resume(self, run_dir, state.step, state.max_steps)
            elif what == "runs":
                self.app.push_screen(RunsScreen())

        summary = f"{run_dir}: {state.state} at step {state.step}/{state.max_steps or '?'}"
        self.app.push_screen(RunEndScreen(summary, can_resume=(run_dir / rundir.CONFIG).is_file()), answer)

    def action_switches(self) -> None:
        """The live run's switches: change them at the next step boundary (engine/run/toggle.py)."""
        from tui.screens.toggle import ToggleScreen

        if not self._steerable("toggle"):
            return
        started = self.state.started
        try:
            config = build(started.config) if started else rundir.load_config(self.session.run_dir)
        except UserError as err:
            self.notify(str(err), severity="error")
            return
        world, parallel = (started.world_size, started.parallel) if started else (1, "ddp")
        # the run's own process holds its memory: this one's when it trains here, else what it last reported
        held = None if self.session.mode == "in-process" else (self.state.mem_bytes or 0)

        def send(request: Any) -> None:  # posted: pending until the run acknowledges it
            self.session.steer(request)
            self.state.note_toggle(request.id, request.switches)

        self.app.push_screen(ToggleScreen(self.session.run_dir, config, world_size=world,
                                          sharding="fsdp" if parallel == "fsdp" else "ddp", held=held,
                                          steerable=lambda: self._steerable("toggle"), send=send,
                                          pending=self.state.pending_switches()))  # fmt: skip

    def action_logy(self) -> None:
        self.logy = not self.logy
        self.redraw()

    def action_xaxis(self) -> None:
        self.axis = X_AXES[(X_AXES.index(self.axis) + 1) % len(X_AXES)]
        self.notify(f"x-axis: {self.axis}")
        self.redraw()

    def action_next_tab(self) -> None:
        tabs = self.query_one("#tabs", TabbedContent)
        order = list(TABS)
        tabs.active = order[(order.index(tabs.active) + 1) % len(order)] if tabs.active in order else order[0]

    def action_show_tab(self, tab: str) -> None:
        self.query_one("#tabs", TabbedContent).active = tab

    def action_help(self) -> None:
        from tui.screens.modals import HelpScreen

        self.app.push_screen(HelpScreen())


__all__ = ["DashboardScreen", "status_text"]
