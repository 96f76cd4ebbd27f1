"""The segment table: per segment of a run, its switches and the speed they reached.

Fed with a run's events one at a time (`feed`, cheap: no drawing), it redraws on its own
slow timer, only when something changed and it is on screen, so a dashboard can mount it
and forget it. The Compare screen fills it with several runs at once (`show`). Rows,
cells and speed-ups come from engine.inspect.compare, the same as `gpt2-tui compare` prints;
the payoff columns come first (speed, speed-ups, best val, time to the target: on screen at 80
columns), then the details, and last the settings that differ between rows (speed switches,
optimizer, schedule, ...), highlighted where they differ from the first row, the ones a segment
changed first.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from rich.text import Text

from engine.api import events as ev
from engine.api import COMPARE_COLUMNS as COLUMNS, LEFT, SETTINGS_COLUMN, Row, cells, rows
from engine.api import setting_items, shown_settings
from engine.api import SegmentReader, SegmentSummary, final_val_loss, mark_target
from tui.plain import PlainTable, plain

HOT = "bold yellow"  # a setting that differs from the first row


class SegmentTable(PlainTable):
    DEFAULT_CSS = """
    SegmentTable { height: auto; max-height: 14; }
    """

    def __init__(self, *, refresh_s: float = 1.0, run_column: bool = False, id: str | None = None):
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self.refresh_s = refresh_s
        self.run_column = run_column  # the Compare screen's; one run's table needs none
        self.reader = SegmentReader()
        self._best: float | None = None
        self._runs: list[tuple[str, Sequence[SegmentSummary], float | None]] | None = None
        self._version = 0
        self._drawn = -1
        self.rows_shown: list[Row] = []  # what is on screen, for tests and callers

    def on_mount(self) -> None:
        self._add_columns()
        if self.refresh_s > 0:
            self.set_interval(self.refresh_s, self.redraw)
        self.redraw()

    def _add_columns(self, body: Sequence[Sequence[Any]] = ()) -> None:
        """The columns, each as wide as its widest cell in `body` (the rows about to be added)."""
        names = COLUMNS if self.run_column else COLUMNS[1:]
        for i, name in enumerate(names):
            width = max([len(name)] + [plain(row[i]).cell_len for row in body]) if body else None
            self.add_column(name, key=name, width=width)

    def feed(self, event: Any) -> None:
        """One event of the run this table follows (any kind; the ones it needs count)."""
        self.reader.feed(event)
        if isinstance(event, ev.Eval) and math.isfinite(event.val_loss):
            self._best = event.val_loss if self._best is None else min(self._best, event.val_loss)
        self._version += 1

    def show(self, runs: Sequence[tuple[str, Sequence[SegmentSummary], float | None]]) -> None:
        """(label, segments, best val loss) per run: the Compare screen's several runs."""
        self._runs = list(runs)
        self._version += 1
        self.redraw(force=True)

    def redraw(self, force: bool = False) -> bool:
        """Rebuild the rows if anything changed and the table is visible; True if it did."""
        if self._version == self._drawn or not self.is_mounted:
            return False
        if not force and (not self.display or not self.region):
            return False
        self._drawn = self._version
        if self._runs is not None:
            runs = self._runs
        else:  # one run followed: `to target` is the time to its latest val loss
            segs = self.reader.segments()
            mark_target(segs, self.reader.evals, final_val_loss(self.reader.evals))
            runs = [("", segs, self._best)]
        table = rows(runs)
        self.rows_shown = table
        segs = [r.segment for r in table]
        shown = shown_settings(segs) if segs else []
        body: list[list[Any]] = []
        for r in table:
            row: list[Any] = [c if i in LEFT else Text(c, justify="right") for i, c in enumerate(cells(r))]
            row[SETTINGS_COLUMN] = Text(" ").join(
                Text(text, style=HOT if hot else "") for text, hot in setting_items(r.segment, shown, segs[0])
            )
            body.append(row if self.run_column else row[1:])
        # The columns go too, their widths given: a DataTable keeps a column as wide as the
        # widest cell it ever held, and sizes a new row's cells only when idle (a frame drawn
        # before that cut every cell to its header's width).
        self.clear(columns=True)
        self._add_columns(body)
        for row in body:
            self.add_row(*row)
        return True


__all__ = ["SegmentTable"]
