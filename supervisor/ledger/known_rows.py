"""Rows the ledger's one writer inserted itself, known column by column, so that a
read of one of them by its primary key is answered without asking the server.

A plain ``INSERT INTO t (cols) VALUES (...)`` (not ``OR IGNORE``: it inserts its
row or fails the transaction, which then rolls back and forgets everything) says
what the new row holds, for every column given a ``?`` or a literal, typed as the
server returns it (row_patch.py). A later read that names the row by its whole
primary key (``SELECT a, b FROM t WHERE k1 = ? AND k2 = ? [AND c = ?]``), and
selects and compares only columns the insert gave, is answered from it: the row
one step boundary inserts (a provider request, a plan) is read back at the next
without a round trip.

Only the writer's own writes change a row of its partition, so what it inserted
stays true until it writes that table again: an UPDATE of the row by its key that
row_patch.py can apply is applied; any other UPDATE or DELETE of the table forgets
all of that table's rows. A further INSERT leaves them be (it cannot change an
existing row: a plain one of the same key fails, an ignored one does nothing).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache
from typing import Any, NamedTuple

from corral.supervisor.ledger.row_patch import TableShape, Unfit, apply, keyed_update, typed

#: ``INSERT INTO t (cols) VALUES (...)``, one row, nothing after it.
_PLAIN_INSERT = re.compile(
    r"^\s*INSERT\s+INTO\s+(?P<table>\w+)\s*\((?P<columns>[\w\s,]+)\)\s*VALUES\s*\((?P<values>[^()]*)\)\s*$",
    re.I | re.S,
)
_VALUE = re.compile(r"^\s*(?:(?P<param>\?)|(?P<null>NULL)|'(?P<text>[^'?,]*)'|(?P<int>-?\d+))\s*$", re.I)
#: ``SELECT a, b FROM t WHERE x = ? AND y = ?``: plain columns, equality conditions only.
_KEYED_READ = re.compile(
    r"^\s*SELECT\s+(?P<columns>[a-z_]\w*(?:\s*,\s*[a-z_]\w*)*)\s+FROM\s+(?P<table>\w+)\s+WHERE\s+"
    r"(?P<conditions>\w+\s*=\s*\?(?:\s+AND\s+\w+\s*=\s*\?)*)\s*$",
    re.I | re.S,
)
_CONDITION = re.compile(r"(\w+)\s*=\s*\?")
#: Rows known per table, at most (the oldest are forgotten first).
CAPACITY = 4096


class Inserted(NamedTuple):
    """What an INSERT gives each column: the index of its ``?``, or a literal."""

    columns: tuple[tuple[str, bool, Any], ...]  # (column, from a parameter, its index or the literal)


class KeyedRead(NamedTuple):
    columns: tuple[str, ...]
    conditions: tuple[tuple[str, int], ...]  # (column, index of its ``?``)


@lru_cache(maxsize=4096)
def plain_insert(sql: str) -> Inserted | None:
    insert = _PLAIN_INSERT.match(sql)
    if insert is None:
        return None
    columns = [c.strip().lower() for c in insert["columns"].split(",")]
    values = insert["values"].split(",")
    if len(columns) != len(values):
        return None
    given: list[tuple[str, bool, Any]] = []
    index = 0
    for column, value in zip(columns, values, strict=True):
        one = _VALUE.match(value)
        if one is None:
            return None
        if one["param"]:
            given.append((column, True, index))
            index += 1
        elif one["null"]:
            given.append((column, False, None))
        elif one["text"] is not None:
            given.append((column, False, one["text"]))
        else:
            given.append((column, False, int(one["int"])))
    return Inserted(tuple(given))


@lru_cache(maxsize=4096)
def keyed_read(sql: str) -> KeyedRead | None:
    read = _KEYED_READ.match(sql)
    if read is None:
        return None
    columns = tuple(c.strip().lower() for c in read["columns"].split(","))
    conditions = tuple((column.lower(), index) for index, column in enumerate(_CONDITION.findall(read["conditions"])))
    return KeyedRead(columns, conditions)


class KnownRows:
    def __init__(self, shapes: dict[str, TableShape], row_class: Callable[[tuple[str, ...]], Any]) -> None:
        self._shapes = shapes
        #: Builds a row like the server's (by index, by name, ``keys()``) for these column names.
        self._row_class = row_class
        self._rows: dict[str, dict[tuple[Any, ...], dict[str, Any]]] = {}
        self.answered = 0

    def wrote(self, table: str, sql: str, args: tuple[Any, ...]) -> None:
        """``sql`` is about to write ``table``: remember the row a plain INSERT adds,
        apply a keyed UPDATE it can, and forget the table's rows on anything else."""
        shape = self._shapes.get(table)
        if shape is None or not shape.primary or not sql:
            self._rows.pop(table, None)
            return
        head = sql.lstrip()[:6].upper()
        if head == "INSERT":
            self._inserted(table, shape, sql, args)
            return
        known = self._rows.get(table)
        if not known:
            return
        update = keyed_update(sql) if head == "UPDATE" else None
        if update is None or shape.key is None or update.key != shape.key or update.key_index >= len(args):
            self._rows.pop(table, None)
            return
        try:
            key = (typed(shape.kinds.get(shape.key), args[update.key_index]),)
        except Unfit:
            self._rows.pop(table, None)
            return
        row = known.get(key)
        if row is None:
            return  # another row: this one is unchanged
        after = apply(update, shape.kinds, row, args)
        if after is None:
            del known[key]
        else:
            known[key] = after

    def _inserted(self, table: str, shape: TableShape, sql: str, args: tuple[Any, ...]) -> None:
        insert = plain_insert(sql)
        if insert is None:
            return  # an INSERT OR IGNORE, or one the cache cannot read: existing rows stay as they are
        row: dict[str, Any] = {}
        for column, from_param, what in insert.columns:
            kind = shape.kinds.get(column)
            if kind is None:
                continue
            try:
                row[column] = typed(kind, args[what] if from_param else what)
            except (Unfit, IndexError):
                continue
        if any(column not in row or row[column] is None for column in shape.primary):
            return
        known = self._rows.setdefault(table, {})
        known[tuple(row[column] for column in shape.primary)] = row
        if len(known) > CAPACITY:
            del known[next(iter(known))]

    def answer(self, table: str, sql: str, args: tuple[Any, ...]) -> list[Any] | None:
        """The rows of a read by a known row's whole primary key (None: not known)."""
        known = self._rows.get(table)
        shape = self._shapes.get(table)
        if not known or shape is None:
            return None
        read = keyed_read(sql)
        if read is None:
            return None
        wanted: dict[str, Any] = {}
        try:
            for column, index in read.conditions:
                if column in wanted or column not in shape.kinds:
                    return None
                wanted[column] = typed(shape.kinds[column], args[index])
        except (Unfit, IndexError):
            return None
        if not set(shape.primary) <= set(wanted):
            return None
        row = known.get(tuple(wanted[column] for column in shape.primary))
        if row is None or not set(read.columns) <= set(row) or not set(wanted) <= set(row):
            return None
        self.answered += 1
        if any(value is None or row[column] != value for column, value in wanted.items()):
            return []  # the row with that key fails another condition: no row
        return [self._row_class(read.columns)([row[column] for column in read.columns])]

    def clear(self) -> None:
        self._rows.clear()
