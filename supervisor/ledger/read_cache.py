"""A read cache for a ledger with one writer.

A supervisor is the only writer of its ledger (of its partition, with
PostgreSQL: fencing makes it so). Its stores re-read the same rows many times per
action (an action row ten times, its run five), which costs nothing in SQLite
and a round trip each over a socket. So single-table reads are remembered until
that table is written: every write statement drops every remembered read of
the tables it names, and a rolled-back transaction drops everything (it may
have read its own uncommitted rows). Joins and subqueries are never cached.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

_WRITE = re.compile(r"^\s*(?:INSERT(?:\s+OR\s+\w+)?\s+INTO|UPDATE|DELETE\s+FROM|REPLACE\s+INTO)\s+(\w+)", re.I)
_READ = re.compile(r"^\s*SELECT\b.*?\bFROM\s+(\w+)\b(?P<rest>.*)$", re.I | re.S)
_NOT_CACHED = re.compile(r"\b(?:JOIN|SELECT|UNION|random|clock_timestamp|now)\b|,\s*\w+\s*(?:WHERE|$)", re.I)
_DDL = re.compile(r"^\s*(?:CREATE|DROP|ALTER|BEGIN|COMMIT|ROLLBACK|SET|PRAGMA|SAVEPOINT|RELEASE)\b", re.I)


@lru_cache(maxsize=4096)
def classify(sql: str) -> tuple[str, str]:
    """("read", table) for a cacheable read, ("write", table), or ("other", "")."""
    write = _WRITE.match(sql)
    if write:
        return "write", write.group(1).lower()
    read = _READ.match(sql)
    if read and not _NOT_CACHED.search(read.group("rest")):
        return "read", read.group(1).lower()
    if _DDL.match(sql) or not read:
        return "other", ""
    return "uncached", ""


class FetchedRows:
    """Rows already read (from the cache), as a cursor offers them."""

    def __init__(self, rows: list[Any]) -> None:
        self._rows = rows
        self._next = 0
        self.rowcount = len(rows)

    def fetchone(self) -> Any:
        if self._next >= len(self._rows):
            return None
        self._next += 1
        return self._rows[self._next - 1]

    def fetchall(self) -> list[Any]:
        rest, self._next = self._rows[self._next :], len(self._rows)
        return rest

    def __iter__(self) -> Iterator[Any]:
        return iter(self.fetchall())


class ReadCache:
    def __init__(self, capacity: int = 8192) -> None:
        self.capacity = capacity
        self._rows: OrderedDict[tuple[str, tuple[Any, ...]], list[Any]] = OrderedDict()
        self._by_table: dict[str, set[tuple[str, tuple[Any, ...]]]] = {}
        self.hits = 0
        self.misses = 0

    def get(self, sql: str, params: tuple[Any, ...]) -> list[Any] | None:
        rows = self._rows.get((sql, params))
        if rows is None:
            self.misses += 1
            return None
        self._rows.move_to_end((sql, params))
        self.hits += 1
        return rows

    def put(self, table: str, sql: str, params: tuple[Any, ...], rows: list[Any]) -> None:
        key = (sql, params)
        self._rows[key] = rows
        self._by_table.setdefault(table, set()).add(key)
        if len(self._rows) > self.capacity:
            old, _ = self._rows.popitem(last=False)
            for keys in self._by_table.values():
                keys.discard(old)

    def wrote(self, table: str) -> None:
        for key in self._by_table.pop(table, ()):
            self._rows.pop(key, None)

    def clear(self) -> None:
        self._rows.clear()
        self._by_table.clear()

    def before(self, sql: str, args: tuple[Any, ...]) -> tuple[str, str, FetchedRows | None]:
        """Before a statement runs: its kind and table, and the answer when the
        cache has it. A write drops what was read of its table; anything else
        that is not a plain read (DDL, PRAGMA) drops everything."""
        kind, table = classify(sql)
        if kind == "read":
            try:
                rows = self.get(sql, args)
            except TypeError:  # an unhashable parameter: read it
                return "uncached", table, None
            return kind, table, FetchedRows(rows) if rows is not None else None
        if kind == "write":
            self.wrote(table)
        elif kind == "other":
            self.clear()
        return kind, table, None

    def after(self, kind: str, table: str, sql: str, args: tuple[Any, ...], cursor: Any) -> Any:
        """After it ran: a read's rows are remembered (and served as fetched)."""
        if kind != "read":
            return cursor
        rows = list(cursor.fetchall())
        self.put(table, sql, args, rows)
        return FetchedRows(rows)
