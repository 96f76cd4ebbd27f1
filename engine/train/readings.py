"""A logged step's numbers without stopping the device: its scalars (loss, grad norm, the
guard's counters) are copied to the host asynchronously, with an event recorded behind
them, and read once that event is done, usually a step later. At a 32 ms GPT-2 step each
millisecond the device waits for the host costs about three points of MFU, so the loop
syncs only where it must anyway (evals, checkpoints, the last step).

Step time comes from the same events: the device time between the end of one recorded step
and the next, divided by the steps between them (a restart, after an eval, a save or a
pause, records a new starting event). A step the host syncs at is recorded too, so its time
also runs from the previous end event, never from when the host enqueued an earlier step.
On a CPU the host is the device: the events are wall-clock stamps, ready at once.

Under torchrun the ranks read the same readings at the same step (`ready(before=step)`: those
recorded at an earlier step, waited for), since what a reading starts (the step times
gathered over the ranks, a divergence stop) is a collective every rank must enter together.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

import torch


class Event(Protocol):
    """What a reading waits on (torch.cuda.Event, or a host clock on a CPU)."""

    def record(self) -> None: ...
    def query(self) -> bool: ...
    def synchronize(self) -> None: ...
    def seconds_since(self, earlier: Event) -> float: ...


class HostEvent:
    """A CPU's event: the wall clock when recorded; done at once."""

    def __init__(self) -> None:
        self.t = 0.0

    def record(self) -> None:
        self.t = time.perf_counter()

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def seconds_since(self, earlier: HostEvent) -> float:
        return self.t - earlier.t


class CudaEvent:
    """A timed CUDA event on the current stream."""

    def __init__(self) -> None:
        self.e = torch.cuda.Event(enable_timing=True)

    def record(self) -> None:
        self.e.record()

    def query(self) -> bool:
        return self.e.query()

    def synchronize(self) -> None:
        self.e.synchronize()

    def seconds_since(self, earlier: CudaEvent) -> float:
        return earlier.e.elapsed_time(self.e) / 1000.0


def event_for(device: torch.device) -> Event:
    return CudaEvent() if device.type == "cuda" else HostEvent()


@dataclass
class Reading:
    """One logged step, read: its step and tokens, the values recorded, and its timing."""

    step: int
    tokens: int
    lr: float
    values: list[float]
    step_time_s: float
    data_time_s: float
    report: bool = True  # a logged step (a Step event); else only timed (a sync or a save's step)


@dataclass
class _Pending:
    step: int
    tokens: int
    lr: float
    host: torch.Tensor
    start: Any
    end: Any
    steps: int
    data_s: float
    report: bool


class Readings:
    """Logged steps in flight, oldest first."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pending: deque[_Pending] = deque()
        self._start: Any = None

    def restart(self) -> None:
        """Timing starts again here (after an eval, a save, a pause)."""
        self._start = event_for(self.device)
        self._start.record()

    def record(self, step: int, tokens: int, lr: float, scalars: torch.Tensor, steps: int, data_s: float,
               report: bool = True) -> None:  # fmt: skip
        """`scalars`: a 1-D float tensor on the device; `steps`: how many steps since the last
        record or restart (its step time is their mean); `data_s`: their host data wait;
        `report`: a logged step (else its time alone counts)."""
        host = torch.empty(scalars.shape, dtype=torch.float32, pin_memory=self.device.type == "cuda")
        host.copy_(scalars.detach().float(), non_blocking=True)
        end = event_for(self.device)
        end.record()
        self.pending.append(_Pending(step, tokens, lr, host, self._start, end, steps, data_s, report))
        self._start = end  # the next interval starts where this one ended

    def ready(self, wait: bool = False, before: int | None = None) -> list[Reading]:
        """The readings whose copies are done, in order (all of them with `wait`; with `before`,
        exactly those recorded at an earlier step, waited for: the same on every rank)."""
        out = []
        while self.pending and (wait or _arrived(self.pending[0], before)):
            p = self.pending.popleft()
            p.end.synchronize()
            seconds = p.end.seconds_since(p.start) / max(1, p.steps)
            out.append(Reading(p.step, p.tokens, p.lr, p.host.tolist(), seconds, p.data_s / max(1, p.steps), p.report))
        return out


def _arrived(p: _Pending, before: int | None) -> bool:
    return p.step < before if before is not None else p.end.query()
