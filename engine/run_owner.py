"""One owner for a run's life: the writer lock, the event sinks, the requests and the segments.

    owner = RunWriter(run_dir, sinks, control)   # engine.start makes it, then locks or creates
    owner.run(trainer)                            # segment after segment, until the run ends

A Trainer sets up and trains one segment; its segment ends with an `Ending` (why it stopped,
the next config for a live toggle). The owner acts on it: the run finishes, or the next
segment starts from the checkpoint just saved, under the same lock and into the same sinks,
so no other writer slips in between. Requests reach the trainer through the owner's `take`:
this process's Control and, on rank 0, the run directory's mailbox (engine/control.py); a
mailbox request older than this owner was left for a writer that is gone, and is dropped.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from engine import distributed, rundir
from engine import events as ev
from engine.control import Control, Mailbox, Request

if TYPE_CHECKING:
    from engine.config import RunConfig


@dataclasses.dataclass
class Ending:
    """How a segment ended: "completed", "stopped", or "toggle" with the next segment's config
    and the toggle requests it applies (acknowledged once that segment opens)."""

    reason: str
    next_config: RunConfig | None = None
    applied: list[Request] = dataclasses.field(default_factory=list)


class Trainer(Protocol):
    """What the owner asks of a segment (engine.trainer.Trainer)."""

    config: RunConfig
    resume: bool
    step: int

    def setup(self) -> None: ...
    def train(self, why: str, applied: Sequence[Request] = ()) -> Ending: ...
    def close(self) -> None: ...


class RunWriter:
    """Holds the run directory for one process (rank 0 writes; other ranks only take requests)."""

    def __init__(
        self, run_dir: Path, sinks: Sequence[ev.Sink] = (), control: Control | None = None,
        next_segment: Callable[[RunWriter, RunConfig, type], Trainer] | None = None,
    ) -> None:
        """`next_segment`: how a live toggle's next segment is made (engine.start passes its own
        start(), resuming under this owner)."""
        self.run_dir = Path(run_dir)
        self.next_segment = next_segment
        self.sinks: list[ev.Sink] = list(sinks)  # the run's JSONL joins once the first set-up succeeds
        self.control = control or Control()
        self.dist = distributed.current()
        self.mailbox = Mailbox(self.run_dir) if self.dist.is_main else None
        self.since = time.time()  # mailbox requests older than this were asked of a previous writer
        self._logging = False
        self._log: ev.JsonlSink | None = None
        self._log_id: tuple[int, int] | None = None  # the events file this run appends to
        self._made: bool | None = None  # a new run: whether create() made its directory

    # ------------------------------------------------------------------ the lock

    def lock(self) -> None:
        """An existing run: one writer; a second resume is refused before anything is read."""
        if self.dist.is_main:
            rundir.lock(self.run_dir)

    def create(self, config: RunConfig, tokenizer: str | None) -> None:
        """A new run: its directory claimed (locked) and its config written."""
        if self.dist.is_main:
            self._made = rundir.create(self.run_dir, config, tokenizer)

    def discard_new(self) -> None:
        """A new run refused before its first step: what create() wrote goes (rundir.discard_new),
        so the refusal leaves the file system as it was. A run with a log, or resumed, keeps all."""
        if self.dist.is_main and self._made is not None and not self._logging:
            rundir.discard_new(self.run_dir, self._made)
            self._made = None

    def release(self) -> None:
        if self.dist.is_main:
            rundir.release_writer(self.run_dir)

    # ------------------------------------------------------------------ events and requests

    def emit(self, event: Any) -> None:
        if self.dist.is_main:
            for sink in self.sinks:
                sink.emit(event)

    def take(self, defer: tuple[str, ...] = ()) -> list[Request]:
        """The requests asked since the last step boundary, the same on every rank; mailbox
        requests of a kind in `defer` wait in the mailbox (Mailbox.take)."""
        local = self.control.take()
        if self.mailbox is not None:
            for r in self.mailbox.take(defer):
                if r.problem is None and r.time < self.since:
                    asked = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.time))
                    r = dataclasses.replace(r, problem=f"stale: asked at {asked}, before this run's writer started")
                local.append(r)
        return distributed.agree(local, self.dist)

    def _open_log(self, trainer: Trainer) -> None:
        """After a set-up succeeded: the run's own record (writer.pid, events.jsonl, config.toml)."""
        if not self.dist.is_main:
            return
        if not self._logging:
            self._log = ev.JsonlSink(self.run_dir / rundir.EVENTS)
            self._log_id = _file_id(self.run_dir / rundir.EVENTS)
            self.sinks.insert(0, self._log)
            rundir.claim_writer(self.run_dir)  # a kill -9 leaves it behind: attach sees a dead pid
            self._logging = True
        if trainer.resume:
            rundir.write_config(self.run_dir, trainer.config)  # flags given at resume (or a toggle) are kept

    def reopen_log_if_moved(self) -> bool:
        """events.jsonl is no longer the file this run appends to (moved, deleted, replaced):
        start a new one at the same name, so the log goes on where readers look. True if so."""
        if not (self.dist.is_main and self._logging):
            return False
        path = self.run_dir / rundir.EVENTS
        if _file_id(path) == self._log_id:
            return False
        try:
            log = ev.JsonlSink(path)
        except OSError:
            return False  # the directory itself is going: the trainer's own check words it
        self.sinks[self.sinks.index(self._log)] = log
        self._log.close()
        self._log, self._log_id = log, _file_id(path)
        return True

    # ------------------------------------------------------------------ the segments

    def run(self, trainer: Trainer) -> str:
        """Train segment after segment; returns how the run ended ("completed" or "stopped")."""
        why, applied = ("resume" if trainer.resume else "start"), []
        try:
            while True:
                try:
                    trainer.setup()
                except BaseException as err:
                    trainer.close()  # bad input found in set-up: nothing is written to the run
                    self.discard_new()  # a new run's first set-up: its directory goes too
                    self._drop(applied, trainer.step, f"the new segment could not start: {err}")
                    if self._logging:  # a later segment's set-up: the run's log says how it ended
                        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
                        self.emit(ev.RunFailed(step=trainer.step, error=f"{type(err).__name__}: {first}"))
                    raise
                self._open_log(trainer)
                ending = trainer.train(why, applied)
                if ending.reason != "toggle":
                    return ending.reason
                kind, step = type(trainer), trainer.step
                del trainer  # its model and optimizer go before the next segment's are built
                gc.collect()
                _reset_compiled()
                _empty_device_cache()
                applied = ending.applied
                try:
                    if self.next_segment is None or ending.next_config is None:
                        raise RuntimeError("a live toggle needs a run started by engine.start")
                    trainer = self.next_segment(self, ending.next_config, kind)
                except BaseException as err:
                    self._drop(applied, step, f"the new segment could not start: {err}")
                    raise
                why = "toggle"
        finally:
            self.release()
            for sink in self.sinks:
                sink.close()

    def _drop(self, requests: list[Request], step: int, reason: str) -> None:
        for r in requests:
            self.emit(ev.RequestAck(id=r.id, kind=r.kind, status="dropped", step=step, reason=reason))


def _reset_compiled() -> None:
    """The old segment's compiled graphs go (engine.compiling.reset): repeated toggles never
    reach Dynamo's recompile limit and run eager unnoticed; the disk caches keep it cheap."""
    from engine import compiling

    compiling.reset()


def _file_id(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the file at `path` itself (a link is not followed), None if absent."""
    try:
        st = path.lstat()
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _empty_device_cache() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()
