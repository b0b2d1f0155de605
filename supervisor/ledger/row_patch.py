"""Writes the read cache (read_cache.py) can apply to rows it holds, rather than
drop them: an UPDATE of one row by its key whose assignments are plain values,
``col = col + N``, with equality conditions on the row's columns (a
compare-and-set). Values are typed as the server returns them (``typed``): a
value of another type than its column's, or an expression, makes the write one
the cache cannot apply, and it drops the row as before.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, NamedTuple

#: ``UPDATE t SET ... WHERE key = ? [AND col = ?]...``: one row by its key, with
#: conditions on its columns (a compare-and-set), and nothing more.
_KEYED_UPDATE = re.compile(
    r"^\s*UPDATE\s+(?P<table>\w+)\s+SET\s+(?P<set>[^()]*?)\s+WHERE\s+(?P<key>\w+)\s*=\s*\?"
    r"(?P<conditions>(?:\s+AND\s+\w+\s*=\s*\?)*)\s*$",
    re.I | re.S,
)
_CONDITION = re.compile(r"\bAND\s+(\w+)\s*=\s*\?", re.I)
#: One assignment the cache can apply.
_ASSIGNMENT = re.compile(
    r"^\s*(?P<col>\w+)\s*=\s*(?:(?P<param>\?)|(?P<null>NULL)|'(?P<text>[^'?]*)'|(?P<int>-?\d+)"
    r"|(?P<self>\w+)\s*\+\s*(?P<step>\d+))\s*$",
    re.I,
)
#: The server's types whose values the cache can put in a row itself, as psycopg loads them.
KINDS = {20: "int", 21: "int", 23: "int", 701: "float", 25: "text", 1043: "text"}


class Assignment(NamedTuple):
    column: str
    how: str  # "param" (``what``: the index of its ``?``), "value" (a literal), "add" (``column + what``)
    what: Any


class KeyedUpdate(NamedTuple):
    key: str
    key_index: int
    assignments: tuple[Assignment, ...]
    conditions: tuple[tuple[str, int], ...] = ()  # (column, index of its ``?``): all must hold


@lru_cache(maxsize=4096)
def keyed_update(sql: str) -> KeyedUpdate | None:
    """The assignments of an UPDATE of one row by its key, when every one of them
    is a plain value the cache can apply (None: not such an UPDATE)."""
    update = _KEYED_UPDATE.match(sql)
    if update is None or '"' in update["set"]:
        return None
    assignments: list[Assignment] = []
    index = 0
    for part in update["set"].split(","):
        one = _ASSIGNMENT.match(part)
        if one is None:
            return None
        column = one["col"].lower()
        if one["param"]:
            assignments.append(Assignment(column, "param", index))
            index += 1
        elif one["null"]:
            assignments.append(Assignment(column, "value", None))
        elif one["text"] is not None:
            assignments.append(Assignment(column, "value", one["text"]))
        elif one["int"] is not None:
            assignments.append(Assignment(column, "value", int(one["int"])))
        elif one["self"].lower() == column:
            assignments.append(Assignment(column, "add", int(one["step"])))
        else:
            return None
    key = update["key"].lower()
    if key in {a.column for a in assignments}:
        return None
    conditions = tuple(
        (column.lower(), index + 1 + number) for number, column in enumerate(_CONDITION.findall(update["conditions"]))
    )
    return KeyedUpdate(key, index, tuple(assignments), conditions)


class Unfit(Exception):
    """A value the cache cannot put in a row as the server would return it."""


def typed(kind: str | None, value: Any) -> Any:
    """``value`` as the server returns a column of ``kind`` holding it."""
    if value is None:
        return None
    if kind == "int" and isinstance(value, int):  # bool too: stored as 0/1
        return int(value)
    if kind == "float" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if kind == "text" and isinstance(value, str):
        return value
    raise Unfit


class TableShape(NamedTuple):
    key: str | None  # its single-column primary key (None: none)
    kinds: dict[str, str]  # column -> "int", "float", "text" (those the cache can type)
    primary: tuple[str, ...] = ()  # every column of its primary key


def row_read(table: str, key: str) -> str:
    """The read of a whole row by its key that the cache keeps up to date."""
    return f"SELECT * FROM {table} WHERE {key} = ?"


def apply(
    update: KeyedUpdate, kinds: dict[str, str], row: dict[str, Any], args: tuple[Any, ...]
) -> dict[str, Any] | None:
    """``row`` (column -> value, possibly only some of its columns) after ``update``:
    the same values when a condition fails (the UPDATE changes nothing), None when
    the cache cannot tell (a column it does not hold or cannot type, a value of
    another type)."""
    try:
        for column, index in update.conditions:
            if column not in row or column not in kinds:
                return None
            held = row[column]
            if held is None or held != typed(kinds[column], args[index]):
                return row  # the condition fails: the UPDATE changes nothing
        after = dict(row)
        for assignment in update.assignments:
            kind = kinds.get(assignment.column)
            if kind is None:
                return None
            if assignment.how == "param":
                after[assignment.column] = typed(kind, args[assignment.what])
            elif assignment.how == "value":
                after[assignment.column] = typed(kind, assignment.what)
            elif assignment.column not in row:
                return None
            elif kind == "int" and row[assignment.column] is not None:
                after[assignment.column] = typed(kind, row[assignment.column] + assignment.what)
            elif row[assignment.column] is not None:
                return None  # NULL + N stays NULL; anything else is not computed here
    except (Unfit, IndexError):
        return None
    return after
