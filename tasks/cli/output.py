"""How the commands print: JSON (whole, or streamed item by item), a table of fields and values,
plain tables fitted to the terminal's width, and the wording of counts, ages and times."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table
from rich.text import Text


def print_json(value: Any) -> None:
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode() + "\n")


def stream_json_array(items: Iterator[Any]) -> None:
    """A JSON array written item by item: a large store is never held in memory at once."""
    out = sys.stdout
    out.write("[")
    for n, item in enumerate(items):
        out.write(("," if n else "") + "\n" + orjson.dumps(item).decode())
    out.write("\n]\n")


def terminal_width() -> int:
    # COLUMNS, else the terminal's, else (a pipe, a log) wide enough for ids and errors.
    return shutil.get_terminal_size((200, 24)).columns


def _console() -> Console:
    # Literal: what it prints holds text of models, tools and people ("[/bold]", ":x:").
    return Console(highlight=False, markup=False, emoji=False, width=terminal_width())


def print_fields(rows: Iterable[tuple[str, str]]) -> None:
    """A two-column table of fields and values, each cell Text: a value such as a reply
    holding `[/bold]` or a `[redacted-url]` placeholder prints as it is, never as markup."""
    table = Table("field", "value", show_header=False)
    for field, value in rows:
        table.add_row(Text(field), Text(value))
    _console().print(table)


def plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def human_s(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}".removesuffix(".0") + f" {unit}"
    return f"{seconds:.1f} s"


def short_time(iso: str) -> str:
    """An ISO timestamp as 'YYYY-MM-DD HH:MM:SS', for a table cell."""
    return iso[:19].replace("T", " ")


@dataclass(frozen=True)
class Column:
    header: str
    # 0: always shown in full (ids); otherwise dropped when the width runs out, lowest first.
    drop: int = 0
    # Cut to the width the other columns leave (at least MIN_FLEXIBLE), dropped last.
    flexible: bool = False


MIN_FLEXIBLE = 16
GAP = "  "


def format_table(columns: list[Column], rows: list[list[str]], width: int) -> str:
    """A plain table within `width`: the flexible column is cut first, then columns are
    dropped by priority; a `drop=0` column is never cut."""
    natural = [max([len(c.header)] + [len(r[i]) for r in rows]) for i, c in enumerate(columns)]
    widths = _fit(columns, natural, width)

    def line(cells: list[str]) -> str:
        return GAP.join(_cut(cells[i], w) for i, w in widths.items()).rstrip()

    return "\n".join([line([c.header for c in columns]), *(line(r) for r in rows)])


def _fit(columns: list[Column], natural: list[int], width: int) -> dict[int, int]:
    """The columns shown, in order, each with the width it gets: columns are dropped until the
    flexible ones have room, or until only the columns shown in full are left (then the table
    is wider than asked, and nothing is cut)."""
    shown = list(range(len(columns)))
    while True:
        flexible, left = _room(columns, natural, shown, width)
        if left >= MIN_FLEXIBLE * len(flexible) and left >= 0:
            break
        dropped = _next_to_drop(columns, shown, flexible)
        if dropped is None:
            break
        shown.remove(dropped)
    widths = {i: natural[i] for i in shown}
    for i in flexible:
        widths[i] = min(natural[i], left // len(flexible))
    return widths


def _room(
    columns: list[Column], natural: list[int], shown: list[int], width: int
) -> tuple[list[int], int]:
    """The flexible columns among `shown`, and the width the others leave them."""
    fixed = sum(natural[i] for i in shown if not columns[i].flexible)
    flexible = [i for i in shown if columns[i].flexible]
    return flexible, width - fixed - len(GAP) * (len(shown) - 1)


def _next_to_drop(columns: list[Column], shown: list[int], flexible: list[int]) -> int | None:
    """The droppable column of lowest priority, else the last flexible one, else None."""
    droppable = sorted((columns[i].drop, i) for i in shown if columns[i].drop > 0)
    if droppable:
        return droppable[0][1]
    if flexible:
        return flexible[-1]
    return None


def _cut(cell: str, width: int) -> str:
    if len(cell) > width:
        cell = cell[: width - 1] + "…"
    return cell.ljust(width)
