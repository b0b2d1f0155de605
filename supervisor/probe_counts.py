"""What the supervisor does per operation, counted for bench/ (``bench.count``).

Two counts, taken only while a bench asks for them (``[supervisor] probes = true``):

* SQL statements the ledger's connection runs (SQLite's own trace of each
  statement, BEGIN and COMMIT included; a trigger's statements are not counted
  apart from the statement that fired them), by shape, so that a bench can say
  which ones are left;
* Python calls in the supervisor's main thread (function and builtin calls, from a
  profile hook on that thread only: the fsync and link threads are not in it).

Both slow the supervisor down while on: a bench measures CPU with them off.
"""

from __future__ import annotations

import re
import sqlite3
import sys
from collections import Counter
from types import FrameType
from typing import Any

#: Literals in a traced statement (SQLite traces it with its values bound).
_LITERAL = re.compile(r"'(?:[^']|'')*'|\bX'[0-9A-Fa-f]*'|\b\d+(?:\.\d+)?(?:e[+-]?\d+)?\b")
#: The statement shapes kept by text at most (the rest are counted, not named).
MAX_SHAPES = 2000
#: Functions named in a count's answer, most called first.
MAX_FUNCTIONS = 400


def statement_shape(sql: str) -> str:
    """``sql`` with its literals as ``?`` and its whitespace folded: one shape per
    statement the code writes, whatever values it ran with."""
    return " ".join(_LITERAL.sub("?", sql).split())


class ProbeCounts:
    """Counts between ``start`` and ``stop``; ``stop`` returns them."""

    def __init__(self, connection: object) -> None:
        #: The ledger's SQLite connection; None for a backend that has none (PostgreSQL).
        self.connection = connection if isinstance(connection, sqlite3.Connection) else None
        #: Statements run, by shape (``statement_shape``).
        self.statements: Counter[str] = Counter()
        #: Calls by function: (file, name), a builtin as (its caller's file, "caller>builtin").
        self.functions: Counter[tuple[str, str]] = Counter()
        self.calls = 0
        self.on = False
        self._last = ""
        self._inside = False

    def _traced(self, sql: str) -> None:
        # The counting itself is not the supervisor's work: the profile hook skips it.
        self._inside = True
        try:
            self._count_statement(sql)
        finally:
            self._inside = False

    def _count_statement(self, sql: str) -> None:
        if sql.startswith("--"):
            return  # a trigger's statement, part of the one that fired it
        # Python 3.11 traces a trigger that fires, and each statement in it, with the
        # text of the statement that fired it: a write traced again at once with the
        # same values (its timestamps too) is that one statement. A read fires no
        # trigger, so a read twice in a row is two reads, and counted so.
        repeated = sql == self._last and sql.lstrip()[:6].upper() != "SELECT"
        self._last = sql
        if repeated:
            return
        shape = statement_shape(sql)
        if len(self.statements) < MAX_SHAPES or shape in self.statements:
            self.statements[shape] += 1
        else:
            self.statements["(other)"] += 1

    def _profiled(self, frame: FrameType, event: str, arg: Any) -> None:
        if self._inside or frame.f_code is _TRACED:
            return
        if event == "call":
            self.calls += 1
            code = frame.f_code
            self.functions[(code.co_filename, code.co_name)] += 1
        elif event == "c_call":
            self.calls += 1
            # A builtin by its caller too: ``len`` alone says nothing of who needs it.
            code = frame.f_code
            self.functions[(code.co_filename, f"{code.co_name}>{getattr(arg, '__qualname__', '?')}")] += 1

    def start(self) -> None:
        """Count from now on; called on the supervisor's main thread, which the
        profile hook then covers."""
        self.statements.clear()
        self.functions.clear()
        self.calls = 0
        self.on = True
        if self.connection is not None:
            self.connection.set_trace_callback(self._traced)
        sys.setprofile(self._profiled)

    def stop(self) -> dict[str, Any]:
        """Stop counting: {"calls", "statements" (None: the backend traces none),
        "shapes": {statement shape: count}, "functions": {"folder/file.py:name": calls}, the
        ``MAX_FUNCTIONS`` most called}."""
        sys.setprofile(None)
        if self.connection is not None:
            self.connection.set_trace_callback(None)
        self.on = False
        return {
            "calls": self.calls,
            "statements": self.statements.total() if self.connection is not None else None,
            "shapes": dict(self.statements),
            "functions": {
                f"{_short(file)}:{name}": count for (file, name), count in self.functions.most_common(MAX_FUNCTIONS)
            },
        }


#: The trace callback's code: its call is the probe's, not the supervisor's.
_TRACED = ProbeCounts._traced.__code__


def _short(file: str) -> str:
    """A source file as its folder and name (``runs/action_store.py``)."""
    return "/".join(file.rsplit("/", 2)[-2:])
