"""`--log tensorboard|wandb|csv`: event sinks that copy what the dashboard shows elsewhere.

The run's events.jsonl stays the source of truth; these sinks only translate the same
events (engine/events.py) for tools people already use. TensorBoard and W&B are optional
extras, imported only by the sink that was asked for; a missing one is refused in one line
(with its pip command) by `check`, before the run writes anything.
"""

from __future__ import annotations

import csv
import importlib
import io
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine import files, rundir
from engine import events as ev
from engine import text as words
from engine.config import LOGGERS  # the setting train.log (--log) names them once
from engine.errors import UserError

_PACKAGE = {"tensorboard": "tensorboard", "wandb": "wandb"}  # logger -> the module it needs
CSV_FILE = rundir.METRICS_CSV  # named in rundir.WRITTEN: a link planted there is refused before the run writes
TB_DIR = rundir.TENSORBOARD
CSV_COLUMNS = (
    "time", "event", "step", "loss", "val_loss", "lr", "grad_norm", "step_time_s", "tokens_per_s",
    "mfu", "mem_bytes", "tokens", "text",
)


def check(names: Sequence[str]) -> list[str]:
    """The loggers asked for, validated (known names, packages installed), deduplicated in
    order. Call it before the run directory is created: a refusal writes nothing."""
    out: list[str] = []
    for name in names:
        if name not in LOGGERS:
            raise UserError(f"--log {name}: unknown logger; choose from {', '.join(LOGGERS)}")
        module = _PACKAGE.get(name)
        if module is not None:
            try:
                importlib.import_module(module)
            except ImportError:
                raise UserError(f"--log {name} needs the {module} package; pip install gpt2-tui[{name}]") from None
        if name == "wandb":
            _wandb_can_start()
        if name not in out:
            out.append(name)
    return out


def _wandb_can_start() -> None:
    """W&B online needs a key (WANDB_API_KEY, or `wandb login`'s line in ~/.netrc); without one
    `wandb.init` raises mid-set-up, after the run directory is written. Refused here instead;
    offline or disabled runs need none."""
    if os.environ.get("WANDB_MODE", "").lower() in ("offline", "disabled", "dryrun") or os.environ.get("WANDB_API_KEY"):
        return
    from urllib.parse import urlparse

    host = urlparse(os.environ.get("WANDB_BASE_URL", "")).hostname or "api.wandb.ai"
    netrc = Path(os.environ.get("NETRC") or Path.home() / ".netrc")
    try:  # the user's own file (a dotfile manager's link is fine), read bounded
        logged_in = host in files.read_text(netrc, 1 << 20, follow_links=True)  # `wandb login` writes its host there
    except (OSError, UnicodeDecodeError, UserError):
        logged_in = False
    if not logged_in:
        raise UserError("--log wandb: no W&B API key here; run `wandb login`, set WANDB_API_KEY, or set "
                        "WANDB_MODE=offline to log to the run directory only")  # fmt: skip


def make_sinks(names: Sequence[str], run_dir: Path) -> list[ev.Sink]:
    """One sink per logger, writing in (or, for W&B, beside) `run_dir`."""
    sinks: list[ev.Sink] = []
    for name in check(names):
        sinks.append({"tensorboard": TensorBoardSink, "wandb": WandbSink, "csv": CsvSink}[name](Path(run_dir)))
    return sinks


def _segment_text(e: ev.Segment) -> str:
    switches = ", ".join(f"{words.short(k)} {words.value_text(v)}" for k, v in e.switches.items())
    changed = words.change_text(e.changed)
    return f"{e.reason} at step {e.step}: {changed or switches}"


def _scalars(e: ev.Step) -> dict[str, float]:
    """What the dashboard charts for a step, under the names both TensorBoard and W&B show."""
    out = {
        "train/loss": e.loss,
        "train/lr": e.lr,
        "train/grad_norm": e.grad_norm,
        "speed/step_time_s": e.step_time_s,
        "speed/tokens_per_s": e.tokens_per_s,
        "speed/data_time_s": e.data_time_s,
        "train/tokens": float(e.tokens),
    }
    if e.mfu is not None:
        out["speed/mfu"] = e.mfu
    if e.mem_bytes is not None:
        out["memory/peak_bytes"] = float(e.mem_bytes)
    return out


class TensorBoardSink:
    """Event files under RUN/tensorboard (`tensorboard --logdir RUN`): scalars per step and
    eval, the config and segments as text (so a toggle shows at its step)."""

    def __init__(self, run_dir: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise UserError("--log tensorboard needs the tensorboard package; pip install gpt2-tui[tensorboard]") from None
        self.path = run_dir / TB_DIR
        self._writer_class = SummaryWriter
        self._w: Any = None  # opened at the first event: the run directory exists by then

    def emit(self, e: ev._Event) -> None:
        if self._w is None:
            files.make_dir(self.path, parents=False)  # a real directory in the run's, never a planted link
            self._w = self._writer_class(log_dir=str(self.path))
        match e:
            case ev.RunStarted():
                text = "```\n" + json.dumps(e.config, indent=2) + "\n```"
                self._w.add_text("config", text, e.start_step)
                self._w.add_text("run", words.describe(e), e.start_step)
            case ev.Step():
                for key, value in _scalars(e).items():
                    self._w.add_scalar(key, value, e.step, walltime=e.time)
            case ev.Eval():
                self._w.add_scalar("val/loss", e.val_loss, e.step, walltime=e.time)
            case ev.Segment():
                self._w.add_text("segments", _segment_text(e), e.step)
            case ev.Sample():
                self._w.add_text("samples", e.text, e.step)
            case ev.Checkpoint() | ev.Warning_() | ev.RunFinished() | ev.RunFailed():
                self._w.add_text("log", words.describe(e).split("\n")[0], getattr(e, "step", None) or 0)
                self._w.flush()

    def close(self) -> None:
        if self._w is not None:
            self._w.close()


class WandbSink:
    """A W&B run. Its own env vars rule (WANDB_MODE=offline, WANDB_DIR, WANDB_PROJECT,
    WANDB_ENTITY, WANDB_API_KEY); without WANDB_DIR its files go in the run directory, and
    without WANDB_PROJECT the project is gpt2-tui. The run is named after the run directory."""

    def __init__(self, run_dir: Path) -> None:
        try:
            import wandb
        except ImportError:
            raise UserError("--log wandb needs the wandb package; pip install gpt2-tui[wandb]") from None
        self._wandb = wandb
        self._run_dir = run_dir
        self._run: Any = None

    def _start(self, config: dict[str, Any]) -> None:
        directory = os.environ.get("WANDB_DIR") or str(self._run_dir)
        files.make_dir(directory)  # the directory wandb writes in: made here, not a link
        if not os.environ.get("WANDB_DIR"):  # in the run directory: wandb's own folder made here, never a planted link
            files.make_dir(self._run_dir / rundir.WANDB, parents=False)
        self._run = self._wandb.init(
            project=os.environ.get("WANDB_PROJECT", "gpt2-tui"),
            name=self._run_dir.name,
            dir=directory,
            config=config,
            resume="allow",
            id=os.environ.get("WANDB_RUN_ID"),
            # W&B's own console lines (banners, sync notes, the run's URL) would reach the terminal
            # past engine.console's printable rule: silent, and it does not wrap stdout/stderr either
            settings=self._wandb.Settings(console="off", silent=True),
        )

    def emit(self, e: ev._Event) -> None:
        if isinstance(e, ev.RunStarted):
            if self._run is None:
                self._start(e.config)
            return
        if self._run is None:
            return
        match e:
            case ev.Step():
                self._run.log(_scalars(e), step=e.step)
            case ev.Eval():
                self._run.log({"val/loss": e.val_loss}, step=e.step)
            case ev.Segment():
                self._run.log({"segment": _segment_text(e)}, step=e.step)
            case ev.RunFinished():
                self._run.summary["best_val_loss"] = e.best_val_loss
                for key, value in e.summary.items():
                    self._run.summary[f"settled/{key}"] = value

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None


class CsvSink:
    """RUN/metrics.csv: one row per step, eval, segment and end (appended across resumes),
    for a spreadsheet or pandas."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / CSV_FILE
        self._f: Any = None  # opened at the first event: the run directory exists by then

    def _open(self) -> None:
        raw = files.open_append(self.path)  # our own plain file (files.not_own), never a FIFO's open that blocks
        new = os.fstat(raw.fileno()).st_size == 0  # the file opened, not whatever the name holds now
        self._f = io.TextIOWrapper(raw, encoding="utf-8", newline="")
        self._w = csv.DictWriter(self._f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        if new:
            self._w.writeheader()
            self._f.flush()

    def _row(self, e: ev._Event, **values: Any) -> None:
        if self._f is None:
            self._open()
        self._w.writerow({"time": f"{e.time:.3f}", "event": e.event} | values)  # type: ignore[attr-defined]
        self._f.flush()

    def emit(self, e: ev._Event) -> None:
        match e:
            case ev.Step():
                self._row(
                    e, step=e.step, loss=e.loss, lr=e.lr, grad_norm=e.grad_norm, step_time_s=e.step_time_s,
                    tokens_per_s=e.tokens_per_s, mfu="" if e.mfu is None else e.mfu,
                    mem_bytes="" if e.mem_bytes is None else e.mem_bytes, tokens=e.tokens,
                )
            case ev.Eval():
                self._row(e, step=e.step, val_loss=e.val_loss)
            case ev.Segment():
                self._row(e, step=e.step, text=_segment_text(e))
            case ev.RunFinished() | ev.RunFailed():
                self._row(e, step=e.step, text=words.describe(e).split("\n")[0])

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
