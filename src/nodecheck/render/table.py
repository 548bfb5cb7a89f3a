"""What every human output shares: untrusted text made plain, a console sized to the terminal, and
tables that fit it by leaving out whole columns, never cutting numbers."""

from __future__ import annotations

import os
import re
import sys

from rich import box
from rich.console import Console, Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

SEVERITY_STYLE = {"info": "cyan", "warning": "yellow", "error": "red", "critical": "bold red"}
# C0 and C1 control characters (ESC starts terminal escape sequences; CSI is 0x9b): never to a terminal
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clean(value) -> str:
    """Any value from a source nodecheck does not control, made safe to print: control characters and
    escape sequences become '?' (rich markup is escaped where the text is printed: _esc, _cell)."""
    return _CONTROL.sub("?", str(value))


def esc(value) -> str:
    """An untrusted value inside a rich markup string: `[bold]` in a host name prints as written."""
    return escape(clean(value))


def cell(value) -> Text:
    """An untrusted value as a table cell: plain text, never read as markup."""
    return Text(clean(value))


def unknown_cell(value) -> Text:
    return Text("unknown") if value is None or value == "" else cell(value)


PLAIN_WIDTH = 1000  # a console this wide prints plain output: unboxed tables, lines as long as they need


def new_console() -> Console:
    """A terminal's own width; piped (`| less`), the width of the terminal the command runs in (stderr or
    stdin is still that terminal) or $COLUMNS; with no terminal at all (cron, a file), plain output."""
    console = Console()
    columns = os.environ.get("COLUMNS", "")
    if console.is_terminal or (columns.isascii() and columns.isdigit() and 0 < len(columns) < 6):
        return console
    for stream in (sys.stderr, sys.stdin):
        try:
            return Console(width=os.get_terminal_size(stream.fileno()).columns)
        except (OSError, ValueError, AttributeError):
            continue
    return Console(width=PLAIN_WIDTH)


def fitted_table(console: Console, title: str | None, headers: list[tuple[str, int]], rows: list[list],
           justify: str = "left") -> Table:
    """A table that fits the console: headers are (header, role) with role IDENTITY (names, CPU lists: never
    cut, never dropped), LIST (names separated by ", ": wrapped between names, never inside one), TEXT
    (wraps, never dropped), or a positive number: the order in which the column is left out when the table
    would not fit (1 first).
    Other text wraps instead of being cut; where even the identities leave it too little room, the TEXT column
    goes under the table, a line per row named by its first identities. Says which columns it left out."""
    def text_of(cell) -> str:
        return cell.plain if isinstance(cell, Text) else str(cell)

    def natural(header, cells):
        return max([len(header)] + [len(text_of(c)) for c in cells])

    def longest_word(header, cells, separators=r"[ ,]+"):
        return max([len(header)] + [len(w) for c in cells for w in re.split(separators, text_of(c))])

    def width_of(header, role, cells):  # names need all of their width; text that wraps, a readable share
        if role in (IDENTITY, LIST):
            return natural(header, cells)
        floor = TEXT_MIN if role == TEXT else WRAPPED_MIN
        return max(min(natural(header, cells), floor), min(longest_word(header, cells), TEXT_MIN))

    def needed(cols):
        return sum(width_of(h, role, cells) + 3 for h, role, cells in cols) + 1

    kept = [(header, role, [row[i] for row in rows]) for i, (header, role) in enumerate(headers)]
    dropped = []
    while needed(kept) > console.width and any(role > 0 for _, role, _ in kept):
        victim = min((c for c in kept if c[1] > 0), key=lambda c: c[1])
        kept.remove(victim)
        dropped.append(victim[0])
    # the identities alone leave the text too little room: it goes under the table, a line per row, words whole
    below = [c for c in kept if c[1] == TEXT] if needed(kept) > console.width else []
    kept = [c for c in kept if c not in below]
    plain = console.width >= PLAIN_WIDTH
    caption = f"not shown at {console.width} columns: {', '.join(dropped)} (widen the terminal, or --json)" if dropped else None
    table = Table(title=title, title_justify="left", box=None if plain else box.HEAVY_HEAD, caption=caption,
                  caption_justify="left")
    for header, role, cells in kept:
        if role == IDENTITY:
            table.add_column(header, no_wrap=True, min_width=natural(header, cells), justify=justify)
        elif role == LIST:
            table.add_column(header, min_width=longest_word(header, cells, ", "), overflow="fold", justify=justify)
        else:  # words stay whole where they can: wraps between them
            table.add_column(header, overflow="fold", min_width=min(longest_word(header, cells), TEXT_MIN),
                             ratio=1 if role == TEXT else None, justify=justify)
    for row in zip(*(cells for _, _, cells in kept), strict=True):
        table.add_row(*row)
    if not below:
        return table
    names = [cells for _, role, cells in kept if role == IDENTITY][:2]
    notes = [Text(" ".join(text_of(c[n]) for c in names) + f" {header}: ") + (cells[n] if isinstance(cells[n], Text) else Text(str(cells[n])))
             for header, _, cells in below for n in range(len(rows)) if text_of(cells[n]).strip()]
    return Group(table, *notes)


IDENTITY, LIST, TEXT = 0, -1, -2
WRAPPED_MIN = 16  # columns a wrapping column needs to stay readable
TEXT_MIN = 40  # ... and the column that says what to do


def render_findings(console: Console, report) -> None:
    if not report.findings:
        console.print("[green]No findings.[/green]")
        return
    rows = [[Text(clean(f.severity), style=SEVERITY_STYLE.get(f.severity, "")), cell(f.subject), cell(f.measured),
             cell(f.expected), cell(f.message)] for f in report.findings]
    headers = [("severity", IDENTITY), ("subject", IDENTITY), ("measured", 2), ("expected", 1), ("what to do", TEXT)]
    console.print(fitted_table(console, "Findings", headers, rows))
