"""A read cache for a ledger with one writer.

A supervisor is the only writer of its ledger (of its partition, with
PostgreSQL: fencing makes it so). Its stores re-read the same rows many times per
action (an action row ten times, its run five), which costs nothing in SQLite
and a round trip each over a socket. So single-table reads are remembered until
that table is written, and a rolled-back transaction drops everything (it may
have read its own uncommitted rows). Joins and subqueries are never cached.

A write drops only what it may change. Most reads and writes name one row by
their first condition (``WHERE action_id = ? ...``): every row such a read
returns has that value, and every row such a write touches (or inserts) has
its own. So a write keyed on a column keeps the reads keyed on the same column
with another value (another agent's action, another run): with several agents
on one node, their writes no longer empty each other's reads. And an UPDATE
changes only the columns it assigns: a read that names none of them (a run's
``agent_id``, when its ``loop_index`` moves) stays. Anything the shapes below
do not prove (an ``OR``, a subquery, a write that moves the key, ``*``) drops
every read of the table, as before.

A row read whole by its table's key (``SELECT * FROM t WHERE key = ?``) is kept
up to date rather than dropped: a write of that one row by its key whose
assignments are plain values (``col = ?``, a literal, ``col = col + N``) puts the
new values in, typed as the server returns them (``learn``: the partition's
column types and single-column keys, from its catalog), and an ``INSERT ...
RETURNING *`` puts the row it returns there (``seeder``). The re-read of an
action after its move, or of a run after its loop advanced, then costs no round
trip. Anything else about the row (an expression, a subquery, a condition past
the key, a value of another type) drops it as before; a rolled-back transaction
drops everything.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterator
from functools import lru_cache
from typing import Any, NamedTuple

from corral.supervisor.ledger.known_rows import KnownRows
from corral.supervisor.ledger.row_patch import TableShape, apply, keyed_update, row_read

_WRITE = re.compile(r"^\s*(?:INSERT(?:\s+OR\s+\w+)?\s+INTO|UPDATE|DELETE\s+FROM|REPLACE\s+INTO)\s+(\w+)", re.I)
_READ = re.compile(r"^\s*SELECT\b.*?\bFROM\s+(\w+)\b(?P<rest>.*)$", re.I | re.S)
_NOT_CACHED = re.compile(r"\b(?:JOIN|SELECT|UNION|random|clock_timestamp|now)\b", re.I)
#: ``FROM a, b`` (or ``FROM a x, b``): a join, right after the first table's name.
#: Only there: a comma further on is a column list (``ORDER BY created_at, id``).
_COMMA_JOIN = re.compile(r"^\s*(?:\w+\s*)?,")
_DDL = re.compile(r"^\s*(?:CREATE|DROP|ALTER|BEGIN|COMMIT|ROLLBACK|SET|PRAGMA|SAVEPOINT|RELEASE)\b", re.I)


@lru_cache(maxsize=4096)
def classify(sql: str) -> tuple[str, str]:
    """("read", table) for a cacheable read, ("write", table), or ("other", "")."""
    write = _WRITE.match(sql)
    if write:
        return "write", write.group(1).lower()
    read = _READ.match(sql)
    if read and not _NOT_CACHED.search(read.group("rest")) and not _COMMA_JOIN.match(read.group("rest")):
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


#: A read's or a write's first condition, ``column = ?``; and what an UPDATE assigns.
_FIRST_EQUALS = re.compile(r"\bWHERE\s+(\w+)\s*=\s*\?", re.I)
_OR_OR_SUBQUERY = re.compile(r"\b(?:OR|SELECT)\b", re.I)
_UPDATE = re.compile(r"^\s*UPDATE\s+\w+\s+SET\b(?P<set>.*?)\bWHERE\b", re.I | re.S)
_ASSIGNED = re.compile(r"(\w+)\s*=")
_NAME = re.compile(r"\w+")
_INSERT = re.compile(
    r"^\s*INSERT(?:\s+OR\s+IGNORE)?\s+INTO\s+\w+\s*\((?P<columns>[\w\s,]+)\)\s*VALUES\s*\((?P<values>.*)\)"
    r"(?:\s*RETURNING\s+[\w\s,*]+)?\s*$",
    re.I | re.S,
)


def _top_level(values: str) -> list[str] | None:
    """``values`` split at its commas outside parentheses and quotes (None: its
    parentheses do not balance, e.g. several rows of VALUES)."""
    parts, depth, quote, start = [], 0, "", 0
    for position, char in enumerate(values):
        if quote:
            quote = "" if char == quote else quote
        elif char in ("'", '"'):
            quote = char
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth < 0:
                return None
        elif char == "," and depth == 0:
            parts.append(values[start:position])
            start = position + 1
    if depth or quote:
        return None
    parts.append(values[start:])
    return parts


#: Which rows a statement is about: (column, index of its ``?``), None: not proven.
RowKey = tuple[str, int] | None
#: What an INSERT writes, column by column: the index of its ``?`` (None: a literal).
Inserted = dict[str, int | None]


class WriteShape(NamedTuple):
    """What a write may change, as far as its text proves it (None: not proven)."""

    key: RowKey = None  # every row it touches has this column's value (UPDATE, DELETE)
    inserted: Inserted | None = None  # the row an INSERT ... VALUES adds
    assigned: frozenset[str] | None = None  # the only columns an UPDATE changes


#: A remembered read: the (column, value) all its rows have, and every name its
#: text holds (None: it reads ``*``, every column).
ReadEntry = tuple[tuple[str, Any] | None, frozenset[str] | None]


def _placeholder_index(sql: str, position: int) -> int:
    """How many ``?`` come before ``position``, outside quotes."""
    count, quote = 0, ""
    for char in sql[:position]:
        if quote:
            quote = "" if char == quote else quote
        elif char in ("'", '"'):
            quote = char
        elif char == "?":
            count += 1
    return count


@lru_cache(maxsize=4096)
def read_key(sql: str) -> RowKey:
    """A single-table read whose rows all have ``column = ?``'s value."""
    first = _FIRST_EQUALS.search(sql)
    if first is None or _OR_OR_SUBQUERY.search(sql, first.end()):
        return None
    return first.group(1).lower(), _placeholder_index(sql, first.end() - 1)


@lru_cache(maxsize=4096)
def read_names(sql: str) -> frozenset[str] | None:
    """Every name in a read (its columns among them); None when it reads ``*``."""
    return None if "*" in sql else frozenset(_NAME.findall(sql.lower()))


@lru_cache(maxsize=4096)
def write_shape(sql: str) -> WriteShape:
    """The rows an UPDATE or DELETE may touch (its first condition, when nothing
    else in it can reach other rows and an UPDATE leaves that column be), the
    columns an UPDATE changes, or what an INSERT ... VALUES writes."""
    head = sql.lstrip()[:6].upper()
    if head == "INSERT":
        insert = _INSERT.match(sql)
        if insert is None:
            return WriteShape()
        columns = [c.strip().lower() for c in insert["columns"].split(",")]
        split = _top_level(insert["values"])
        if split is None or len(columns) != len(split):
            return WriteShape()
        values = [v.strip() for v in split]
        inserted: Inserted = {}
        index = 0
        for column, value in zip(columns, values, strict=True):
            inserted[column] = index if value == "?" else None
            index += _placeholder_index(value, len(value))
        return WriteShape(inserted=inserted)
    if head not in ("UPDATE", "DELETE") or _OR_OR_SUBQUERY.search(sql, 1):
        return WriteShape()
    assigned: frozenset[str] | None = None
    if head == "UPDATE":
        update = _UPDATE.match(sql)
        if update is None or '"' in update["set"] or update["set"].lstrip().startswith("("):
            return WriteShape()
        assigned = frozenset(name.lower() for name in _ASSIGNED.findall(update["set"]))
    first = _FIRST_EQUALS.search(sql)
    if first is None or (assigned is not None and first.group(1).lower() in assigned):
        return WriteShape(assigned=assigned)
    return WriteShape(key=(first.group(1).lower(), _placeholder_index(sql, first.end() - 1)), assigned=assigned)


def _same(a: Any, b: Any) -> bool:
    """Whether two values may name the same rows (PostgreSQL compares '1' and 1 alike)."""
    return bool(a == b) or str(a) == str(b)


def _kept(read: ReadEntry, shape: WriteShape, args: tuple[Any, ...]) -> bool:
    """Whether a remembered read stays true after a write of ``shape``: it names
    none of the columns the write changes, or none of the rows."""
    keyed, names = read
    if shape.assigned is not None and names is not None and not names & shape.assigned:
        return True
    if keyed is None:
        return False
    column, value = keyed
    try:
        if shape.inserted is not None:
            index = shape.inserted.get(column)
            return index is not None and not _same(value, args[index])
        return shape.key is not None and shape.key[0] == column and not _same(value, args[shape.key[1]])
    except IndexError:
        return False


_RETURNING_ALL = re.compile(r"^\s*INSERT\b.*\bRETURNING\s+\*\s*$", re.I | re.S)


class ReadCache:
    def __init__(self, capacity: int = 8192) -> None:
        self.capacity = capacity
        self._rows: OrderedDict[tuple[str, tuple[Any, ...]], list[Any]] = OrderedDict()
        #: Each table's remembered reads, with the (column, value) all their rows have.
        self._by_table: dict[str, dict[tuple[str, tuple[Any, ...]], ReadEntry]] = {}
        self.hits = 0
        self.misses = 0
        #: The partition's tables as far as patching rows needs them (``learn``).
        self._shapes: dict[str, TableShape] = {}
        #: Writes per table so far: a row returned by an INSERT is put in only if
        #: nothing wrote its table between the INSERT and its answer.
        self._writes: dict[str, int] = {}
        self.patched = 0
        self._cleared = 0
        #: Writes of each open transaction, by its connection; transactions ended
        #: while a read was under way, with the clock at their end (``kept``).
        self._open: dict[object, list[tuple[str, str, tuple[Any, ...]]]] = {}
        self._ended: list[tuple[int, list[tuple[str, str, tuple[Any, ...]]]]] = []
        self._clock = 0
        self._under_way = 0
        #: Rows this writer inserted, answering reads by their key (``know_inserts``).
        self.known: KnownRows | None = None

    def know_inserts(self, row_class: Any) -> None:
        """Answer a read by a row's key from what this writer inserted (known_rows.py);
        ``row_class(names)``: the class of a row with those column names."""
        self.known = KnownRows(self._shapes, row_class)

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
        row_key = read_key(sql)
        keyed = (row_key[0], params[row_key[1]]) if row_key is not None and row_key[1] < len(params) else None
        self._by_table.setdefault(table, {})[key] = (keyed, read_names(sql))
        if len(self._rows) > self.capacity:
            old, _ = self._rows.popitem(last=False)
            for keys in self._by_table.values():
                keys.pop(old, None)

    def wrote(self, table: str, sql: str = "", args: tuple[Any, ...] = ()) -> None:
        """``sql`` (with ``args``) wrote ``table``: drop what it may have changed
        (without ``sql``: every read of the table)."""
        self._writes[table] = self._writes.get(table, 0) + 1
        if self.known is not None:
            self.known.wrote(table, sql, args)  # without sql: no keyed UPDATE, every row forgotten
        reads = self._by_table.get(table)
        if not reads:
            return
        patched = self._patched(table, sql, args) if sql else None
        shape = write_shape(sql) if sql else WriteShape()
        for key, entry in list(reads.items()):
            if not _kept(entry, shape, args):
                del reads[key]
                self._rows.pop(key, None)
        if patched is not None:
            self.put(table, *patched)
            self.patched += 1

    def learn(self, table: str, shape: TableShape) -> None:
        """``table``'s key and column types (from the partition's catalog)."""
        self._shapes[table.lower()] = shape

    def _patched(self, table: str, sql: str, args: tuple[Any, ...]) -> tuple[str, tuple[Any, ...], list[Any]] | None:
        """The row read whole by its key, with ``sql``'s assignments put in (None:
        not remembered, or not a write the cache can apply)."""
        shape = self._shapes.get(table)
        update = keyed_update(sql)
        if shape is None or update is None or update.key != shape.key or update.key_index >= len(args):
            return None
        read = (row_read(table, update.key), (args[update.key_index],))
        rows = self._rows.get(read)
        if rows is None or len(rows) > 1:
            return None
        if not rows:
            return (*read, [])  # no such row: the UPDATE changes nothing
        row = rows[0]
        names = row.keys()
        after = apply(update, shape.kinds, dict(zip(names, row, strict=True)), args)
        if after is None or set(after) != set(names):
            return None
        return (*read, [type(row)([after[name] for name in names])])

    def seeder(self, table: str, sql: str) -> Any:
        """For an ``INSERT ... RETURNING *`` into a table with a key: what puts the
        row it returns in the cache once its answer is read (None: nothing to do)."""
        shape = self._shapes.get(table)
        if shape is None or shape.key is None or not _RETURNING_ALL.match(sql):
            return None
        writes, cleared, key = self._writes.get(table, 0), self._cleared, shape.key

        def seed(rows: list[Any]) -> None:
            if len(rows) != 1 or self._writes.get(table, 0) != writes or self._cleared != cleared:
                return  # ignored (nothing inserted), or its table written (or the cache cleared) since
            try:
                value = rows[0][key]
            except IndexError:
                return
            self.put(table, row_read(table, key), (value,), list(rows))

        return seed

    def clear(self) -> None:
        self._rows.clear()
        self._by_table.clear()
        self._cleared += 1  # a row an INSERT returns after this is not put in
        if self.known is not None:
            self.known.clear()

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
            if rows is None and self.known is not None:
                rows = self.known.answer(table, sql, args)
                if rows is not None:
                    self.misses, self.hits = self.misses - 1, self.hits + 1
                    self.put(table, sql, args, rows)
            return kind, table, FetchedRows(rows) if rows is not None else None
        if kind == "write":
            self.wrote(table, sql, args)
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

    # -- several connections (a PostgreSQL writer's pool) --------------------------
    #
    # The writer's connections share this cache, and their transactions overlap.
    # A read on one connection does not see another's writes until they commit,
    # so its rows are kept only if no write that may change them belongs to a
    # transaction that was open at any time while the read was under way.

    def writing(self, owner: object, table: str, sql: str, args: tuple[Any, ...]) -> None:
        """``owner`` (a connection) writes, in its open transaction."""
        self._open.setdefault(owner, []).append((table, sql, args))

    def ended(self, owner: object) -> None:
        """``owner``'s transaction committed or rolled back."""
        writes = self._open.pop(owner, None)
        self._clock += 1
        if writes and self._under_way:
            self._ended.append((self._clock, writes))

    def reading(self) -> tuple[int, int]:
        """A read is sent: what ``kept`` needs to judge its rows."""
        self._under_way += 1
        return self._clock, self._cleared

    def kept(
        self,
        owner: object,
        table: str,
        sql: str,
        args: tuple[Any, ...],
        rows: list[Any] | None,
        mark: tuple[int, int],
    ) -> FetchedRows:
        """A read's rows (None: it failed), remembered unless a transaction other
        than its own connection's wrote what they may hold while it was under way
        (or the cache was emptied meanwhile)."""
        self._under_way -= 1
        since, cleared = mark
        if rows is not None and cleared == self._cleared and not self._touched(owner, table, sql, args, since):
            self.put(table, sql, args, rows)
        if not self._under_way:
            self._ended.clear()
        return FetchedRows(rows or [])

    def _touched(self, owner: object, table: str, sql: str, args: tuple[Any, ...], since: int) -> bool:
        row_key = read_key(sql)
        keyed = (row_key[0], args[row_key[1]]) if row_key is not None and row_key[1] < len(args) else None
        entry: ReadEntry = (keyed, read_names(sql))
        others = [writes for writer, writes in self._open.items() if writer is not owner]
        others += [writes for clock, writes in self._ended if clock > since]
        return any(
            written == table and not _kept(entry, write_shape(statement), values)
            for writes in others
            for written, statement, values in writes
        )
