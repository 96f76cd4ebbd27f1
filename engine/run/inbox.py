"""A run's inbox: the requests it takes at a step boundary from both sources (this process's
`Control`, the run directory's `Mailbox`: engine/run/requests.py), the same on every rank,
and the acknowledgement each one gets in the events, applied or dropped with its reason.

The owner (engine/run/owner.py) decides what a request does; this class only takes them and
keeps the books, including the toggles a kill -9 left between their save and their segment.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from engine import events as ev
from engine import files, rundir
from engine.run.requests import Control, Mailbox, Request
from engine.train import distributed


class Inbox:
    """`mailbox` is rank 0's only (None elsewhere); `emit` writes the acknowledgements."""

    def __init__(self, run_dir: Path, control: Control, mailbox: Mailbox | None,
                 emit: Callable[[Any], None]) -> None:  # fmt: skip
        self.run_dir, self.control, self.mailbox, self.emit = run_dir, control, mailbox, emit

    def take(self, defer: tuple[str, ...] = ()) -> list[Request]:
        """The requests asked since the last step boundary, the same on every rank; mailbox
        requests of a kind in `defer` wait in the mailbox (Mailbox.take). A request that was in
        the mailbox when this writer started is stale (asked of a writer that is gone), whatever
        time it claims: a line's own clock is not trusted (Mailbox.mark_start). Under torchrun
        only at the boundaries the ranks agree at (distributed.agree_due); the rest wait."""
        ctx = distributed.current()
        if not distributed.agree_due(ctx):
            return []
        local = self.control.take()
        if self.mailbox is not None:  # a toggle stays in the mailbox until settled: see settle
            for r in self.mailbox.take(defer, hold=tuple(k for k in ("toggle",) if k not in defer)):
                if r.problem is None and r.old:
                    r = dataclasses.replace(r, problem="stale: it was in the mailbox before this run's writer started")
                local.append(r)
        return distributed.agree(local, ctx, lambda: Request("stop"))

    def settle(self, toggles: Sequence[Request]) -> None:
        """The toggles taken at this boundary are settled (their hand-over checkpoint names them,
        or they were dropped with a word): out of the mailbox. Until here a kill -9 leaves them
        there, for the next writer to drop with a line, never lost without one."""
        if self.mailbox is not None:
            self.mailbox.settle({r.id for r in toggles})

    def ack(self, r: Request, status: str, step: int, reason: str = "") -> None:
        self.emit(ev.RequestAck(id=r.id, kind=r.kind, status=status, step=step, reason=reason))

    def drop(self, requests: Sequence[Request], step: int, reason: str) -> None:
        for r in requests:
            self.ack(r, "dropped", step, reason)

    def lost_toggles(self, pending: Sequence[Mapping[str, Any]], now: Mapping[str, Any], applied: Sequence[Request],
                     step: int) -> None:  # fmt: skip
        """A toggle whose checkpoint was saved but whose segment never opened (a kill -9 in
        the hand-over) is not lost without a word: this resume says it was dropped, unless
        the switches it asked for are `now`, the ones this segment runs with. The log is the
        record first: a toggle it already acknowledges (its segment opened, then the kill came
        before that segment's own checkpoint) is settled, whatever the switches are now (a flag
        at resume set one back, a later toggle of the same switch at that boundary)."""
        opened = {r.id for r in applied}
        asked_by: dict[str, dict[str, Any]] = {}
        for p in pending:
            rid, asked = str(p.get("id", "?"))[:64], p.get("switches")
            rid = rid if rid.isprintable() else "?"
            if rid not in opened and isinstance(asked, dict):
                asked_by[rid] = asked
        said = self._acknowledged(set(asked_by))
        for rid, asked in asked_by.items():
            if rid in said:
                continue
            if asked and all(now.get(name) == value for name, value in asked.items()):
                # applied, not said: a kill after config.toml took its switches, before the new segment's events
                self.emit(ev.Warning_(message=f"a toggle ({rid}) applied at step {step} just before the run was "
                                              "killed was not acknowledged then; acknowledged now"))  # fmt: skip
                self.ack(Request("toggle", id=rid), "applied", step,
                         "the run was killed before the toggle's new segment said so; it runs with its switches")
                continue
            self.emit(ev.Warning_(message=f"a toggle ({rid}) was saved for at step {step} but the run was "
                                          "killed before it applied; resumed with the switches it had"))  # fmt: skip
            self.ack(Request("toggle", id=rid), "dropped", step,
                     "the run was killed between the toggle's save and its new segment")

    def _acknowledged(self, ids: set[str]) -> set[str]:
        """Which of `ids` the run's log already acknowledges (read only when a resume has some to ask about)."""
        if not ids or not distributed.current().is_main:
            return set(ids)
        found: set[str] = set()
        reader = ev.EventLines(self.run_dir / rundir.EVENTS)
        try:
            with files.open_log(self.run_dir / rundir.EVENTS, ev.EVENTS_CAP) as f:
                for raw in f:
                    if b'"request"' in raw and any(i.encode() in raw for i in ids):
                        e = reader.parse(raw)
                        if isinstance(e, ev.RequestAck) and e.id in ids:
                            found.add(e.id)
        except OSError:
            return set(ids)  # the log cannot be read: say nothing rather than twice
        return found
