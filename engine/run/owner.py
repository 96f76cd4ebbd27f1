"""A run's one owner: it opens the run, trains its segments, acts on how each ended, and
lets go.

    run = start(config, run_dir)   # checked (device, memory), data opened, directory locked
    run.run()                      # segment after segment; "completed" or "stopped"

The owner holds what lives as long as the run: the writer lock, the event sinks, the
requests (this process's Control and the run directory's mailbox) and the open dataset. A
segment (engine.train.trainer.Trainer) trains with one set of switches; it never sees its
owner: it reports events through `emit` and calls `at_boundary` between steps, where the
owner takes the requests (pause, resume, save, stop, toggle) and tells the segment to save
or to end. A segment ended for a live toggle is followed by the next one, built here from
the checkpoint just saved, under the same lock, into the same sinks, on the same data.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine import rundir
from engine import events as ev
from engine.config import RunConfig
from engine.errors import UserError
from engine.text import path_text, program
from engine.run import toggle, tune
from engine.run.preflight import open_data, preflight, pretrained
from engine.run.inbox import Inbox
from engine.run.requests import Control, Mailbox, Request
from engine.run.segments import opening, switches
from engine.train import distributed, guard
from engine.dataset import Dataset
from engine.train.trainer import ComponentsFor, Ending, Trainer, standard


def start(
    config: RunConfig,
    run_dir: Path,
    *,
    resume: bool = False,
    resume_from: str | None = None,
    sinks: Sequence[ev.Sink] = (),
    control: Control | None = None,
    force: bool = False,
    dataset: Dataset | None = None,
    components: ComponentsFor = standard,
) -> Run:
    """The one front door (CLI, TUI, launchers, measuring tools, tests): the run checked and
    opened, ready for `run()`. A `dataset` already opened by open_data (with `config` bound by
    it) is reused; the measuring tools pass `components` that never evaluate or save
    (engine.train.trainer.measuring)."""
    run = Run(run_dir, sinks, control, components)
    run.open(config, resume=resume, resume_from=resume_from, force=force, dataset=dataset)
    return run


class Run:
    """Holds the run directory for one process (rank 0 writes; other ranks only take requests)."""

    def __init__(
        self, run_dir: Path, sinks: Sequence[ev.Sink] = (), control: Control | None = None,
        components: ComponentsFor = standard,
    ) -> None:  # fmt: skip
        self.run_dir = Path(run_dir)
        self.sinks: list[ev.Sink] = list(sinks)  # the run's JSONL joins once the first set-up succeeds
        self.control = control or Control()
        self.components = components
        self.dist = distributed.current()
        self.mailbox: Mailbox | None = None
        self.config: RunConfig | None = None
        self.dataset: Dataset | None = None
        self.segment: Trainer | None = None  # the segment training now (the last one, once the run ended)
        self.tuner: tune.Tuner | None = None  # rank 0's, while the run tunes itself (--tune)
        self._began = time.monotonic()  # run() sets it again: train.max_time counts from there
        self.resume = False
        self._paused = False
        self._logging = False
        self._log: ev.JsonlSink | None = None
        self._log_id: tuple[int, int] | None = None  # the events file this run appends to
        self._made: bool | None = None  # a new run: whether create() made its directory

    # ------------------------------------------------------------------ open and release

    def open(
        self, config: RunConfig, *, resume: bool = False, resume_from: str | None = None, force: bool = False,
        dataset: Dataset | None = None,
    ) -> None:  # fmt: skip
        """Everything is checked before a byte is written (the config as preflight judged it), then
        lock (a resume: one writer) or create (a new run) the directory. A config judged by its
        front door with its data opened (engine.run.preflight: the CLI, the measuring tools) comes
        with `dataset`; any other (the app's thread, tests) is preflighted here, once. Under
        torchrun every rank opens: rank 0 names the directory and builds what is shared first."""
        if config.speed.compile:  # a new run in a process that compiled before (the app's second run)
            from engine.train import compiling

            compiling.reset()  # starts from no graphs: never at Dynamo's recompile limit, never eager unnoticed
        ctx = distributed.init(config.speed.device)  # under torchrun: join the process group
        self.dist = distributed.current()
        if ctx.enabled and not resume:  # rank 0's clock names the run directory
            self.run_dir = Path(distributed.broadcast_object(str(self.run_dir)))
            config = config.model_copy(update={"out_dir": str(self.run_dir)})
        self.mailbox = Mailbox(self.run_dir) if self.dist.is_main else None
        self.resume = resume
        if resume:
            self._lock()  # one writer: a second resume is refused before anything is read or written
            self._mark_mailbox()
        try:
            with distributed.main_first():  # rank 0 downloads --init-from weights into the Hub's cache first
                if dataset is None or not config._preflighted:  # never judged with its data: judged now
                    verdict = preflight(config, dataset=dataset or True, force=force, resume=resume)
                    config, dataset = verdict.raise_first(), verdict.dataset
                assert config._preflighted and dataset is not None, "Run.open takes a preflighted config"
                weights = pretrained(config, self.run_dir, resume)
                if not resume:
                    self._create(config, dataset.info.tokenizer)  # locked: held until the run ends
            if config.train.log and ctx.is_main:
                from engine.run import loggers

                self.sinks += loggers.make_sinks(config.train.log, self.run_dir)  # beside the console/TUI and the JSONL
            self.config, self.dataset = config, dataset
            self.segment = self._segment(config, resume, resume_from, weights.state if weights else None)
        except BaseException:
            self.discard_new()  # a new run refused after its directory was made: it goes
            self.release()
            raise

    def _lock(self) -> None:
        if self.dist.is_main:
            rundir.lock(self.run_dir)

    def _create(self, config: RunConfig, tokenizer: str | None) -> None:
        if self.dist.is_main:
            self._made = rundir.create(self.run_dir, config, tokenizer)
            self._mark_mailbox()

    def _mark_mailbox(self) -> None:
        """The writer starts (the lock just taken): what its mailbox holds now was asked of a
        writer that is gone; take() drops it as stale, whatever time its lines claim."""
        if self.mailbox is not None:
            self.mailbox.mark_start()

    def discard_new(self) -> None:
        """A new run refused before its first step: what create() wrote goes (rundir.discard_new),
        so the refusal leaves the file system as it was. A run with a log, or resumed, keeps all."""
        if self.dist.is_main and self._made is not None and not self._logging:
            rundir.discard_new(self.run_dir, self._made)
            self._made = None

    def _discard_logged(self) -> None:
        """A new run that failed before it saved anything (out of memory in its first eval or
        step): its log and the loggers' files go with what create() wrote, as for a refusal in
        set-up; nothing is left to resume. A resumed run keeps all (discard_new)."""
        if not (self.dist.is_main and self._made is not None and self._logging):
            return
        from engine import files

        ours = [sink for sink in self.sinks if sink is self._log or type(sink).__module__ == "engine.run.loggers"]
        for sink in ours:  # the console's and the app's sinks stay: they say how the run ended
            sink.close()
            self.sinks.remove(sink)
        self._log = None

        for name in (rundir.EVENTS, rundir.METRICS_CSV):
            files.remove(self.run_dir / name)
        for name in (rundir.TENSORBOARD, rundir.WANDB):
            if (self.run_dir / name).is_dir():
                files.remove_tree(self.run_dir / name)
        self._logging = False
        self.discard_new()

    def release(self) -> None:
        if self.dist.is_main:
            rundir.release_writer(self.run_dir)

    # ------------------------------------------------------------------ the segments

    def _segment(
        self, config: RunConfig, resume: bool, resume_from: str | None = None, init_state: Any = None
    ) -> Trainer:
        tokenizer = self.dataset.info.tokenizer if self.dataset else None
        return Trainer(
            config, self.run_dir, self.dataset, emit=self.emit, boundary=self.at_boundary, resume=resume,
            resume_from=resume_from, init_state=init_state, tokenizer=_tokenizer_loader(tokenizer),
            components=self.components,
        )  # fmt: skip

    def run(self) -> str:
        """Train segment after segment; returns how the run ended ("completed" or "stopped")."""
        why, applied = ("resume" if self.resume else "start"), []
        self._began = time.monotonic()  # train.max_time counts from here
        try:
            self._tuner_at_start()
            while True:
                segment = self.segment
                try:
                    segment.setup()
                except BaseException as err:
                    segment.close()  # bad input found in set-up: nothing is written to the run
                    self.discard_new()  # a new run's first set-up: its directory goes too
                    self.inbox.drop(applied, segment.step, f"the new segment could not start: {err}")
                    if self._logging:  # a later segment's set-up: the run's log says how it ended
                        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
                        self.emit(ev.RunFailed(step=segment.step, error=f"{type(err).__name__}: {first}"))
                    raise
                self._open_log(segment)
                self._open_segment(segment, why, applied)
                try:
                    ending = segment.train()
                except guard.OutOfMemory:
                    if self.tuner is not None:  # a trial that did not fit is not tried again on resume
                        self.tuner.failed(f"out of memory at step {segment.step} (the estimate said it fits)")
                    if segment.ckpts.latest() is None:  # a new run out of memory before its first checkpoint
                        self._discard_logged()
                    raise
                if ending.reason != "toggle":
                    return ending.reason
                applied = ending.applied
                try:
                    self._hand_over(ending.next_config)
                except BaseException as err:
                    self.inbox.drop(applied, segment.step, f"the new segment could not start: {err}")
                    raise
                why = "toggle"
        finally:
            self.release()
            for sink in self.sinks:
                sink.close()

    def _tuner_at_start(self) -> None:
        """Rank 0's tuner: a tune the run was in when it stopped goes on (its tune.json), a new one
        starts when the run asks for it (speed.tune) and has not tuned yet."""
        if not self.dist.is_main or self.config is None:
            return
        state, why = tune.load_state(self.run_dir) if self.resume else (None, None)
        if why is not None:
            self.emit(ev.Warning_(message=f"the tune cannot go on: {why}"
                                          + ("; it starts anew" if self.config.speed.tune else "")))  # fmt: skip
        if state is not None and state.done:
            return  # tuned already: the run keeps the switches it chose
        if state is not None or self.config.speed.tune:
            self._start_tuner(state)

    def _start_tuner(self, state: tune.State | None) -> None:
        if self.tuner is not None and self.tuner in self.sinks:
            self.sinks.remove(self.tuner)
        self.tuner = tune.Tuner(self.run_dir, state)
        self.sinks.append(self.tuner)  # it reads its trials' step reports from the run's events

    def _open_segment(self, segment: Trainer, why: str, applied: Sequence[Request]) -> None:
        """The segment's first events: what runs (run_started), which switches and why (segment),
        the toggles that made it (acknowledged now that it runs), and any toggle lost before it."""
        self.emit(segment.started())
        self.emit(opening(segment.config, segment.step, segment.resumed.config, why, segment.init_from))
        for r in applied:
            self.inbox.ack(r, "applied", segment.step)
        self.inbox.lost_toggles(segment.resumed.pending_toggles, switches(segment.config), applied, segment.step)

    def _hand_over(self, config: RunConfig) -> None:
        """A live toggle: the old segment goes (its model, optimizer and compiled graphs) before
        the next is built on the same data (reopened only when a toggle changes how it is held)."""
        step = self.segment.step
        self.segment = None
        gc.collect()
        from engine.train import compiling

        compiling.reset()  # repeated toggles never reach Dynamo's recompile limit and run eager unnoticed
        gc.collect()  # what the reset let go, before the device's cache is emptied
        _empty_device_cache()
        if config.data.preload != self.config.data.preload:
            config, self.dataset = open_data(config)
        self.config = config
        self.segment = self._segment(config, resume=True)
        self.segment.step = step  # until its set-up loads the checkpoint: a failed set-up names this step

    # ------------------------------------------------------------------ events and the log

    def emit(self, event: Any) -> None:
        if self.dist.is_main:
            for sink in self.sinks:
                sink.emit(event)

    def _open_log(self, segment: Trainer) -> None:
        """After a set-up succeeded: the run's own record (writer.pid, events.jsonl, config.toml)."""
        if not self.dist.is_main:
            return
        if not self._logging:
            self._log = ev.JsonlSink(self.run_dir / rundir.EVENTS)
            self._log_id = _file_id(self.run_dir / rundir.EVENTS)
            self.sinks.insert(0, self._log)
            rundir.claim_writer(self.run_dir)  # a kill -9 leaves it behind: attach sees a dead pid
            self._logging = True
        if segment.resume:
            rundir.write_config(self.run_dir, segment.config)  # flags given at resume (or a toggle) are kept

    def _reopen_log_if_moved(self, segment: Trainer) -> bool:
        """events.jsonl is no longer the file this run appends to (moved, deleted, replaced):
        start a new one at the same name, so the log goes on where readers look. True if so.
        What now stands at the name is not a file of the run's own (a link, a FIFO, a hard link
        to another file: engine.files.not_own): the run cannot log, so it saves a checkpoint
        (no step since the last one is lost) and stops in one line saying how to go on."""
        if not (self.dist.is_main and self._logging):
            return False
        path = self.run_dir / rundir.EVENTS
        if _file_id(path) == self._log_id:
            return False
        try:
            log = ev.JsonlSink(path)
        except UserError as err:
            segment.save_checkpoint(final=True)  # its event lands in the log the run wrote until now
            raise UserError(f"{str(err).split(';')[0]} (planted while the run wrote it); the run saved a "
                            f"checkpoint at step {segment.step} and stopped: remove it and continue with "
                            f"`{program()} train --resume {path_text(str(self.run_dir))}`") from None  # fmt: skip
        except OSError:
            return False  # the directory itself is going: the segment's own check words it
        self.sinks[self.sinks.index(self._log)] = log
        self._log.close()
        self._log, self._log_id = log, _file_id(path)
        return True

    # ------------------------------------------------------------------ requests, at a step boundary

    @property
    def inbox(self) -> Inbox:
        """The requests' books (engine/run/inbox.py): this process's control and rank 0's mailbox."""
        return Inbox(self.run_dir, self.control, self.mailbox, self.emit)

    def at_boundary(self, segment: Trainer) -> Ending | None:
        """Between two steps: act on the requests asked since the last boundary, each
        acknowledged in the events; a pause waits here (taking requests) until a resume or a
        stop. Returns how the segment ends, or None to train on."""
        if self._reopen_log_if_moved(segment):
            self.emit(ev.Warning_(message=f"{rundir.EVENTS} was moved or deleted before step {segment.step}; a new one "
                                          "was started and the run trains on (the earlier events are where it was moved)"))  # fmt: skip
        if self.tuner is not None:  # it asks for its next trial through the run's own requests
            self.tuner.at_boundary(segment.step, segment.config, self.control, self.emit)
        toggles: list[Request] = []
        ending = self._act_on(segment, self.inbox.take(), toggles)
        if self._paused and ending is None:
            self.emit(ev.Paused(step=segment.step))
            while self._paused and ending is None:
                time.sleep(0.1)
                # a toggle asked meanwhile waits in the mailbox (a kill -9 cannot lose it),
                # and is taken at the first boundary after the resume
                ending = self._act_on(segment, self.inbox.take(defer=("toggle",)), toggles)
            self.emit(ev.Resumed(step=segment.step))
            segment.clock.restart()
        if ending is None and self._out_of_time(segment):
            self.emit(ev.Warning_(message=f"--max-time {segment.config.train.max_time:g} s reached at step "
                                          f"{segment.step}: saved and stopped; `train --resume` goes on"))  # fmt: skip
            segment.save_checkpoint(final=True)
            ending = Ending("stopped")
        if ending is not None:
            self.inbox.drop(toggles, segment.step, "the run stopped")
            self.inbox.settle(toggles)
            return ending
        ending = self._toggle(segment, toggles)
        self.inbox.settle(toggles)  # saved for (the checkpoint names them) or dropped with a word
        return ending

    def _out_of_time(self, segment: Trainer) -> bool:
        """train.max_time: this command's wall-clock budget, counted from its run() (a pause counts too)."""
        budget = segment.config.train.max_time
        return budget is not None and time.monotonic() - self._began >= budget

    def _act_on(self, segment: Trainer, requests: list[Request], toggles: list[Request]) -> Ending | None:
        """Pause, resume and save act at once; toggles are gathered (checked after a pause)."""
        stopping = None
        for r in requests:
            if r.kind == "mailbox":  # the mailbox itself was refused: one warning, training goes on
                self.emit(ev.Warning_(message=r.problem or "the request mailbox was refused"))
            elif r.problem is not None:
                if r.problem.startswith("stale"):
                    self.emit(ev.Warning_(message=f"discarded a {r.kind} request ({r.id}) left by a run that is gone"))
                self.inbox.drop([r], segment.step, r.problem)
            elif stopping is not None:
                self.inbox.drop([r], segment.step, "the run stopped")
            elif r.kind == "toggle":
                toggles.append(r)
            elif r.kind == "tune":
                self._tune_asked(r, segment)
            elif r.kind == "stop":
                stopping = r
            else:
                if r.kind == "save":
                    saved = segment.save_checkpoint()
                    segment.clock.restart()
                    if saved is False:
                        self.inbox.drop([r], segment.step, f"the checkpoint could not be written ({segment.saving.save_error})")
                        continue
                else:
                    self._paused = r.kind == "pause"
                self.inbox.ack(r, "applied", segment.step)
        if stopping is None:
            return None
        self.inbox.ack(stopping, "applied", segment.step)
        segment.save_checkpoint(final=True)
        return Ending("stopped")

    def _tune_asked(self, r: Request, segment: Trainer) -> None:
        """`toggle RUN --tune`: the run starts tuning itself at this boundary (rank 0 tunes; the
        others follow its toggles), unless a tune is under way."""
        if self.tuner is not None and self.tuner.state is not None and not self.tuner.state.done:
            self.inbox.drop([r], segment.step, "the run is tuning already")
            return
        if self.dist.is_main:
            self._start_tuner(None)
        self.inbox.ack(r, "applied", segment.step)

    def _toggle(self, segment: Trainer, toggles: list[Request]) -> Ending | None:
        """Check each toggle as a launch would, in order, on top of the ones accepted before it;
        one asking for the switches the run already has (after those) is dropped as "already
        on"; a refusal is a warning and the run trains on; any accepted: save and hand over."""
        accepted, config = [], segment.config
        for r in toggles:
            same = toggle.already_on(config, r.switches)
            if same is not None:  # a repeated toggle: no new segment, no second save of this step
                self.inbox.drop([r], segment.step, same)
                continue
            try:
                config = toggle.check(config, r.switches)
            except UserError as err:
                self.emit(ev.Warning_(message=f"toggle refused at step {segment.step}: {err}; the run goes on with its switches"))
                self.inbox.drop([r], segment.step, str(err))
                continue
            accepted.append(r)
        if not accepted:
            return None
        # the next segment resumes from exactly here; a save that fails refuses the toggle
        # (guard.save_failed words it) and the run trains on with its switches
        failed = segment.save_for_toggle([{"id": r.id, "switches": dict(r.switches)} for r in accepted])
        if failed is not None:
            self.inbox.drop(accepted, segment.step, f"its checkpoint could not be written ({failed}); the run goes on with its switches")
            segment.clock.restart()
            return None
        return Ending("toggle", config, accepted)

def _tokenizer_loader(path: str | None) -> Any:
    """How a segment loads the dataset's tokenizer for its samples (only when one is due)."""
    if not path:
        return None
    from engine.prep.tokenizer import load_tokenizer

    return lambda: load_tokenizer(Path(path))


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
