"""Rows of a results table chosen and ordered as ``tunebench show`` asks: ``--where``, ``--sort``, ``--top``.

``--where NAME OP VALUE`` (OP one of = != < <= > >=; repeatable, all must hold) keeps the rows whose
column NAME compares so with VALUE: as numbers when both are numbers, else as text (``=``/``!=`` only
compare text: ``status=valid``, ``actuator=measure``; an order needs a number, NaN is refused). A row
without a value in NAME never matches.
``--sort NAME[:asc|:desc]`` orders rows by a column, rows without a value last; ``--top N`` keeps the
first N rows after sorting, by default the N of highest ``dataset_tokens_per_second``.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tunebench.errors import InputError, one_of
from tunebench.store.schema import STATES
from tunebench.store.tables import Table

OPERATORS: dict[str, Callable[[Any, Any], bool]] = {
    "!=": operator.ne, "<=": operator.le, ">=": operator.ge, "=": operator.eq, "<": operator.lt, ">": operator.gt,
}  # fmt: skip
_CONDITION = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(!=|<=|>=|==|=|<|>)\s*(.*?)\s*$")
TOP_DEFAULT_SORT = "dataset_tokens_per_second:desc"  # --top without --sort: the fastest rows


@dataclass(frozen=True)
class Condition:
    name: str
    op: str
    value: str

    def test(self, cell: Any) -> bool:
        if cell is None:
            return False
        number = _as_number(self.value)
        if number is not None and isinstance(cell, (int, float)) and not isinstance(cell, bool):
            return OPERATORS[self.op](cell, number)
        if number is not None and isinstance(cell, bool):
            return OPERATORS[self.op](int(cell), number)
        if self.op not in ("=", "!="):
            return False  # text has no order worth filtering on
        return OPERATORS[self.op](str(cell), self.value)


def parse_condition(text: str) -> Condition:
    """'batch_size>=4' -> Condition; InputError naming --where otherwise."""
    match = _CONDITION.match(text)
    if not match or not match.group(3):
        raise InputError(
            "--where",
            f"cannot read {text!r}",
            allowed="NAME OP VALUE with OP one of = != < <= > >=, e.g. batch_size>=4 or status=valid",
        )
    name, op, value = match.groups()
    number = _as_number(value)
    if op in ("<", "<=", ">", ">=") and (number is None or number != number):  # NaN != NaN: no row would match
        raise InputError(
            "--where",
            f"{text!r}: {op} compares numbers, and {value!r} is not one",
            allowed="a number, e.g. batch_size>=4; = and != also compare text",
        )
    return Condition(name, "=" if op == "==" else op, value)


def parse_sort(text: str) -> tuple[str, bool]:
    """'NAME' or 'NAME:asc' or 'NAME:desc' -> (name, descending)."""
    name, _, direction = text.partition(":")
    if direction not in ("", "asc", "desc") or not name.strip():
        raise InputError("--sort", f"cannot read {text!r}", allowed="NAME, NAME:asc or NAME:desc")
    return name.strip(), direction == "desc"


def select_rows(table: Table, where: Sequence[str] = (), sort: str | None = None, top: int | None = None) -> Table:
    """The rows of table that meet every condition of where, sorted by sort, the first top of them."""
    conditions = [parse_condition(text) for text in where]
    if top is not None and sort is None:
        sort = TOP_DEFAULT_SORT
    order = parse_sort(sort) if sort else None
    if not len(table) or not (conditions or order or top is not None):
        return table
    names = [c for c in table.columns if c]
    for field, name in [("--where", c.name) for c in conditions] + ([("--sort", order[0])] if order else []):
        if name not in table.columns:
            raise InputError(field, f"no column {name!r} in these results", allowed=one_of(names))
    for condition in conditions:  # a request's status is one of STATES: another value would match nothing, silently
        if condition.name == "status" and condition.value not in STATES:
            raise InputError("--where", f"no status {condition.value!r}", allowed=one_of(STATES))
    keep = list(range(len(table)))
    for condition in conditions:
        column = table.data[table.columns.index(condition.name)]
        keep = [i for i in keep if condition.test(column[i])]
    if order:
        keep = _sorted(keep, table.data[table.columns.index(order[0])], order[1])
    if top is not None:
        keep = keep[:top]
    data = [[column[i] for i in keep] for column in table.data]
    data[0] = range(len(keep))  # the index column counts the rows shown
    return Table(table.columns, data, table.text_columns)


def _sorted(rows: list[int], column: Sequence[Any], descending: bool) -> list[int]:
    """rows ordered by column: numbers before text, missing values last either way (stable)."""
    present = [i for i in rows if column[i] is not None]
    missing = [i for i in rows if column[i] is None]

    def key(i: int) -> tuple[int, Any]:
        value = column[i]
        if isinstance(value, (int, float)):
            return (0, value)
        return (1, str(value))

    try:
        present.sort(key=key, reverse=descending)
    except TypeError:  # mixed kinds that do not compare: order them as text
        present.sort(key=lambda i: str(column[i]), reverse=descending)
    return present + missing


def _as_number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None
