"""Follow a run's events.jsonl as another process writes it (the `attach` side).

Reads only what was appended since the last call; a line without its newline yet is kept
for the next call (the writer may be mid-line), so a torn last line is never parsed. A file
that shrank (truncated, or replaced by a new run's) is read again from its start, and
`resets` counts how often that happened so the reader can drop what it built from the old one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from engine.api import files
from engine.api import EventLines


class EventTail:
    def __init__(self, path: Path):
        self.path = Path(path)
        self._pos = 0
        self._partial = b""
        self.lines = EventLines(self.path)  # the one reading of event lines (engine.events)
        self.problems = self.lines.problems  # the lines skipped, with where
        self.resets = 0

    def _restart(self) -> None:
        self._pos, self._partial, self.lines.line = 0, b"", 0
        self.resets += 1

    def read_new(self, max_bytes: int = 8 << 20) -> list[Any]:
        """Events appended since the last call (at most max_bytes read per call)."""
        try:
            with files.open_log(self.path) as f:  # a regular file only: never a link, never a FIFO
                if os.fstat(f.fileno()).st_size < self._pos:
                    self._restart()
                f.seek(self._pos)
                chunk = f.read(max_bytes)
        except OSError:
            return []
        self._pos += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()  # b"" when the chunk ended with a newline
        return self.lines.read(lines)
