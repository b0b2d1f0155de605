"""The wire to a PostgreSQL ledger: connecting, rows that behave like sqlite3.Row,
and a connection that speaks SQLite's dialect and sends a transaction's
statements in psycopg's pipeline mode.

supervisor/ledger/ledger_pg.py builds the ledger on it: transactions, the fence, the
commit marker.
"""

from __future__ import annotations

import itertools
import re
import select
from collections.abc import Callable, Iterator, Sequence
from functools import lru_cache
from typing import Any, ClassVar
from urllib.parse import urlsplit, urlunsplit

from corral.core.errors import CorralError
from corral.supervisor.ledger.cooperative import wait_socket
from corral.supervisor.ledger.read_cache import ReadCache
from corral.supervisor.ledger.row_patch import KINDS, TableShape
from corral.supervisor.ledger.sql_dialect import to_postgres


class PostgresUnavailable(CorralError, RuntimeError):
    pass


def redact_url(url: str) -> str:
    """The URL without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = (parts.username or "") + ":***"
    return urlunsplit(parts._replace(netloc=f"{user}@{netloc[1]}"))


# -- rows that behave like sqlite3.Row ------------------------------------------------


class _Row(tuple[Any, ...]):
    """By index, by name and ``keys()``, as sqlite3.Row: the stores use all three."""

    _names: tuple[str, ...] = ()
    _index: ClassVar[dict[str, int]] = {}

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            try:
                return tuple.__getitem__(self, self._index[key])
            except KeyError:
                raise IndexError(f"no such column: {key}") from None
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        return list(self._names)


@lru_cache(maxsize=1024)
def _row_class(names: tuple[str, ...]) -> type[_Row]:
    index: dict[str, int] = {}
    for position, name in enumerate(names):
        index.setdefault(name, position)  # the first of duplicate names, as SQLite
    return type("Row", (_Row,), {"_names": names, "_index": index, "__slots__": ()})


def _row_factory(cursor: Any) -> Callable[[Sequence[Any]], _Row]:
    description = cursor.description
    if description is None:
        return lambda values: _Row(values)
    cls = _row_class(tuple(column.name for column in description))
    return lambda values: cls(values)


def connect(url: str, application: str = "corral", timeout: int = 10) -> Any:
    """A connection in autocommit mode; ``application`` names it in
    ``pg_stat_activity`` (which node and what for: an operator can tell them apart)."""
    try:
        import psycopg
        from psycopg.adapt import Dumper, Loader
    except ImportError:
        raise PostgresUnavailable("the PostgreSQL ledger needs psycopg 3: pip install 'corral[postgres]'") from None

    class BoolAsInteger(Dumper):
        # SQLite stores booleans as 0/1 and the stores compare them so.
        oid = psycopg.adapters.types["int8"].oid

        def dump(self, obj: Any) -> bytes:
            return b"1" if obj else b"0"

    class NumericAsNumber(Loader):
        # SUM/AVG give numeric: SQLite gives int or float, and JSON wants those.
        def load(self, data: Any) -> Any:
            text = bytes(data).decode()
            return int(text) if text.lstrip("-").isdigit() else float(text)

    try:
        # The connection's own cursors (migrations, the cluster tables, the lease)
        # bind on the client: values travel as literals, typed from their context.
        # A ledger's statements go through Connection below, bound by the server.
        conn = psycopg.connect(
            url,
            autocommit=True,
            row_factory=_row_factory,
            connect_timeout=timeout,
            cursor_factory=psycopg.ClientCursor,
            application_name=application[:63],
        )
    except psycopg.Error as exc:
        raise PostgresUnavailable(f"cannot reach the PostgreSQL ledger at {redact_url(url)}: {exc}") from None
    conn.adapters.register_dumper(bool, BoolAsInteger)
    conn.adapters.register_loader("numeric", NumericAsNumber)
    return conn


def table_shapes(conn: Any, schema: str) -> dict[str, TableShape]:
    """Each table of ``schema``: its single-column primary key and the columns whose
    values the read cache can type (read_cache.py keeps rows read by their key up
    to date with them). One catalog read, when a writer opens its partition."""
    rows = conn.execute(
        "SELECT c.relname, a.attname, a.atttypid::int,"
        " COALESCE(a.attnum = ANY(i.indkey), false)"
        " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped"
        " LEFT JOIN pg_index i ON i.indrelid = c.oid AND i.indisprimary"
        " WHERE n.nspname = %s AND c.relkind = 'r' ORDER BY c.relname, a.attnum",
        (schema,),
    ).fetchall()
    primary: dict[str, list[str]] = {}
    kinds: dict[str, dict[str, str]] = {}
    for table, column, oid, is_key in rows:
        primary.setdefault(table, [])
        if is_key:
            primary[table].append(column)
        kind = KINDS.get(int(oid))
        if kind is not None:
            kinds.setdefault(table, {})[column] = kind
    return {
        table: TableShape(columns[0] if len(columns) == 1 else None, kinds.get(table, {}), tuple(columns))
        for table, columns in primary.items()
    }


class _Pipelined:
    """A statement sent in a pipeline: its answer is read when somebody asks (its
    rows, its row count). Reading it is one round trip, which also carries every
    statement queued before it."""

    __slots__ = ("_connection", "_next", "_rows", "on_rows", "result")

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self.result: Any = None
        self._rows: list[Any] | None = None
        self._next = 0
        #: Called with the rows once they are read (the read cache's seeder).
        self.on_rows: Callable[[list[Any]], None] | None = None

    def _answered(self) -> Any:
        if self.result is None:
            self._connection.flush()
        return self.result

    @property
    def rowcount(self) -> int:
        count = self._answered().command_tuples
        return -1 if count is None else int(count)

    def _loaded(self) -> list[Any]:
        if self._rows is None:
            self._rows = self._connection.rows_of(self._answered())
            if self.on_rows is not None:
                self.on_rows(self._rows)
        return self._rows

    def fetchone(self) -> Any:
        rows = self._loaded()
        if self._next >= len(rows):
            return None
        self._next += 1
        return rows[self._next - 1]

    def fetchall(self) -> list[Any]:
        rows = self._loaded()
        rest, self._next = rows[self._next :], len(rows)
        return rest

    def __iter__(self) -> Iterator[Any]:
        return iter(self.fetchall())


#: A statement is prepared on the server from its second use (a one-off, such as
#: an ``IN (...)`` of some length, is not), and at most this many per connection.
PREPARE_FROM_USE = 2
PREPARED_MAX = 2048
#: What is prepared: queries, not transaction control (BEGIN, SET LOCAL, COMMIT, ROLLBACK).
_PREPARABLE = re.compile(r"\s*(?:SELECT|INSERT|UPDATE|DELETE|WITH)\b", re.IGNORECASE)


class Connection:
    """What a store's ``db.execute(sql, params)`` talks to: SQLite's dialect in,
    PostgreSQL out, in libpq's pipeline mode (through psycopg's ``pq`` layer).

    Round trips cost nothing with SQLite and most of the time with a server, so
    statements are *queued*: sent with the next one that needs an answer (a
    read's rows, a row count, the COMMIT), all in one write to the socket and one
    round trip. Values are bound by the server (typed by psycopg's adapters; a
    str is left for the server to type from its context, as a literal would be)
    and a statement used again is prepared on the server, which then neither
    parses nor plans it again. In a transaction a statement that fails aborts
    the rest of the pipeline: the first error is raised and the transaction
    rolls back whole.

    psycopg's own ``Pipeline`` object was measured first (bench notes in
    docs/performance.md): it writes to the socket at every statement, and cost
    more client CPU per transaction than the multi-statement strings it would
    have replaced. libpq's pipeline mode, driven here, sends a round trip's
    statements with one write.

    With ``cache`` (the writer's own ledger only), repeated single-table reads
    are answered from supervisor/ledger/read_cache.py.
    """

    def __init__(self, conn: Any, cache: ReadCache | None = None) -> None:
        self.cache = cache
        if cache is not None and cache.known is None:
            cache.know_inserts(_row_class)  # one writer's connections share what it inserted
        #: Round trips to the server (what the bench divides by actions).
        self.round_trips = 0
        #: What opens the open transaction, sent with its first statement (None: no transaction).
        self._opening: list[str] | None = None
        self._sent = False
        self.conn = conn

    @property
    def conn(self) -> Any:
        return self._conn

    @conn.setter
    def conn(self, conn: Any) -> None:
        """A new connection (the first, or after a lost one) has nothing prepared."""
        from psycopg.adapt import Transformer

        self._conn = conn
        conn.prepare_threshold = None  # psycopg's own preparing would DEALLOCATE ALL after a ROLLBACK
        self._transformer = Transformer(conn)
        self._encoding = conn.info.encoding
        self._uses: dict[tuple[str, tuple[int, ...]], int] = {}
        self._prepared: dict[tuple[str, tuple[int, ...]], bytes] = {}
        self._names = itertools.count()
        #: Sent and not yet answered, in order: a handle, or None for an answer nobody reads.
        self._queued: list[_Pipelined | None] = []

    @property
    def in_transaction(self) -> bool:
        return self._opening is not None

    @property
    def sent(self) -> bool:
        """Whether the open transaction sent anything (an empty one ends unsent)."""
        return self._sent

    def begin(self, opening: list[str]) -> None:
        """A transaction opened by ``opening`` (BEGIN first), which travels with
        its first statement: a transaction that runs none costs no round trip."""
        self._opening = opening
        self._sent = False

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        args = tuple(params)
        cache = self.cache
        if cache is None:
            return self.send(to_postgres(sql), args)
        kind, table, hit = cache.before(sql, args)
        if hit is not None:
            return hit
        if kind == "write":
            # Known to the cache until this connection's transaction ends: a read on
            # another connection meanwhile does not see it, and is not kept.
            cache.writing(self, table, sql, args)
            try:
                handle = self.send(to_postgres(sql), args)
            finally:
                if self._opening is None:
                    cache.ended(self)  # answered already (no transaction)
            handle.on_rows = cache.seeder(table, sql)
            return handle
        if kind != "read":
            return self.send(to_postgres(sql), args)
        mark = cache.reading()
        rows: list[Any] | None = None
        try:
            # A request run cooperatively may let others run while it waits here.
            rows = list(self.send(to_postgres(sql), args).fetchall())
        finally:
            answer = cache.kept(self, table, sql, args, rows, mark)
        return answer

    def send(self, statement: str, args: tuple[Any, ...] = ()) -> Any:
        """``statement`` (psycopg's ``%s`` style) with ``args``. In a transaction it
        is queued and answered on demand; outside one it is answered at once."""
        if self._opening is None:
            handle = self._queue(statement, args)
            self.flush()
            return handle
        if not self._sent:
            self._sent = True
            for opening in self._opening:
                self._queue(opening, (), answer=False)
        return self._queue(statement, args)

    def _queue(self, statement: str, args: tuple[Any, ...], *, answer: bool = True) -> _Pipelined | None:
        pgconn = self._conn.pgconn
        if not self._queued:
            self._enter(pgconn)
        text = numbered(statement)
        if args:
            from psycopg.adapt import PyFormat

            values = self._transformer.dump_sequence(args, [PyFormat.AUTO] * len(args))
            types, formats = tuple(self._transformer.types or ()), self._transformer.formats
        else:
            values, types, formats = None, (), None
        key = (text, types)
        name = self._prepared.get(key)
        if name is None:
            uses = self._uses.get(key, 0) + 1
            self._uses[key] = uses
            if uses >= PREPARE_FROM_USE and len(self._prepared) < PREPARED_MAX and _PREPARABLE.match(text):
                # Never a name used before on this connection: one whose PREPARE
                # failed may exist or not, so names are not reused.
                name = f"corral_{next(self._names)}".encode()
                pgconn.send_prepare(name, text.encode(), param_types=types or None)
                self._queued.append(None)
                self._prepared[key] = name
        if name is None:
            pgconn.send_query_params(text.encode(), values, param_types=types or None, param_formats=formats)
        else:
            pgconn.send_query_prepared(name, values, param_formats=formats)
        handle = _Pipelined(self) if answer else None
        self._queued.append(handle)
        return handle

    def _enter(self, pgconn: Any) -> None:
        from psycopg import pq

        if pgconn.pipeline_status == pq.PipelineStatus.OFF:
            pgconn.enter_pipeline_mode()

    def flush(self) -> None:
        """One round trip: everything queued goes out in one write, every answer
        comes back; the first statement that failed raises here (a prepared
        statement it would have created is forgotten)."""
        if not self._queued:
            return
        from psycopg import errors, pq

        pgconn = self._conn.pgconn
        queued, self._queued = self._queued, []
        self.round_trips += 1
        failure: Exception | None = None
        try:
            _send_all(pgconn)
            for handle in queued:
                result = self._next_result(pgconn)
                while self._next_result(pgconn, until_none=True) is not None:
                    pass  # a statement's end (libpq ends each one's results with none)
                if result.status == pq.ExecStatus.FATAL_ERROR and failure is None:
                    failure = errors.error_from_result(result, encoding=self._encoding)
                elif handle is not None:
                    handle.result = result
            self._next_result(pgconn)  # the sync
            pgconn.exit_pipeline_mode()
        except BaseException:
            self._prepared.clear()  # which of them exist is unknown: a new connection follows
            raise
        if failure is not None:
            # Prepared statements sent after the failure were not created.
            self._prepared.clear()
            self._uses.clear()
            raise failure

    def _next_result(self, pgconn: Any, *, until_none: bool = False) -> Any:
        while pgconn.is_busy():
            _wait_for(pgconn.socket, select.POLLIN)
            pgconn.consume_input()
        result = pgconn.get_result()
        if result is None and not until_none:
            import psycopg

            raise psycopg.OperationalError("the server's answers ended early: the connection is out of step")
        return result

    def rows_of(self, result: Any) -> list[Any]:
        """A result's rows, loaded by psycopg's adapters, as rows like sqlite3.Row."""
        transformer = self._transformer
        transformer.set_pgresult(result)
        names = tuple(result.fname(i).decode(self._encoding) for i in range(result.nfields))
        cls = _row_class(names)
        return transformer.load_rows(0, result.ntuples, cls)

    def commit(self, closing: Sequence[tuple[str, tuple[Any, ...]]] = ()) -> None:
        """``closing`` (the commit marker), then COMMIT, and wait for all of it:
        one round trip for whatever the transaction had not waited for yet."""
        for statement, args in closing:
            self._queue(statement, args, answer=False)
        self._queue("COMMIT", (), answer=False)
        self.flush()
        self._end()

    def abandon(self) -> None:
        """End the open transaction with ROLLBACK (when it sent anything); what was
        queued and not read is dropped. A failure here means the connection is
        gone (the caller finds out on its next statement)."""
        sent = self._sent
        self._end()
        if not sent:
            return
        try:
            self._queued = []
            pgconn = self._conn.pgconn
            from psycopg import pq

            if pgconn.pipeline_status != pq.PipelineStatus.OFF:
                # Answers left unread from an abandoned round trip: a fresh start.
                self._drain(pgconn)
            self.send("ROLLBACK")
        except Exception:
            pass

    def _drain(self, pgconn: Any) -> None:
        from psycopg import pq

        _send_all(pgconn)
        while True:
            result = self._next_result(pgconn, until_none=True)
            if result is not None and result.status == pq.ExecStatus.PIPELINE_SYNC:
                break
            if result is not None and result.status == pq.ExecStatus.FATAL_ERROR:
                self._prepared.clear()  # a PREPARE after it may not have been made
        pgconn.exit_pipeline_mode()

    def _end(self) -> None:
        self._opening = None
        self._sent = False
        if self.cache is not None:
            self.cache.ended(self)


def _wait_for(fd: int, event: int) -> int:
    """Wait until the connection's socket is ready (poll: a supervisor may hold
    more than select's 1,024 descriptors); the events that are. A request run
    cooperatively lets other requests run meanwhile (cooperative.py)."""
    return wait_socket(fd, event)


def _send_all(pgconn: Any) -> None:
    """End the pipeline with a sync and write all of it. Answers are read into
    libpq's buffer meanwhile: a server whose output nobody reads stops reading its
    input, and a long pipeline would then never finish going out (libpq's advice
    for pipeline mode)."""
    pgconn.pipeline_sync()
    while pgconn.flush():
        if _wait_for(pgconn.socket, select.POLLOUT | select.POLLIN) & select.POLLIN:
            pgconn.consume_input()


@lru_cache(maxsize=4096)
def numbered(statement: str) -> str:
    """psycopg's placeholders (``%s``, ``%%``) as the server's (``$1``..., ``%``)."""
    out: list[str] = []
    number = 0
    index = 0
    while index < len(statement):
        char = statement[index]
        if char == "%" and index + 1 < len(statement):
            following = statement[index + 1]
            if following == "s":
                number += 1
                out.append(f"${number}")
                index += 2
                continue
            if following == "%":
                out.append("%")
                index += 2
                continue
        out.append(char)
        index += 1
    return "".join(out)
