"""``AsyncClient``: the Python client for trio programs (same methods as ``Client``,
awaitable; ``events`` is an async iterator)."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from corral.client import CREATE_RETRY_PAUSE_S, FOLLOW_WAIT_MS, WAIT_SLICE_S, PathLike, decision_fingerprint, new_run_id
from corral.client_types import Event, Pending, RunResult
from corral.core.errors import RunTimeout
from corral.core.procs import wait_exit
from corral.mailbox.codec import decode, encode
from corral.mailbox.control import ControlClient, ControlError, SupervisorGone
from corral.mailbox.envelope import Envelope, Kind
from corral.mailbox.errors import DeadlineExceeded
from corral.supervisor import home as homes


class _AsyncControl(ControlClient):
    """The control client's exchange, awaited in the caller's trio loop."""

    async def acall(self, method: str, timeout: float | None = None, **params: Any) -> Any:
        request = Envelope(Kind.REQUEST, "cli", "supervisor", {"method": method, "params": params}, token=self._token)
        reply = decode(await self._exchange(encode(request), self.timeout if timeout is None else timeout))
        if reply.kind is Kind.ERROR:
            raise ControlError(str(reply.body.get("code")), str(reply.body.get("message")))
        if reply.corr_id != request.msg_id:
            raise ControlError("bad-reply", "reply does not match the request id")
        return reply.body.get("result")


class AsyncClient:
    """A trio connection to the supervisor of one home. Use ``async with``.

    Calls are serialized on one socket (a lock), so several tasks may share a
    client; for parallel long-polls open one client per task."""

    def __init__(self, home: PathLike | None = None, *, timeout: float = 10.0) -> None:
        self.home: Path = homes.resolve_home(home)
        self.timeout = timeout
        self._control: _AsyncControl | None = None
        self._lock = trio.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        homes.read_endpoint(self.home)

    @classmethod
    def connect(cls, home: PathLike | None = None, *, timeout: float = 10.0) -> AsyncClient:
        """Connect to the supervisor already running on ``home``."""
        return cls(home, timeout=timeout)

    @classmethod
    @asynccontextmanager
    async def start(
        cls,
        spec: PathLike | None = None,
        home: PathLike | None = None,
        *,
        timeout: float = 30.0,
        stop_timeout: float = 30.0,
    ) -> AsyncIterator[AsyncClient]:
        """See ``Client.start``: a supervisor for the length of an ``async with``."""
        from corral.client_start import start_supervisor

        resolved = homes.resolve_home(home)
        spec_path = Path(spec) if spec is not None else None
        process = await trio.to_thread.run_sync(start_supervisor, resolved, spec_path, timeout)
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
            with trio.CancelScope(shield=True):
                try:
                    await client.down(stop_timeout)
                finally:
                    client.close()

    async def down(self, timeout: float = 30.0) -> bool:
        """See ``Client.down``."""
        try:
            endpoint = homes.read_endpoint(self.home)
        except homes.NotRunning:
            return True
        try:
            await self.call("down")
        except SupervisorGone:
            pass
        self.close()
        stopped = await trio.to_thread.run_sync(wait_exit, endpoint.pid, timeout)
        if self._process is not None and stopped:
            await trio.to_thread.run_sync(self._process.wait)
            self._process = None
        return stopped

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._control is not None:
            self._control.close()
            self._control = None

    async def call(self, method: str, *, timeout: float | None = None, **params: Any) -> Any:
        async with self._lock:
            if self._control is None:
                endpoint = homes.read_endpoint(self.home)
                self._control = _AsyncControl(endpoint.control, endpoint.token, timeout=self.timeout, pid=endpoint.pid)
            try:
                return await self._control.acall(method, timeout, **params)
            except (SupervisorGone, DeadlineExceeded):
                self.close()
                raise

    async def ping(self) -> dict[str, Any]:
        result: dict[str, Any] = await self.call("ping")
        return result

    async def status(self) -> dict[str, Any]:
        result: dict[str, Any] = await self.call("status")
        return result

    async def ask(self, actor_id: str, message: dict[str, Any], *, timeout: float = 10.0) -> dict[str, Any]:
        result: dict[str, Any] = await self.call(
            "request_actor", timeout=timeout + 5, actor_id=actor_id, body=message, timeout_s=timeout
        )
        return result

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
        intent: dict[str, Any] | None = None,
        goal: str | None = None,
    ) -> RunResult:
        """See ``Client.run`` (same idempotent retry of the creation)."""
        params: dict[str, Any] = {"agent_id": agent, "task": task, "run_id": run_id or new_run_id()}
        if script is not None:
            params["script"] = script
        if intent is not None:
            params["intent"] = intent
        if goal is not None:
            params["goal"] = goal  # the first task too, when no task is given
        deadline = trio.current_time() + retry_s
        while True:
            try:
                created = await self.call("run", **params)
                break
            except (SupervisorGone, DeadlineExceeded, homes.NotRunning):
                if trio.current_time() >= deadline:
                    raise
                await trio.sleep(CREATE_RETRY_PAUSE_S)
        if wait:
            return await self.wait(created["run_id"], timeout=timeout)
        return await self.show(created["run_id"])

    async def show(self, run_id: str) -> RunResult:
        return RunResult.from_show(await self.call("show", run_id=run_id))

    async def wait(self, run_id: str, *, timeout: float = 300.0, until_parked: bool = True) -> RunResult:
        until = "settled" if until_parked else "done"
        deadline = trio.current_time() + timeout
        while True:
            # One blocking call that the supervisor answers when the run gets there:
            # no show per event, so waiting costs the run nothing.
            wait_s = max(0.0, min(deadline - trio.current_time(), WAIT_SLICE_S))
            reply = await self.call(
                "wait", timeout=wait_s + 10, run_ids=[run_id], until=until, wait_ms=int(wait_s * 1000)
            )
            if reply["reached"]:
                return await self.show(run_id)
            if trio.current_time() >= deadline:
                raise RunTimeout(run_id, reply["runs"][run_id], timeout)

    async def runs(self) -> list[dict[str, Any]]:
        runs: list[dict[str, Any]] = (await self.call("runs"))["runs"]
        return runs

    async def cancel(self, run_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await self.call("cancel", run_id=run_id)
        return result

    async def resume(self, run_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await self.call("resume", run_id=run_id)
        return result

    async def pending(self) -> Pending:
        return Pending.from_reply(await self.call("pending"))

    async def approve(self, action_id: str, *, fingerprint: str | None = None) -> dict[str, Any]:
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
        result: dict[str, Any] = await self.call("reconcile", action_id=action_id, outcome=outcome, note=note)
        return result

    async def steer(self, run_id: str, text: str) -> dict[str, Any]:
        """See ``Client.steer``."""
        result: dict[str, Any] = await self.call("steer", run_id=run_id, text=text)
        return result

    async def answer(self, run_id: str, text: str) -> dict[str, Any]:
        """See ``Client.answer``."""
        result: dict[str, Any] = await self.call("answer", run_id=run_id, text=text)
        return result

    async def conversation(self, agent_id: str) -> str:
        return str((await self.call("conversation.new", agent_id=agent_id))["conversation_id"])

    async def send(self, conversation_id: str, text: str) -> dict[str, Any]:
        """See ``Client.send``."""
        result: dict[str, Any] = await self.call("conversation.send", conversation_id=conversation_id, text=text)
        return result

    async def fork(self, conversation_id: str) -> str:
        return str((await self.call("conversation.fork", conversation_id=conversation_id))["conversation_id"])

    async def events(self, since: int = 0, *, follow: bool = False) -> AsyncIterator[Event]:
        cursor = since
        while True:
            wait_ms = FOLLOW_WAIT_MS if follow else 0
            reply = await self.call("events", timeout=wait_ms / 1000 + 15, since=cursor, wait_ms=wait_ms)
            for row in reply["events"]:
                yield Event.from_row(row)
            if not reply["events"] and not follow:
                return
            cursor = reply["cursor"]
