"""The segment table: per segment of a run, its switches and the speed they reached.

Fed with a run's events one at a time (`feed`, cheap: no drawing), it redraws on its own
slow timer, only when something changed and it is on screen, so a dashboard can mount it
and forget it. The Compare screen fills it with several runs at once (`show`). Rows,
cells and speed-ups come from engine.inspect.compare, the same as `gpt2-tui compare` prints;
the payoff columns come first (speed, speed-ups, best val, time to the target), then the
details, and last the settings that differ between rows (speed switches, optimizer,
schedule, ...), highlighted where they differ from the first row, the ones a segment changed
first. Columns that do not fit the width fold as `compare` folds them: into blocks of whole
columns one under another, each led by the key columns (run, steps), the payoff in the first;
nothing is cut and nothing is off screen.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll

from engine.api import events as ev
from engine.api import COMPARE_COLUMNS as COLUMNS, LEFT, SETTINGS_COLUMN, Row, blocks, cells, rows
from engine.api import setting_items, shown_settings
from engine.api import SegmentReader, SegmentSummary, final_val_loss, mark_target
from tui.plain import PlainTable, plain

HOT = "bold yellow"  # a setting that differs from the first row
EDGE = 4  # a table's cells past their content: a vertical scrollbar (2) and the last cell's padding


class SegmentTable(VerticalScroll, can_focus=False):
    """One PlainTable per block of columns (one block where they all fit the width); the
    tables take the focus, this scrolls them where the blocks outgrow its height."""

    DEFAULT_CSS = """
    SegmentTable { height: auto; }
    SegmentTable > PlainTable { height: auto; max-height: 14; }
    SegmentTable > PlainTable.folded { margin-top: 1; }
    """

    def __init__(self, *, refresh_s: float = 1.0, run_column: bool = False, id: str | None = None):
        super().__init__(id=id)
        self.refresh_s = refresh_s
        self.run_column = run_column  # the Compare screen's; one run's table needs none
        self.names = list(COLUMNS if run_column else COLUMNS[1:])
        self.reader = SegmentReader()
        self._best: float | None = None
        self._runs: list[tuple[str, Sequence[SegmentSummary], float | None]] | None = None
        self._version = 0
        self._drawn = -1
        self._width = -1  # the width the blocks were folded for
        self._body: list[list[Any]] = []  # every row's cells, in `names` order
        self.rows_shown: list[Row] = []  # what is on screen, for tests and callers
        self.blocks: list[list[int]] = []  # the column indices of each table, in order

    def compose(self) -> ComposeResult:  # the first block: the Compare screen's focus has a table at once
        yield PlainTable(cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        self._lay_out()  # the headers before any row (an empty table has no height: never "visible")
        if self.refresh_s > 0:
            self.set_interval(self.refresh_s, self.redraw)
        self.redraw()

    @property
    def row_count(self) -> int:
        return len(self._body)

    def get_row_at(self, index: int) -> list[Any]:
        """Row `index` whole, every column in `names` order, whichever block shows it."""
        return list(self._body[index])

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

    def show_run(self, reader: SegmentReader, best: float | None) -> None:
        """One run's segments, read elsewhere (the dashboard's reader)."""
        self.show([("", one_run(reader), best)])

    def on_resize(self) -> None:
        if self.size.width != self._width:
            self._lay_out()  # the fold depends on the width

    def redraw(self, force: bool = False) -> bool:
        """Rebuild the rows if anything changed and the table is visible; True if it did."""
        if self._version == self._drawn or not self.is_mounted:
            return False
        if not force and (not self.display or not self.region):
            return False
        self._drawn = self._version
        if self._runs is not None:
            runs = self._runs
        else:
            runs = [("", one_run(self.reader), self._best)]
        table = rows(runs)
        segs = [r.segment for r in table]
        shown = shown_settings(segs) if segs else []
        body: list[list[Any]] = []
        for r in table:
            row: list[Any] = [Text(c) if i in LEFT else Text(c, justify="right") for i, c in enumerate(cells(r))]
            row[SETTINGS_COLUMN] = Text(" ").join(
                Text(text, style=HOT if hot else "") for text, hot in setting_items(r.segment, shown, segs[0])
            )
            body.append(row if self.run_column else row[1:])
        self.rows_shown, self._body = table, [[plain(c) for c in row] for row in body]
        self._lay_out()
        return True

    def _lay_out(self) -> None:
        """The rows into one table per block of columns that fits the width (not laid out yet:
        one block; the resize that lays it out folds it)."""
        width = self.size.width
        widths = [max([len(n), *(row[i].cell_len for row in self._body)]) for i, n in enumerate(self.names)]
        self._width, self.blocks = width, blocks(widths, width - EDGE if width else None, 2 if self.run_column else 1)
        tables = list(self.query_children(PlainTable))
        for extra in tables[len(self.blocks):]:
            extra.remove()
        for n, cols in enumerate(self.blocks):
            table = tables[n] if n < len(tables) else PlainTable(cursor_type="row", zebra_stripes=True, classes="folded")
            # The columns go too, their widths given: a DataTable keeps a column as wide as the
            # widest cell it ever held, and sizes a new row's cells only when idle (a frame drawn
            # before that cut every cell to its header's width).
            table.clear(columns=True)
            for i in cols:
                table.add_column(self.names[i], key=self.names[i], width=widths[i])
            for row in self._body:
                table.add_row(*(row[i] for i in cols))
            if n >= len(tables):
                self.mount(table)


def one_run(reader: SegmentReader) -> list[SegmentSummary]:
    """A run's segments alone: `to target` is the time to its latest val loss."""
    segs = reader.segments()
    mark_target(segs, reader.evals, final_val_loss(reader.evals))
    return segs


__all__ = ["SegmentTable"]
