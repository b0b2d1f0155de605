"""``Client``: the synchronous face of ``AsyncClient``.

Every method is ``AsyncClient``'s (same name, parameters, return type and
docstring), run to completion in a short trio loop per call: one body, in
``corral/async_client.py``, and nothing here can drift from it. The CLI is a thin
layer on ``Client``.

    with corral.Client.start(spec="swarm.toml", home=".corral") as client:
        result = client.run("writer", "Draft the release notes")
        print(result.status, result.final_reply)

A loop per call (as this client always ran), not a background thread holding
one: a client has no thread to stop and never keeps the interpreter from exiting
when it is not closed. trio, because ``trio.run`` keeps no state between calls
and also runs in a thread where an asyncio loop is running (``asyncio.run``
refuses there).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

import trio

from corral.async_client import AsyncClient, PathLike
from corral.client_requests import connect
from corral.client_types import Event
from corral.core.errors import CorralError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from corral.client_spec import SpecSource, ToolSource

P = ParamSpec("P")
T = TypeVar("T")


def call(home: Path, method: str, timeout: float = 10.0, **params: Any) -> Any:
    """One control call to the supervisor of ``home``, on a connection of its own."""
    with connect(home, timeout) as client:
        return client.call(method, **params)


def all_events(home: Path, since: int = 0) -> list[dict[str, Any]]:
    """Every event after ``since``. The supervisor answers in pages bounded by
    count and bytes (so a reply always fits a frame); this follows the cursor."""
    events: list[dict[str, Any]] = []
    while True:
        page = call(home, "events", since=since, limit=5000)
        if not page["events"]:
            return events
        events.extend(page["events"])
        since = page["cursor"]


def _refuse_inside_trio() -> None:
    try:
        trio.lowlevel.current_task()
    except RuntimeError:
        return  # not inside trio: the normal case
    raise CorralError("corral.Client is synchronous and cannot run inside trio; use corral.AsyncClient there")


def _block_on(function: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs) -> T:
    _refuse_inside_trio()
    return trio.run(functools.partial(function, *args, **kwargs))


def _blocking(method: Callable[Concatenate[AsyncClient, P], Awaitable[T]]) -> Callable[Concatenate[Client, P], T]:
    """``method`` of the client's ``AsyncClient``, run to completion."""

    @functools.wraps(method)
    def blocking(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return _block_on(method, self._async, *args, **kwargs)

    blocking.__qualname__ = f"Client.{method.__name__}"  # help(Client) lists it as its own
    return blocking


class Client:
    """A synchronous connection to the supervisor of one home.

    Errors: ``NotRunning`` (no supervisor on the home), ``SupervisorGone`` (it went
    away mid-call; the next call reconnects to a restarted one), ``ControlError``
    (the supervisor refused: ``.code`` is stable), ``DeadlineExceeded`` (no answer
    in time); all are ``corral.CorralError``.

    One client per thread. Inside a trio program use ``corral.AsyncClient``: each
    call of this one runs its own short trio loop. The methods are
    ``AsyncClient``'s; ``events`` is an iterator here.
    """

    def __init__(self, home: PathLike | None = None, *, timeout: float = 10.0) -> None:
        _refuse_inside_trio()
        self._async = AsyncClient(home, timeout=timeout)

    @classmethod
    def _over(cls, client: AsyncClient) -> Client:
        facade = cls.__new__(cls)
        facade._async = client
        return facade

    @property
    def home(self) -> Path:
        return self._async.home

    @property
    def timeout(self) -> float:
        return self._async.timeout

    # -- lifecycle -------------------------------------------------------------------

    @classmethod
    def connect(cls, home: PathLike | None = None, *, timeout: float = 10.0) -> Client:
        """Connect to the supervisor already running on ``home`` (default: $CORRAL_HOME
        or ./.corral)."""
        return cls(home, timeout=timeout)

    @classmethod
    def reading(cls, home: PathLike | None = None, *, timeout: float = 10.0) -> Client:
        """A client that reads ``home`` whether or not a supervisor runs there: from
        its ledger, read-only, while none does (see ``AsyncClient.reading``)."""
        _refuse_inside_trio()
        return cls._over(AsyncClient.reading(home, timeout=timeout))

    @classmethod
    def cluster(cls, url: str, *, timeout: float = 10.0) -> Client:
        """A client on a host with no node, talking to the cluster's PostgreSQL
        directly (see ``AsyncClient.cluster``)."""
        _refuse_inside_trio()
        return cls._over(AsyncClient.cluster(url, timeout=timeout))

    @property
    def ledger_url(self) -> str | None:
        """See ``AsyncClient.ledger_url``."""
        return self._async.ledger_url

    @property
    def read_ledger(self) -> bool:
        """True when the last read was answered from the ledger, no supervisor running."""
        return self._async.read_ledger

    @property
    def ledger_behind(self) -> dict[str, Any] | None:
        """See ``AsyncClient.ledger_behind``."""
        return self._async.ledger_behind

    @classmethod
    @contextmanager
    def start(
        cls,
        spec: SpecSource | None = None,
        home: PathLike | None = None,
        *,
        tools: Sequence[ToolSource] = (),
        timeout: float = 30.0,
        stop_timeout: float = 30.0,
        ledger: str | None = None,
        node: str | None = None,
    ) -> Iterator[Client]:
        """Start a supervisor for ``home`` with ``spec``, yield a client, and stop the
        supervisor on exit (see ``AsyncClient.start``: ``spec`` may be a dict, ``tools``
        ``@corral.tool`` functions and modules)."""
        launched = _block_on(AsyncClient._launch, spec, home, tools=tools, timeout=timeout, ledger=ledger, node=node)
        try:
            yield cls._over(launched)
        finally:
            _block_on(launched._stop, stop_timeout)

    down = _blocking(AsyncClient.down)

    def close(self) -> None:
        self._async.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the methods, one body each in AsyncClient ------------------------------------------

    call = _blocking(AsyncClient.call)
    ping = _blocking(AsyncClient.ping)
    status = _blocking(AsyncClient.status)
    ask = _blocking(AsyncClient.ask)
    run = _blocking(AsyncClient.run)
    show = _blocking(AsyncClient.show)
    wait = _blocking(AsyncClient.wait)
    runs = _blocking(AsyncClient.runs)
    intent_receipts = _blocking(AsyncClient.intent_receipts)
    transcript = _blocking(AsyncClient.transcript)
    cancel = _blocking(AsyncClient.cancel)
    resume = _blocking(AsyncClient.resume)
    pending = _blocking(AsyncClient.pending)
    approval = _blocking(AsyncClient.approval)
    approve = _blocking(AsyncClient.approve)
    deny = _blocking(AsyncClient.deny)
    reconcile = _blocking(AsyncClient.reconcile)
    steer = _blocking(AsyncClient.steer)
    goal_status = _blocking(AsyncClient.goal_status)
    goal_pause = _blocking(AsyncClient.goal_pause)
    goal_resume = _blocking(AsyncClient.goal_resume)
    goal_edit = _blocking(AsyncClient.goal_edit)
    goal_clear = _blocking(AsyncClient.goal_clear)
    answer = _blocking(AsyncClient.answer)
    conversation = _blocking(AsyncClient.conversation)
    send = _blocking(AsyncClient.send)
    fork = _blocking(AsyncClient.fork)

    def events(self, since: int = 0, *, follow: bool = False) -> Iterator[Event]:
        """Events after cursor ``since``; with ``follow`` keep waiting for new ones
        (an endless iterator: break out of it). One loop per page: a generator
        cannot outlive the loop it was started in."""
        cursor: int | None = since
        while cursor is not None:
            page, cursor = _block_on(self._async._events_page, cursor, follow=follow)
            yield from page
