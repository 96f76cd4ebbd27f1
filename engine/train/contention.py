"""The one rule for a timing taken on a busy machine: how much of the machine a timed window had.

A step time measured while other processes compete for the CPUs says more about the machine
than about the switches it times (issue 39: on a 2-core machine loaded past its cores the
ladder put AMP at 0.25x, and two runs doing the same work settled at 505.8 and 78.1 ms/step).
So each timed window (a logged interval of steps: reporting.py's Step events; a rung; a
segment's settled half) is read for contention, recorded with its timing, and judged here:

- load: the 1-minute load average (runnable threads, this process's own included) against
  `cores`, the CPUs this process may run on (sched_getaffinity);
- cpu: the CPU time the process got per second of wall time, in CPUs (time.process_time);
- stolen: of the time this process's threads wanted a CPU, the share they spent waiting for
  one (the kernel's per-thread run delay in /proc/self/task/*/schedstat, against the time they
  ran): CPU time others took from the process. A CPU training run keeps its threads runnable,
  so whatever of its expected CPU share it did not get shows up here. None where the kernel
  does not say (not Linux): then the load alone judges.

A window is contended when stolen >= STOLEN_LIMIT or load > LOAD_LIMIT x cores. The words are
engine.text.contention_text; the events carry engine.events.Contention.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Sequence

from engine import files
from engine.events import Contention

# A tenth of the CPU time the process wanted, spent waiting for a CPU, slows a CPU-bound step by
# about as much: more than the smaller optimizations the ladder tells apart (padded vocab: 3-25%).
STOLEN_LIMIT = 0.10
# The load average counts this process's own threads (a CPU run keeps about `cores` of them
# runnable, plus a prefetch or UI thread): half the CPUs again on top of that is others' demand.
LOAD_LIMIT = 1.5
MARK = "!"  # what a table puts beside a figure timed under contention

_TASKS = "/proc/self/task"


def cores() -> int:
    """The CPUs this process may run on (its affinity, which a container or taskset narrows)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def load() -> float | None:
    """The 1-minute load average; None where the system has none."""
    try:
        return max(0.0, os.getloadavg()[0])
    except (AttributeError, OSError):
        return None


def judged(load_: float | None, cores_: int, cpu: float | None = None, stolen: float | None = None) -> Contention:
    """A reading with its verdict (the module's rule)."""
    busy = (stolen is not None and stolen >= STOLEN_LIMIT) or (load_ is not None and load_ > LOAD_LIMIT * cores_)
    return Contention(load=load_, cores=cores_, cpu=cpu, stolen=stolen, contended=busy)


def now() -> Contention:
    """The machine's load as a run starts (no window yet: no CPU share)."""
    return judged(load(), cores())


def _task_times() -> dict[str, tuple[int, int]] | None:
    """{thread id: (ns run on a CPU, ns waited for one)} of this process's threads; None where
    the kernel does not say."""
    try:
        tids = os.listdir(_TASKS)
    except OSError:
        return None
    out = {}
    for tid in tids:
        try:
            ran, waited = files.read_bounded(f"{_TASKS}/{tid}/schedstat", 4096).split()[:2]
            out[tid] = (int(ran), int(waited))
        except (OSError, ValueError):  # the thread ended meanwhile, or an odd line: that thread is left out
            continue
    return out or None


class Gauge:
    """Reads contention over consecutive windows of this process: each `read` covers the time
    since the last (or since `restart`)."""

    def __init__(self) -> None:
        self.restart()

    def restart(self) -> None:
        self._wall, self._cpu, self._tasks = time.perf_counter(), time.process_time(), _task_times()

    def read(self) -> Contention:
        wall, cpu, tasks = time.perf_counter(), time.process_time(), _task_times()
        span = wall - self._wall
        share = (cpu - self._cpu) / span if span > 0 else None
        stolen = None
        if tasks is not None and self._tasks is not None:
            ran = waited = 0
            for tid, (r, w) in tasks.items():  # a thread born in the window counts from zero
                r0, w0 = self._tasks.get(tid, (0, 0))
                ran, waited = ran + max(0, r - r0), waited + max(0, w - w0)
            stolen = waited / (ran + waited) if ran + waited > 0 else None
        self._wall, self._cpu, self._tasks = wall, cpu, tasks
        return judged(load(), cores(), None if share is None else max(0.0, share), stolen)


def combine(readings: Sequence[Contention | None]) -> Contention | None:
    """Several windows' readings as one (a rung's timed steps, a segment's settled half): the
    median load, the mean CPU share and stolen share, judged anew; None when none was read."""
    known = [r for r in readings if r is not None]
    if not known:
        return None

    def mean(values: list[float | None]) -> float | None:
        got = [v for v in values if v is not None]
        return statistics.fmean(got) if got else None

    loads = [r.load for r in known if r.load is not None]
    return judged(statistics.median(loads) if loads else None, known[-1].cores, mean([r.cpu for r in known]),
                  mean([r.stolen for r in known]))  # fmt: skip


def settled(readings: Sequence[Contention | None]) -> Contention | None:
    """The readings of the window a settled step time is taken over (the second half of the
    step reports: engine.events.settled_step_time), as one."""
    return combine(readings[len(readings) // 2 :])


def is_contended(c: Contention | None) -> bool:
    return c is not None and c.contended


def marked(figure: str, c: Contention | None) -> str:
    """A table's figure with MARK when it was timed under contention."""
    return figure + MARK if is_contended(c) else figure


def line(readings: Sequence[Contention | None], rows: str = "rows") -> str:
    """The one line under a table of timings: which of its `rows` were timed on a busy machine
    (each marked MARK), with the worst reading; else that none was, with the highest seen; ''
    when none was measured (a run logged before contention was)."""
    known = [r for r in readings if r is not None]
    if not known:
        return ""
    busy = [r for r in known if r.contended]

    def worst(rs: list[Contention]) -> str:
        loads = [r.load for r in rs if r.load is not None]
        stolen = [r.stolen for r in rs if r.stolen is not None]
        parts = [f"load up to {max(loads):.1f} on {rs[-1].cores} CPUs"] if loads else []
        parts += [f"up to {100 * max(stolen):.0f}% of the CPU time it wanted spent waiting for a CPU"] if stolen else []
        return ", ".join(parts) or "no figures"

    if not busy:
        return f"contention: none measured ({worst(known)})"
    return (f"contention: {len(busy)} of {len(known)} {rows} timed on a busy machine, marked {MARK} ({worst(busy)}): "
            "slower and noisier than this machine can do, their ratios teach nothing; rerun when it is quiet")


_HALF_BUSY: dict[str, bool] = {}  # per precision: whether its matmul timing (device._matmul_ms, once) waited


def half_reason(precision_name: str, measure: bool = True) -> str | None:
    """engine.device.cpu_half_reason, its matmuls timed under a Gauge: a factor timed while the
    machine was busy says so (the ladder's AMP-skip note printed a contended time as the CPU's).
    Every front door (the preflight, the CLI, the doctor, the ladder) asks here."""
    from engine import device

    if not measure:
        return device.cpu_half_reason(precision_name, measure=False)
    gauge = Gauge()
    text = device.cpu_half_reason(precision_name)  # times on the first call, then reads the cache
    if text is None:
        return None
    busy = _HALF_BUSY.setdefault(precision_name, gauge.read().contended)
    return text + (", timed on a busy machine: the factor is rough" if busy else "")

