"""How other threads and processes steer a running Trainer: pause, resume, stop, save now.

In-process (the TUI's own runs) they call Control's methods; a detached run (the headless
CLI in its own process) is steered by signals that the CLI turns into the same calls:
SIGINT/SIGTERM stop with a checkpoint, SIGUSR1 saves now, SIGUSR2 pauses or resumes.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable

SAVE_SIGNAL = getattr(signal, "SIGUSR1", None)  # POSIX only
PAUSE_SIGNAL = getattr(signal, "SIGUSR2", None)


class Control:
    """Thread-safe steering of a running Trainer: pause, resume, stop (with a save), save now."""

    def __init__(self) -> None:
        self._running = threading.Event()
        self._running.set()
        self._stop = threading.Event()
        self._save = threading.Event()
        self._toggle: dict | None = None  # new switches to apply at the next step boundary
        self._lock = threading.Lock()

    def pause(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    def stop(self) -> None:
        self._stop.set()
        self._running.set()  # a paused trainer must wake up to stop

    def save_now(self) -> None:
        self._save.set()

    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    @property
    def stop_requested(self) -> bool:
        return self._stop.is_set()

    def wait_while_paused(self, on_save: Callable[[], None]) -> None:
        """Block while paused; a save asked for meanwhile happens now, not after the resume."""
        while not self._running.wait(timeout=0.1):
            if self.take_save_request():
                on_save()

    def request_toggle(self, overrides: dict) -> None:
        """Continue the run with these switches (engine/toggle.py), from the next step boundary."""
        with self._lock:
            self._toggle = dict(overrides)

    @property
    def toggle_requested(self) -> bool:
        return self._toggle is not None

    def take_toggle(self) -> dict | None:
        with self._lock:
            pending, self._toggle = self._toggle, None
        return pending

    def take_save_request(self) -> bool:
        requested = self._save.is_set()
        self._save.clear()
        return requested
