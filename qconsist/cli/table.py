"""Tables that fit the terminal: a node name is never cut to ``conv_…``.

``Rows`` holds a table's columns and cells. Printed where it fits (the name column whole, the other cells wrapped
between words at most, within the console's width: always when piped, where nothing is wrapped), it is a Rich
table; where it does not (80 columns, long node names), every row becomes a record: its name on a line of its own, whole, then the other cells as
``column value`` pairs, wrapped between pairs, never inside one. A list that is cut says how much was left out
(``… 37 more``) and where the rest is.
"""

from __future__ import annotations

from typing import Iterable

from rich.console import Console
from rich.table import Table
from rich.text import Text

INDENT = "    "


class Rows:
    """A table of ``columns``; ``name`` is the column whose cell heads a record (the node, the configuration)."""

    def __init__(self, *columns: str, title: str | None = None, name: int = 0) -> None:
        self.columns = list(columns)
        self.title = title
        self.name = name
        self.rows: list[list[str | Text]] = []

    def add(self, *cells: str | Text) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{len(cells)} cells for {len(self.columns)} columns")
        self.rows.append(list(cells))

    def table(self) -> Table:
        table = Table(title=self.title, title_justify="left")
        for index, column in enumerate(self.columns):  # the name whole; the other cells may wrap between words
            table.add_column(column, no_wrap=index == self.name, overflow="fold")
        for row in self.rows:
            table.add_row(*row)
        return table

    def fits(self, console: Console) -> bool:
        unbounded = console.options.update_width(1_000_000)  # not clamped to the console's width
        return console.measure(self.table(), options=unbounded).minimum <= console.width

    def print(self, console: Console) -> None:
        if self.fits(console):
            console.print(self.table())
            return
        if self.title:
            console.print(self.title, soft_wrap=True)
        width = max(console.width - len(INDENT), 20)
        for row in self.rows:
            console.print(_plain(row[self.name]), soft_wrap=True)
            pairs = [f"{column} {_plain(cell)}" for index, (column, cell) in enumerate(zip(self.columns, row))
                     if index != self.name and _plain(cell) not in ("", "-")]
            for line in fill(pairs, width):
                console.print(INDENT + line, soft_wrap=True)


def _plain(cell: str | Text) -> str:
    return cell.plain if isinstance(cell, Text) else str(cell)


def fill(pairs: Iterable[str], width: int, separator: str = "; ") -> list[str]:
    """``pairs`` joined by ``separator`` into lines of at most ``width`` characters, broken only between pairs (a
    pair longer than the width has a line of its own)."""
    lines: list[str] = []
    line = ""
    for pair in pairs:
        candidate = f"{line}{separator}{pair}" if line else pair
        if line and len(candidate) > width:
            lines.append(line + separator.rstrip())
            line = pair
        else:
            line = candidate
    if line:
        lines.append(line)
    return lines


def more(shown: int, total: int, what: str, where: str) -> str | None:
    """The line that says a list was cut: ``… 37 more diverging nodes (--top N, --json)``; None when nothing was."""
    if total <= shown:
        return None
    return f"… {total - shown} more {what} ({where})"
