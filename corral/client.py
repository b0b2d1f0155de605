"""The Python client: drive a supervisor from Python over the control protocol.

``Client`` (synchronous) and ``AsyncClient`` (trio, in ``corral.async_client``)
speak the same control protocol as the CLI; the CLI is a thin layer on ``Client``.

    with corral.Client.start(spec="swarm.toml", home=".corral") as client:
        result = client.run("writer", "Draft the release notes")
        print(result.status, result.final_reply)
"""

from __future__ import annotations

import secrets
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import trio

from corral.client_types import Event, Pending, RunResult
from corral.core.errors import CorralError, RunTimeout
from corral.core.procs import wait_exit
from corral.mailbox.control import ControlClient, ControlError, SupervisorGone
from corral.mailbox.errors import DeadlineExceeded
from corral.supervisor import home as homes

PathLike = str | Path
#: How long one events long-poll waits on the supervisor side.
FOLLOW_WAIT_MS = 25_000
#: How long one ``wait`` call blocks in the supervisor before the client asks again.
WAIT_SLICE_S = 20.0
#: Seconds between attempts of ``run`` creation when the reply was lost.
CREATE_RETRY_PAUSE_S = 0.2


def connect(home: Path, timeout: float = 10.0) -> ControlClient:
    endpoint = homes.read_endpoint(home)
    return ControlClient(endpoint.control, endpoint.token, timeout=timeout, pid=endpoint.pid)


def call(home: Path, method: str, timeout: float = 10.0, **params: Any) -> Any:
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


def new_run_id() -> str:
    """A client-chosen run id: sent with the create request, it makes a retried
    ``run`` return the run created by a lost first attempt instead of a second one."""
    return "run-c" + secrets.token_hex(12)


def _refuse_inside_trio() -> None:
    try:
        trio.lowlevel.current_task()
    except RuntimeError:
        return  # not inside trio: the normal case
    raise CorralError("corral.Client is synchronous and cannot run inside trio; use corral.AsyncClient there")


def decision_fingerprint(pending: Pending, action_id: str) -> str:
    for action in pending.actions:
        if action["action_id"] == action_id and action["phase"] == "waiting-confirmation":
            return str(action["fingerprint"])
    raise ControlError("not-waiting", f"action {action_id} is not waiting for confirmation (see pending())")


class Client:
    """A synchronous connection to the supervisor of one home.

    Errors: ``NotRunning`` (no supervisor on the home), ``SupervisorGone`` (it went
    away mid-call), ``ControlError`` (the supervisor refused: ``.code`` is stable),
    ``DeadlineExceeded`` (no answer in time); all are ``corral.CorralError``.

    One client per thread. Inside a trio program use ``corral.AsyncClient``: each
    call of this one runs its own short trio loop.
    """

    def __init__(self, home: PathLike | None = None, *, timeout: float = 10.0) -> None:
        _refuse_inside_trio()
        self.home = homes.resolve_home(home)
        self.timeout = timeout
        self._control: ControlClient | None = None
        self._process: subprocess.Popen[bytes] | None = None
        homes.read_endpoint(self.home)  # fail now, with NotRunning, if nothing runs there

    # -- lifecycle -------------------------------------------------------------------

    @classmethod
    def connect(cls, home: PathLike | None = None, *, timeout: float = 10.0) -> Client:
        """Connect to the supervisor already running on ``home`` (default: $CORRAL_HOME
        or ./.corral)."""
        return cls(home, timeout=timeout)

    @classmethod
    @contextmanager
    def start(
        cls,
        spec: PathLike | None = None,
        home: PathLike | None = None,
        *,
        timeout: float = 30.0,
        stop_timeout: float = 30.0,
        ledger: str | None = None,
        node: str | None = None,
    ) -> Iterator[Client]:
        """Start a supervisor for ``home`` with ``spec``, yield a client, and stop the
        supervisor on exit (gracefully, by its actors' shutdown specs).

        ``ledger`` (``postgresql://...``) makes it a node of a swarm that shares
        that database, with ``node`` as its id (default: from the host and home).

        Raises ``SpecError`` for a bad spec and ``SupervisorStartError`` if it did
        not become ready; in both cases nothing keeps running."""
        from corral.client_start import start_supervisor

        _refuse_inside_trio()
        resolved = homes.resolve_home(home)
        process = start_supervisor(
            resolved, Path(spec) if spec is not None else None, timeout, ledger=ledger, node=node
        )
        try:
            client = cls(resolved)
        except BaseException:
            process.kill()
            process.wait()
            raise
        client._process = process
        try:
            yield client
        finally:
            try:
                client.down(stop_timeout)
            finally:
                client.close()

    def down(self, timeout: float = 30.0) -> bool:
        """Stop the supervisor gracefully; True once it has exited (False: still up
        after ``timeout``). Stopping one that is not running is not an error."""
        try:
            endpoint = homes.read_endpoint(self.home)
        except homes.NotRunning:
            return True
        try:
            self.call("down")
        except SupervisorGone:
            pass  # gone before it answered: the outcome asked for
        self.close()
        stopped = wait_exit(endpoint.pid, timeout)
        if self._process is not None and stopped:
            self._process.wait()
            self._process = None
        return stopped

    def close(self) -> None:
        if self._control is not None:
            self._control.close()
            self._control = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the wire ----------------------------------------------------------------------

    def call(self, method: str, *, timeout: float | None = None, **params: Any) -> Any:
        """One control call (the escape hatch for methods without a helper)."""
        _refuse_inside_trio()
        if self._control is None:
            self._control = connect(self.home, self.timeout)  # re-reads the endpoint: a restart is found
        try:
            return self._control.call(method, timeout, **params)
        except (SupervisorGone, DeadlineExceeded):
            # The socket may hold a half-finished exchange: start clean next time
            # (a restarted supervisor also has a new address and token).
            self.close()
            raise

    # -- supervisor ---------------------------------------------------------------------

    def ping(self) -> dict[str, Any]:
        result: dict[str, Any] = self.call("ping")
        return result

    def status(self) -> dict[str, Any]:
        """The supervision tree: actors, groups, boots and what is still open."""
        result: dict[str, Any] = self.call("status")
        return result

    def ask(self, actor_id: str, message: dict[str, Any], *, timeout: float = 10.0) -> dict[str, Any]:
        """Send a request to an actor (a user template's ``handle_ask``) and return its reply."""
        result: dict[str, Any] = self.call(
            "request_actor", timeout=timeout + 5, actor_id=actor_id, body=message, timeout_s=timeout
        )
        return result

    # -- runs ----------------------------------------------------------------------------

    def run(
        self,
        agent: str,
        task: str = "",
        *,
        wait: bool = True,
        timeout: float = 300.0,
        script: str | None = None,
        run_id: str | None = None,
        retry_s: float = 10.0,
        intent: dict[str, Any] | None = None,
        goal: str | None = None,
    ) -> RunResult:
        """Start a run of ``agent`` on ``task``. With ``wait`` (default) return once
        it ended or parked (raise ``RunTimeout`` after ``timeout`` seconds);
        otherwise return at once. ``script`` is a scripted-provider script (TOML or
        JSON text) for this run. ``intent`` binds the run to an intent contract (an
        envelope or a bare TaskContractLite; see docs/intent.md): an invalid one
        leaves the run unbound, with the reason in ``show()``. ``goal`` binds the
        run to a goal (docs/long-tasks.md): the first task when ``task`` is empty,
        and the standard its completion is judged against.

        The run id is chosen here (or given) and sent with the request: when the
        supervisor is gone or silent, the request is sent again for up to
        ``retry_s`` seconds (a restarted supervisor included), and a retry whose
        first attempt was committed returns that run, never a second one."""
        params: dict[str, Any] = {"agent_id": agent, "task": task, "run_id": run_id or new_run_id()}
        if script is not None:
            params["script"] = script
        if intent is not None:
            params["intent"] = intent
        if goal is not None:
            params["goal"] = goal  # the first task too, when no task is given
        deadline = time.monotonic() + retry_s
        while True:
            try:
                created = self.call("run", **params)
                break
            except (SupervisorGone, DeadlineExceeded, homes.NotRunning):
                if time.monotonic() >= deadline:
                    raise
                time.sleep(CREATE_RETRY_PAUSE_S)
        return self.wait(created["run_id"], timeout=timeout) if wait else self.show(created["run_id"])

    def show(self, run_id: str) -> RunResult:
        return RunResult.from_show(self.call("show", run_id=run_id))

    def wait(self, run_id: str, *, timeout: float = 300.0, until_parked: bool = True) -> RunResult:
        """Block until the run is done (or parked, unless ``until_parked=False``)."""
        until = "settled" if until_parked else "done"
        deadline = time.monotonic() + timeout
        while True:
            # One blocking call that the supervisor answers when the run gets there:
            # no show per event, so waiting costs the run nothing.
            wait_s = max(0.0, min(deadline - time.monotonic(), WAIT_SLICE_S))
            reply = self.call("wait", timeout=wait_s + 10, run_ids=[run_id], until=until, wait_ms=int(wait_s * 1000))
            if reply["reached"]:
                return self.show(run_id)
            if time.monotonic() >= deadline:
                raise RunTimeout(run_id, reply["runs"][run_id], timeout)

    def runs(self) -> list[dict[str, Any]]:
        runs: list[dict[str, Any]] = self.call("runs")["runs"]
        return runs

    def cancel(self, run_id: str) -> dict[str, Any]:
        """Cancel a run (its live isolated children get tombstones)."""
        result: dict[str, Any] = self.call("cancel", run_id=run_id)
        return result

    def resume(self, run_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self.call("resume", run_id=run_id)
        return result

    # -- people in the loop -------------------------------------------------------------

    def pending(self) -> Pending:
        """Actions waiting for approve/deny or reconcile, and scheduled provider retries."""
        return Pending.from_reply(self.call("pending"))

    def approve(self, action_id: str, *, fingerprint: str | None = None) -> dict[str, Any]:
        """Let a waiting action run. The fingerprint (default: the one ``pending()``
        shows) makes sure you approve what you saw."""
        return self._decide(action_id, "approve", fingerprint)

    def deny(self, action_id: str, *, fingerprint: str | None = None) -> dict[str, Any]:
        return self._decide(action_id, "deny", fingerprint)

    def _decide(self, action_id: str, decision: str, fingerprint: str | None) -> dict[str, Any]:
        if fingerprint is None:
            fingerprint = decision_fingerprint(self.pending(), action_id)
        result: dict[str, Any] = self.call(
            "continue_action", action_id=action_id, decision=decision, fingerprint=fingerprint
        )
        return result

    def reconcile(self, action_id: str, outcome: str, note: str) -> dict[str, Any]:
        """Say what really happened to an action (or provider request slot, or process
        session) whose outcome was unknown: ``outcome`` is ``"ok"`` or ``"failed"``."""
        result: dict[str, Any] = self.call("reconcile", action_id=action_id, outcome=outcome, note=note)
        return result

    # -- interactive runs -----------------------------------------------------------------

    def steer(self, run_id: str, text: str) -> dict[str, Any]:
        """Add an instruction to a live run. It is committed before this returns and
        applied once, at the run's next safe boundary (a stale plan is discarded)."""
        result: dict[str, Any] = self.call("steer", run_id=run_id, text=text)
        return result

    def answer(self, run_id: str, text: str) -> dict[str, Any]:
        """Answer the run's open question (``user.input_request``); once only."""
        result: dict[str, Any] = self.call("answer", run_id=run_id, text=text)
        return result

    def conversation(self, agent_id: str) -> str:
        """A new conversation (chat session) with an agent; returns its id."""
        return str(self.call("conversation.new", agent_id=agent_id)["conversation_id"])

    def send(self, conversation_id: str, text: str) -> dict[str, Any]:
        """One chat line: answers the open question, steers the live run, or starts
        the next turn. ``as`` in the reply says which."""
        result: dict[str, Any] = self.call("conversation.send", conversation_id=conversation_id, text=text)
        return result

    def fork(self, conversation_id: str) -> str:
        """A new conversation holding this one's turns as persisted now."""
        return str(self.call("conversation.fork", conversation_id=conversation_id)["conversation_id"])

    # -- events ---------------------------------------------------------------------------

    def events(self, since: int = 0, *, follow: bool = False) -> Iterator[Event]:
        """Events after cursor ``since``; with ``follow`` keep waiting for new ones
        (an endless iterator: break out of it)."""
        cursor = since
        while True:
            wait_ms = FOLLOW_WAIT_MS if follow else 0
            reply = self.call("events", timeout=wait_ms / 1000 + 15, since=cursor, wait_ms=wait_ms)
            for row in reply["events"]:
                yield Event.from_row(row)
            if not reply["events"] and not follow:
                return
            cursor = reply["cursor"]
