"""Tables that fit the terminal: columns chosen by width and importance, names never split mid-word.

Every command that prints a table describes its columns once (``Column``) and calls ``print_table``:
on a narrow terminal the least important columns are left out (a note names them and the option that
shows them), long ids are shortened in the middle (``middle``), headers wrap only after ``_`` or a
space, and free text (descriptions, reasons) wraps at spaces. ``wide=True`` prints every column in
full, however wide the lines get. A command-line module: library packages never import it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table
from rich.text import Text

ELLIPSIS = "…"
# a rich Table with its default box: 1 space of padding each side of a cell and 1 border per column, plus one
BORDER_PER_COLUMN, BORDER = 3, 1


def middle(text: str, width: int) -> str:
    """text shortened to width characters with an ellipsis in the middle (both ends of an id stay readable)."""
    if len(text) <= width:
        return text
    if width <= 1:
        return ELLIPSIS[:width]
    left = width // 2  # the start names the family, the end the variant: keep both
    right = width - 1 - left
    return text[:left] + ELLIPSIS + (text[-right:] if right else "")


def _pieces(text: str) -> list[str]:
    """text cut after each '_' or '-' (spaces kept): the places a name may wrap without splitting a word;
    never inside a number's exponent (1.5e-05)."""
    pieces: list[str] = []
    for p in re.findall(r"[^_\-\s]*[_\-]\s*|[^_\-\s]+\s*|\s+", text):
        if pieces and re.search(r"\de-$", pieces[-1]):
            pieces[-1] += p
        elif p:
            pieces.append(p)
    return pieces


def wrap_id(text: str, width: int) -> str:
    """An entity or experiment id on lines of at most width characters, broken after the '-' between its
    property.value segments (never inside a property's name, as after gpu_ in gpu_model); a segment longer than
    width wraps as a name (wrap_name)."""
    segments = re.findall(r".+?-(?=[a-z_][a-z0-9_]*\.)|.+$", text)  # each up to the '-' before the next "name."
    lines: list[str] = []
    for segment in segments:
        if lines and len(lines[-1]) + len(segment) <= width:  # the segment's '-' ends the line it joins
            lines[-1] += segment
        else:
            lines.extend(wrap_name(segment, width).split("\n") if len(segment) > width else [segment])
    return "\n".join(lines)


def wrap_name(text: str, width: int) -> str:
    """text on lines of at most width characters, broken only after '_', '-' or at a space (a piece longer
    than width stays whole)."""
    lines: list[str] = []
    for piece in _pieces(text):
        if lines and len(lines[-1]) + len(piece.rstrip()) <= width:
            lines[-1] += piece
        else:
            lines.append(piece)
    return "\n".join(line.rstrip() for line in lines)


@dataclass(frozen=True)
class Column:
    """One column of a printed table.

    priority: 0 is always shown; on a narrow terminal the column with the highest priority goes first.
    shrink: an id or name shortened in the middle down to min_width when space is short.
    breaks: a name that wraps after '_' or '-' (down to min_width) rather than being shortened: one a
        user types (a model, a GPU label) stays whole.
    wrap: free text wrapped at spaces (at least min_width wide).
    """

    header: str
    priority: int = 0
    justify: str = "left"
    shrink: bool = False
    breaks: bool = False
    wrap: bool = False
    min_width: int = 12


def _needs(column: Column, cells: list[str]) -> tuple[int, int]:
    """(the narrowest width that keeps every name whole, the width of its longest line)."""
    lines = [line for cell in cells for line in cell.splitlines()] or [""]
    natural = max(len(column.header), *(len(line) for line in lines))
    longest_piece = max(len(p.strip()) for p in _pieces(column.header) or [""])
    header_need = max(longest_piece, math.ceil(len(column.header) / 3))  # at most about 3 header lines
    if column.wrap:
        longest_word = max((len(w) for line in lines for w in line.split()), default=0)
        values = max(min(column.min_width, natural), min(longest_word, 36))
    elif column.shrink:
        values = min(column.min_width, natural)
    elif column.breaks:
        values = max([min(column.min_width, natural), *(len(p.strip()) for line in lines for p in _pieces(line))])
    else:
        values = max(len(line) for line in lines)
    return min(natural, max(header_need, values)), natural


def fit(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int) -> tuple[list[int], dict[int, int]]:
    """(indexes of the columns that fit in width characters, the width of each): the most important
    columns first, each at least as wide as keeps its names whole, the space left to the rest."""
    cells = [[str(row[i]) for row in rows] for i in range(len(columns))]
    need, natural = zip(*(_needs(c, col) for c, col in zip(columns, cells))) if columns else ((), ())
    kept = list(range(len(columns)))

    def total(idx: list[int]) -> int:
        return sum(need[i] for i in idx) + BORDER_PER_COLUMN * len(idx) + BORDER

    while total(kept) > width and any(columns[i].priority > 0 for i in kept):
        drop = max((i for i in kept if columns[i].priority > 0), key=lambda i: (columns[i].priority, i))
        kept.remove(drop)
    spare = max(0, width - total(kept))
    widths = {i: need[i] for i in kept}

    # the spare: first to what loses characters when narrow (shortened), then to names that wrap (a model
    # or GPU name stays on fewer lines), then to plain columns (their headers wrap), wrapped text last
    def rank(c: Column) -> int:
        return 0 if c.shrink else 1 if c.breaks else 3 if c.wrap else 2

    for i in sorted(kept, key=lambda i: (rank(columns[i]), columns[i].priority, i)):
        grow = min(natural[i] - need[i], spare)
        widths[i] += grow
        spare -= grow
    return kept, widths


def build_table(
    columns: Sequence[Column],
    rows: Sequence[Sequence[str]],
    *,
    width: int | None = None,
    title: str | None = None,
) -> tuple[Table, list[str]]:
    """(a rich Table of the columns that fit in width characters, the headers left out); width None: every
    column at its full width (nothing shortened)."""
    if width is None:
        kept, widths = list(range(len(columns))), None
    else:
        kept, widths = fit(columns, rows, width)
    table = Table(title=title)
    for i in kept:
        c = columns[i]
        if widths is None:
            table.add_column(c.header, justify=c.justify, no_wrap=True)
        else:
            table.add_column(
                wrap_name(c.header, widths[i]),
                justify=c.justify,
                width=widths[i],
                no_wrap=not c.wrap,
                overflow="fold" if c.wrap else "ellipsis",
            )
    for row in rows:
        cells = []
        for i in kept:
            cell = str(row[i])
            if widths is not None and columns[i].shrink:
                cell = "\n".join(middle(line, widths[i]) for line in cell.splitlines())
            elif widths is not None and columns[i].breaks:
                cell = "\n".join(wrap_name(line, widths[i]) for line in cell.splitlines())
            cells.append(Text(cell))  # plain text: "[fast_loss, ...]" is not rich markup
        table.add_row(*cells)
    return table, [columns[i].header for i in range(len(columns)) if i not in kept]


def print_table(
    console: Console,
    columns: Sequence[Column],
    rows: Sequence[Sequence[str]],
    *,
    title: str | None = None,
    wide: bool = False,
    more: str = "--wide shows them",
) -> None:
    """Print rows under columns fitted to the console's width (wide: every column in full, lines as long as
    they need); a note names the columns left out and what shows them (more)."""
    if wide:
        table, _ = build_table(columns, rows)
        cells = [[str(row[i]) for row in rows] for i in range(len(columns))]
        needed = sum(_needs(c, col)[1] for c, col in zip(columns, cells)) + BORDER_PER_COLUMN * len(columns) + BORDER
        full = Console(
            file=console.file,
            width=max(console.width, needed),
            no_color=console.no_color,
            force_terminal=console.is_terminal,
        )
        if title:
            full.print(title, highlight=False, soft_wrap=True)
        full.print(table, crop=False)
        return
    table, left_out = build_table(columns, rows, width=console.width)
    if title:
        print_title(console, title)
    console.print(table)
    if left_out:
        console.print(f"not shown: {', '.join(left_out)} ({more})", highlight=False)


def print_title(console: Console, title: str) -> None:
    """A line above a table, wrapped at spaces; a word longer than the terminal (an experiment id) wraps after its
    '_' or '-', as plan prints it, whole: it is what one copies into the next command."""
    words = [wrap_name(w, console.width) if len(w) > console.width else w for w in title.split(" ")]
    console.print(Text(" ".join(words), style="italic"), highlight=False)
