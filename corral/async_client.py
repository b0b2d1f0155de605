"""``AsyncClient``: the Python client, and the one body of every client method.

It runs under asyncio and under trio (anyio, down to the control exchange in
``corral/mailbox/control.py``), so it fits FastAPI, LangGraph or Pydantic AI as
well as a trio program. ``corral.Client`` is the same methods run to completion,
one short trio loop per call (``corral/client.py``): nothing is written twice.

    async with corral.AsyncClient.start(spec="swarm.toml", home=".corral") as client:
        result = await client.run("writer", "Draft the release notes")
        async for event in client.events():
            print(event.kind, event.subject)
"""

from __future__ import annotations

import functools
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread

from corral.client_line import ControlLine
from corral.client_requests import decision_fingerprint, key_run_id, new_run_id
from corral.client_types import ApprovalView, Event, Pending, RunResult, ViewChanged, joined_pages
from corral.core.errors import LedgerLost, RunTimeout
from corral.core.procs import wait_exit
from corral.mailbox.control import ControlError, SupervisorGone
from corral.mailbox.errors import DeadlineExceeded
from corral.question_text import stable_response_id
from corral.supervisor.home import home_dir as homes

if TYPE_CHECKING:  # the ledger and the run layer load only when a home is read without a supervisor
    from collections.abc import Sequence

    from corral.client_spec import SpecSource, ToolSource
    from corral.offline_read import LedgerReader

T = TypeVar("T")
PathLike = str | Path
#: How long one events long-poll waits on the supervisor side.
FOLLOW_WAIT_MS = 25_000
#: How long one ``wait`` call blocks in the supervisor before the client asks again.
WAIT_SLICE_S = 20.0
#: Seconds between attempts of ``run`` creation when the reply was lost.
CREATE_RETRY_PAUSE_S = 0.2
#: Seconds between looks for the endpoint of a supervisor that is starting.
STARTING_POLL_S = 0.05


class AsyncClient:
    """A connection to the supervisor of one home, for asyncio and trio programs.

    Errors: ``NotRunning`` (no supervisor on the home), ``SupervisorGone`` (it went
    away mid-call; the next call reconnects to a restarted one), ``ControlError``
    (the supervisor refused: ``.code`` is stable), ``DeadlineExceeded`` (no answer
    in time), ``ClientClosed`` (the client was closed while the call was in
    flight); all are ``corral.CorralError``.

    Use ``async with`` (or ``await client.aclose()``). Any number of tasks may share
    one client, their calls in flight at once on one connection: a ``wait`` or an
    ``events(follow=True)`` long poll holds up no other call. One client belongs to
    one event loop.
    """

    def __init__(self, home: PathLike | None = None, *, timeout: float = 10.0) -> None:
        self._setup(homes.resolve_home(home), timeout)
        homes.read_endpoint(self.home)  # fail now, with NotRunning, if nothing runs there

    def _setup(self, home: Path, timeout: float) -> None:
        self.home: Path = home
        self.timeout = timeout
        self._line = ControlLine(home, timeout)
        self._process: subprocess.Popen[bytes] | None = None
        #: Where the reads go while no supervisor holds the home (``reading``); None: nowhere.
        self._ledger: LedgerReader | None = None
        self._read_ledger = False

    # -- lifecycle -------------------------------------------------------------------

    @classmethod
    def connect(cls, home: PathLike | None = None, *, timeout: float = 10.0) -> AsyncClient:
        """Connect to the supervisor already running on ``home`` (default: $CORRAL_HOME
        or ./.corral)."""
        return cls(home, timeout=timeout)

    @classmethod
    def reading(cls, home: PathLike | None = None, *, timeout: float = 10.0) -> AsyncClient:
        """A client that reads ``home`` whether or not a supervisor runs there.

        ``show``, ``runs``, ``transcript``, ``events`` (without ``follow``) and ``intent_receipts``
        go through the supervisor while one holds the home's lock (one that is
        starting is waited for, up to ``timeout``, then ``SupervisorStarting``), and
        answer from the home's ledger, read-only, while nobody does: nothing is
        written to the home, and the answers carry ``read_from: "ledger"``
        (``read_ledger`` says the last one did). Every other method needs a
        supervisor (``NotRunning``); so does a home that never had one."""
        from corral.offline_read import LedgerReader

        client = cls.__new__(cls)
        client._setup(homes.resolve_home(home), timeout)
        client._ledger = LedgerReader(client.home)
        return client

    @classmethod
    def cluster(cls, url: str, *, timeout: float = 10.0) -> AsyncClient:
        """A client on a host with no node: it talks to the cluster's PostgreSQL
        (``postgresql://...``) directly, as DBOS's client does. ``run`` queues a root
        run into the shared queue and a node with room takes it; ``show``, ``wait``,
        ``pending`` and ``status`` read the ledger; ``approve``, ``deny`` and
        ``cancel`` go to the node holding the run, through the ledger, and return once
        that node made them durable. Every other method needs a node
        (``ControlError`` ``needs-a-node``). Raises ``DoorError`` (a bad URL, an
        unreachable database, a refused login, no cluster there) before any call;
        the password is never said. docs/scale-out.md, "The front door"."""
        from corral.ledger_transport import LedgerTransport

        client = cls.__new__(cls)
        client._setup(homes.resolve_home(None), timeout)
        client._line.door = LedgerTransport(url, timeout)
        return client

    @property
    def ledger_url(self) -> str | None:
        """The cluster's database this client talks to (no password); None: a node's home."""
        return None if self._line.door is None else self._line.door.where

    @property
    def read_ledger(self) -> bool:
        """True when the last read was answered from the ledger, no supervisor running."""
        return self._read_ledger

    @property
    def ledger_behind(self) -> dict[str, Any] | None:
        """When the last read from the ledger (answered or refused) found it behind
        its high-water mark: the mark, what it holds, what was lost and what to do
        (corral/offline_read.py). None otherwise."""
        return self._ledger.behind if self._ledger is not None else None

    @classmethod
    @asynccontextmanager
    async def start(
        cls,
        spec: SpecSource | None = None,
        home: PathLike | None = None,
        *,
        tools: Sequence[ToolSource] = (),
        timeout: float = 30.0,
        stop_timeout: float = 30.0,
        ledger: str | None = None,
        node: str | None = None,
    ) -> AsyncIterator[AsyncClient]:
        """Start a supervisor for ``home`` with ``spec``, yield a client, and stop the
        supervisor on exit (gracefully, by its actors' shutdown specs).

        ``spec``: a TOML file, the spec as a dict (its relative paths are relative to
        the current directory), or a parsed ``SwarmSpec``. ``tools``: ``@corral.tool``
        functions and modules of them, added to the spec's ``[tools] modules``; the
        supervisor is another process and imports them by name, so a lambda, a closure
        or an unguarded script's function is refused (``ToolSourceError``).

        ``ledger`` (``postgresql://...``) makes it a node of a swarm that shares
        that database, with ``node`` as its id (default: from the host and home).

        Raises ``SpecError`` for a bad spec and ``SupervisorStartError`` if it did
        not become ready; in both cases nothing keeps running."""
        client = await cls._launch(spec, home, tools=tools, timeout=timeout, ledger=ledger, node=node)
        try:
            yield client
        finally:
            with anyio.CancelScope(shield=True):  # a cancelled caller still stops what it started
                await client._stop(stop_timeout)

    @classmethod
    async def _launch(
        cls,
        spec: SpecSource | None,
        home: PathLike | None,
        *,
        tools: Sequence[ToolSource] = (),
        timeout: float,
        ledger: str | None,
        node: str | None,
    ) -> AsyncClient:
        """What ``start`` does before its block: a ready supervisor and a client that
        owns its process (``_stop`` stops and reaps it)."""
        from corral.client_spec import start_spec
        from corral.client_start import start_supervisor

        resolved = homes.resolve_home(home)
        started = start_spec(resolved, spec, tools)
        starting = functools.partial(start_supervisor, resolved, started.path, timeout, ledger=ledger, node=node,
                                     env=started.environment(), checked=started.checked)
        process = await anyio.to_thread.run_sync(starting)
        try:
            client = cls(resolved)
        except BaseException:
            process.kill()
            process.wait()
            raise
        client._process = process
        return client

    async def _stop(self, timeout: float) -> None:
        """What ``start`` does after its block: ``down``, then ``close``."""
        try:
            await self.down(timeout)
        finally:
            self.close()

    async def down(self, timeout: float = 30.0) -> bool:
        """Stop the supervisor gracefully; True once it has exited (False: still up
        after ``timeout``). Stopping one that is not running is not an error."""
        if self._line.door is not None:
            raise ControlError("needs-a-node", "down stops a node: run it on the node's host")
        try:
            endpoint = homes.read_endpoint(self.home)
        except homes.NotRunning:
            return True
        try:
            await self.call("down")
        except SupervisorGone:
            pass  # gone before it answered: the outcome asked for
        self.close()
        stopped = await anyio.to_thread.run_sync(wait_exit, endpoint.pid, timeout)
        if self._process is not None and stopped:
            await anyio.to_thread.run_sync(self._process.wait)
            self._process = None
        return stopped

    def close(self) -> None:
        """Drop the connection now (``aclose`` is the same, awaited). Calls in flight
        on this client fail at once with ``ClientClosed``; the supervisor keeps
        running (``down`` stops it), and a later call connects again."""
        self._line.close()

    async def aclose(self) -> None:
        """``close``, awaited as asyncio and trio code closes things: ``await client.aclose()``."""
        self.close()
        await anyio.lowlevel.checkpoint()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    # -- the wire ----------------------------------------------------------------------

    async def call(self, /, method: str, *, timeout: float | None = None, **params: Any) -> Any:
        """One control call (the escape hatch for methods without a helper). Calls of
        several tasks run at once, each on its own nng context of the one connection.
        A client of a cluster's database (``cluster``) asks its front door instead."""
        return await self._line.call(method, timeout, **params)

    # -- supervisor ---------------------------------------------------------------------

    async def ping(self) -> dict[str, Any]:
        result: dict[str, Any] = await self.call("ping")
        return result

    async def status(self) -> dict[str, Any]:
        """The supervision tree: actors, groups, boots and what is still open."""
        result: dict[str, Any] = await self.call("status")
        return result

    async def ask(self, actor_id: str, message: dict[str, Any], *, timeout: float = 10.0) -> dict[str, Any]:
        """Send a request to an actor (a user template's ``handle_ask``) and return its reply."""
        result: dict[str, Any] = await self.call(
            "request_actor", timeout=timeout + 5, actor_id=actor_id, body=message, timeout_s=timeout
        )
        return result

    # -- runs ----------------------------------------------------------------------------

    async def run(
        self,
        agent: str,
        task: str = "",
        *,
        wait: bool = True,
        timeout: float = 300.0,
        script: str | None = None,
        run_id: str | None = None,
        retry_s: float = 10.0,
        intent: dict[str, Any] | str | None = None,
        goal: str | dict[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> RunResult:
        """Start a run of ``agent`` on ``task``. With ``wait`` (default) return once
        it ended or parked (raise ``RunTimeout`` after ``timeout`` seconds);
        otherwise return at once. ``script`` is a scripted-provider script (TOML or
        JSON text) for this run. ``intent`` binds the run to an intent contract (a
        ``{envelope, projection}`` document or a bare TaskContractLite, as a map or
        as its JSON text; see docs/intent.md): an invalid one leaves the run
        unbound and advisory, with the reason in ``show()``. ``goal`` binds the
        run to a goal (docs/long-tasks.md): the first task when ``task`` is empty,
        and the standard its completion is judged against.

        The run id is chosen here (or given) and sent with the request: when the
        supervisor is gone or silent, the request is sent again for up to
        ``retry_s`` seconds (a restarted supervisor included), and a retry whose
        first attempt was committed returns that run, never a second one.
        ``idempotency_key`` (instead of ``run_id``): your own key for this run; it
        names one run across a cluster (``key_run_id``), so the same key given
        again, to any node or the cluster's front door, returns that run."""
        if run_id is not None and idempotency_key is not None:
            raise ValueError("give run_id or idempotency_key, not both")
        if idempotency_key is not None:
            run_id = key_run_id(idempotency_key)
        params: dict[str, Any] = {"agent_id": agent, "task": task, "run_id": run_id or new_run_id()}
        if script is not None:
            params["script"] = script
        if intent is not None:
            params["intent"] = intent
        if goal is not None:
            params["goal"] = goal  # the first task too, when no task is given
        deadline = anyio.current_time() + retry_s
        while True:
            try:
                created = await self.call("run", **params)
                break
            except (SupervisorGone, DeadlineExceeded, homes.NotRunning, LedgerLost):
                # LedgerLost: a cluster's database went away mid-call (``cluster``).
                if anyio.current_time() >= deadline:
                    raise
                await anyio.sleep(CREATE_RETRY_PAUSE_S)
        if wait:
            return await self.wait(created["run_id"], timeout=timeout)
        return await self.show(created["run_id"])

    async def show(self, run_id: str) -> RunResult:
        shown = await self._from_ledger(lambda ledger: ledger.show(run_id))
        return RunResult.from_show(shown if shown is not None else await self.call("show", run_id=run_id))

    async def wait(self, run_id: str, *, timeout: float = 300.0, until_parked: bool = True) -> RunResult:
        """Block until the run is done (or parked, unless ``until_parked=False``)."""
        until = "settled" if until_parked else "done"
        deadline = anyio.current_time() + timeout
        while True:
            # One blocking call that the supervisor answers when the run gets there:
            # no show per event, so waiting costs the run nothing.
            wait_s = max(0.0, min(deadline - anyio.current_time(), WAIT_SLICE_S))
            reply = await self.call(
                "wait", timeout=wait_s + 10, run_ids=[run_id], until=until, wait_ms=int(wait_s * 1000)
            )
            if reply["reached"]:
                return await self.show(run_id)
            if anyio.current_time() >= deadline:
                raise RunTimeout(run_id, reply["runs"][run_id], timeout)

    async def runs(self) -> list[dict[str, Any]]:
        read = await self._from_ledger(lambda ledger: ledger.runs())
        runs: list[dict[str, Any]] = read if read is not None else (await self.call("runs"))["runs"]
        return runs

    async def cancel(self, run_id: str) -> dict[str, Any]:
        """Cancel a run (its live isolated children get tombstones)."""
        result: dict[str, Any] = await self.call("cancel", run_id=run_id)
        return result

    async def resume(self, run_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await self.call("resume", run_id=run_id)
        return result

    async def transcript(self, run_id: str, turn: int | None = None) -> dict[str, Any]:
        """What the run's model was sent and answered, turn by turn (docs/transcripts.md):
        all turns, or only ``turn`` (1-based, its system prompt in full). A long
        transcript comes in pages, joined here."""
        read = await self._from_ledger(lambda ledger: ledger.transcript(run_id, turn))
        if read is not None:
            return read
        shown: dict[str, Any] = await self.call("transcript", run_id=run_id,
                                                **({} if turn is None else {"turn": turn}))
        page = shown
        while page.get("next_turn"):
            page = await self.call("transcript", run_id=run_id, from_turn=page["next_turn"])
            shown["turns"].extend(page["turns"])
        shown["next_turn"] = None
        return shown

    async def intent_receipts(self, run_id: str) -> dict[str, Any]:
        """A run's intent decision receipts, and the binding they were judged by
        (its own or inherited: docs/intent.md)."""
        read = await self._from_ledger(lambda ledger: ledger.intent_receipts(run_id))
        result: dict[str, Any] = read if read is not None else await self.call("intent.receipts", run_id=run_id)
        return result

    # -- people in the loop -------------------------------------------------------------

    async def pending(self) -> Pending:
        """Actions waiting for approve/deny or reconcile, and scheduled provider retries."""
        return Pending.from_reply(await self.call("pending"))

    async def approval(self, action_id: str, *, page: int = 1, all_pages: bool = False) -> ApprovalView:
        """What approving ``action_id`` would approve: its tool, arguments (secrets
        masked), effect class, policy, the diff of a file write, and the fingerprint
        to pass to ``approve``. Long values come in pages (``page``, from 1); with
        ``all_pages`` every page is read and joined into whole values."""
        if not all_pages:
            return ApprovalView.from_reply(await self.call("approval.show", action_id=action_id, page=page))
        for _attempt in range(3):
            first = await self.call("approval.show", action_id=action_id, page=1)
            pages = [first]
            while len(pages) < ApprovalView.from_reply(first).pages:
                pages.append(await self.call("approval.show", action_id=action_id, page=len(pages) + 1))
            try:
                return ApprovalView.from_reply(joined_pages(pages))
            except ViewChanged:
                continue  # a file changed between two pages: read them again
        raise ControlError("view-changed", f"the approval view of {action_id} kept changing while it was read")

    async def approve(self, action_id: str, *, fingerprint: str | None = None) -> dict[str, Any]:
        """Let a waiting action run. The fingerprint (default: the one ``pending()``
        shows) makes sure you approve what you saw."""
        return await self._decide(action_id, "approve", fingerprint)

    async def deny(self, action_id: str, *, fingerprint: str | None = None) -> dict[str, Any]:
        return await self._decide(action_id, "deny", fingerprint)

    async def _decide(self, action_id: str, decision: str, fingerprint: str | None) -> dict[str, Any]:
        if fingerprint is None:
            fingerprint = decision_fingerprint(await self.pending(), action_id)
        result: dict[str, Any] = await self.call(
            "continue_action", action_id=action_id, decision=decision, fingerprint=fingerprint
        )
        return result

    async def reconcile(self, action_id: str, outcome: str, note: str) -> dict[str, Any]:
        """Say what really happened to an action (or provider request slot, or process
        session) whose outcome was unknown: ``outcome`` is ``"ok"`` or ``"failed"``."""
        # A cluster node may pass it to the node holding the action's partition and
        # wait for that one's answer (up to 20 s): more than a plain call's timeout.
        result: dict[str, Any] = await self.call("reconcile", timeout=max(self.timeout, 30.0), action_id=action_id,
                                                 outcome=outcome, note=note)
        return result

    # -- interactive runs -----------------------------------------------------------------

    async def steer(self, run_id: str, text: str, steer_id: str | None = None) -> dict[str, Any]:
        """Add an instruction (at most 4 KiB of UTF-8) to a live root run. It is
        committed before this returns and applied once, at the run's next safe
        boundary: a provider turn in flight is interrupted, a stale plan discarded,
        an action waiting for approval or under way is kept (the steer applies after
        its receipt). ``steer_id``: the caller's id, so a retry records nothing new."""
        params: dict[str, Any] = {"run_id": run_id, "text": text}
        if steer_id is not None:
            params["steer_id"] = steer_id
        result: dict[str, Any] = await self.call("steer", **params)
        return result

    # -- goal mode (docs/interactive.md "Goal mode") ---------------------------------------

    async def goal_status(self, run_id: str) -> dict[str, Any]:
        """The run's goal: text, revision, lifecycle status, verdicts, what still blocks it."""
        result: dict[str, Any] = await self.call("goal.status", run_id=run_id)
        return result

    async def goal_pause(self, run_id: str) -> dict[str, Any]:
        """Pause the run's goal: a provider turn in flight is interrupted and the run
        parks at its next safe boundary, with no provider call until resumed."""
        result: dict[str, Any] = await self.call("goal.pause", run_id=run_id)
        return result

    async def goal_resume(self, run_id: str) -> dict[str, Any]:
        """Resume a paused goal: the same run goes on."""
        result: dict[str, Any] = await self.call("goal.resume", run_id=run_id)
        return result

    async def goal_edit(
        self,
        run_id: str,
        text: str | None = None,
        *,
        constraints: list[str] | None = None,
        verification: list[str] | None = None,
        expected_revision: int | None = None,
    ) -> dict[str, Any]:
        """A new goal text, constraints or verification list (None: kept): bumps the
        goal's revision, blocks the actions made for the old goal that have not
        started, and reaches the run as a steer. ``expected_revision``: refused
        unless the goal is still at that revision (a retry of the same edit is not)."""
        params: dict[str, Any] = {"run_id": run_id}
        for key, value in (("text", text), ("constraints", constraints), ("verification", verification),
                           ("expected_revision", expected_revision)):
            if value is not None:
                params[key] = value
        result: dict[str, Any] = await self.call("goal.edit", **params)
        return result

    async def goal_clear(self, run_id: str) -> dict[str, Any]:
        """Clear the goal: its run is cancelled; its history is kept."""
        result: dict[str, Any] = await self.call("goal.clear", run_id=run_id)
        return result

    async def answer(
        self,
        run_id: str,
        text: str | None = None,
        *,
        request_id: str,
        response_id: str | None = None,
        answers: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Answer the structured question ``request_id`` (``user.input_request``; the
        ``req-...`` id ``pending()`` shows) of the run: ``answers`` maps each question
        id to an option label (or free text); ``text`` alone answers a one-question
        request. ``response_id`` (default: one derived from the request and the
        answers, so the same call again is the same response) makes it idempotent:
        the same response again returns the same result with ``repeated``; another
        one after the answer is refused."""
        params: dict[str, Any] = {
            "run_id": run_id,
            "request_id": request_id,
            "response_id": response_id or stable_response_id(request_id, answers, text),
        }
        for key, value in (("text", text), ("answers", answers)):
            if value is not None:
                params[key] = value
        result: dict[str, Any] = await self.call("answer", **params)
        return result

    async def conversation(self, agent_id: str) -> str:
        """A new conversation (chat session) with an agent; returns its id."""
        return str((await self.call("conversation.new", agent_id=agent_id))["conversation_id"])

    async def send(self, conversation_id: str, text: str, *, goal: bool = False,
                   request_id: str | None = None, response_id: str | None = None) -> dict[str, Any]:
        """One chat line: answers the question ``request_id`` (the one the caller
        showed; the response id defaults to one derived from the request and the
        line), steers the live run, or starts the next turn. ``as`` in the reply
        says which; a line that names no request while the live run waits for an
        answer is refused, naming the request. ``goal=True`` starts the next turn as
        a goal run (seed 004 V1.18): the text is its goal, and a live run or another
        live goal of the conversation refuses it."""
        params: dict[str, Any] = {"conversation_id": conversation_id, "text": text}
        if goal:
            params["goal"] = True
        if request_id is not None:
            params["request_id"] = request_id
            params["response_id"] = response_id or stable_response_id(request_id, None, text)
        result: dict[str, Any] = await self.call("conversation.send", **params)
        return result

    async def fork(self, conversation_id: str) -> str:
        """A new conversation holding this one's turns as persisted now."""
        return str((await self.call("conversation.fork", conversation_id=conversation_id))["conversation_id"])

    # -- events ---------------------------------------------------------------------------

    async def events(self, since: int = 0, *, follow: bool = False) -> AsyncIterator[Event]:
        """Events after cursor ``since``; with ``follow`` keep waiting for new ones
        (an endless iterator: break out of it)."""
        cursor: int | None = since
        while cursor is not None:
            page, cursor = await self._events_page(cursor, follow=follow)
            for event in page:
                yield event

    async def _events_page(self, since: int, *, follow: bool = False) -> tuple[list[Event], int | None]:
        """One page of ``events``: the events after ``since`` and the cursor to ask
        from next, or None once the stream has ended (``follow`` never ends it)."""
        if not follow:
            rows = await self._from_ledger(lambda ledger: ledger.events(since))
            if rows is not None:
                read = [Event.from_row(row) for row in rows]
                return read, read[-1].cursor if read else None
        wait_ms = FOLLOW_WAIT_MS if follow else 0
        reply = await self.call("events", timeout=wait_ms / 1000 + 15, since=since, wait_ms=wait_ms)
        page = [Event.from_row(row) for row in reply["events"]]
        if not page and not follow:
            return page, None
        return page, reply["cursor"]

    # -- reading without a supervisor ---------------------------------------------------

    async def _from_ledger(self, read: Callable[[LedgerReader], T]) -> T | None:
        """``read``'s answer from the home's ledger, when this client reads one
        (``reading``) and no supervisor holds the home; None: ask the supervisor,
        which holds it (one that is starting has been waited for)."""
        self._read_ledger = False
        if self._ledger is None:
            return None
        from corral.offline_read import HomeHeld

        while True:
            try:
                answer = await anyio.to_thread.run_sync(read, self._ledger)
            except HomeHeld:
                if await self._supervisor_answers():
                    return None
                continue  # it let the home go without starting: the ledger is free again
            self._read_ledger = True
            return answer

    async def _supervisor_answers(self) -> bool:
        """Wait until the supervisor that holds the home has written its endpoint
        (True), or has let the home go without (False: it did not start).
        ``SupervisorStarting`` after ``timeout``: its ledger is not read meanwhile."""
        from corral.offline_read import SupervisorStarting

        deadline = anyio.current_time() + self.timeout
        while True:
            try:
                homes.read_endpoint(self.home)
                return True
            except homes.NotRunning:
                if not homes.is_locked(self.home):
                    return False
            if anyio.current_time() >= deadline:
                raise SupervisorStarting(
                    f"a supervisor is starting on {self.home}: it holds the home's lock and has not answered in"
                    f" {self.timeout:g}s, and its ledger is not read behind its back; try again (its log:"
                    f" {self.home / 'logs' / 'supervisor.log'})"
                )
            await anyio.sleep(STARTING_POLL_S)
