"""Messages of running actors, once the tree has launched them: the hello check,
requests and tells to the supervisor (each held while the ledger is away),
routing between actors and the replies that come back, and the supervisor's own
requests and tells to an actor.

The tree (supervisor/tree/supervision_tree.py) owns the slots and their
lifecycle; this module only reads a slot's channel, state and process.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import trio

from corral.core import failpoints
from corral.mailbox.channel import Channel
from corral.mailbox.envelope import Envelope, Kind
from corral.mailbox.errors import ChannelClosed, MailboxFull
from corral.supervisor.ledger.cooperative import cooperatively
from corral.supervisor.ledger.ledger_link import run_held
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.tree.actor_state import ActorState

if TYPE_CHECKING:
    from corral.supervisor.tree.supervision_tree import ActorSlot

log = logging.getLogger("corral.tree")

SUPERVISOR = "supervisor"
#: How long a routed message or a tell may wait for room in the recipient's inbox.
SEND_TIMEOUT_S = 5.0

#: Handles a request or tell from an actor addressed to the supervisor; returns the
#: reply body (requests) or None (tells).
MessageHandler = Callable[["ActorSlot", Envelope], Awaitable[dict[str, Any] | None]]


class ActorMessages:
    def __init__(self, slots: Mapping[str, ActorSlot], ledger: Ledger, token: str, handler: MessageHandler) -> None:
        #: The tree's slots, by actor id (read only: the tree adds and changes them).
        self.slots = slots
        #: A request waits for it while it is unreachable (``run_held``).
        self.ledger = ledger
        self._token = token
        self._handler = handler
        #: A routed request's message id -> the actor that sent it (its reply goes back there).
        self._forwarded: dict[str, str] = {}

    def accept_hello(self, slot: ActorSlot, hello: Envelope) -> bool:
        return (
            hello.kind is Kind.HELLO
            and hello.token is not None
            and hmac.compare_digest(hello.token, self._token)
            and hello.body.get("actor_id") == slot.id
            and hello.body.get("incarnation") == slot.incarnation
        )

    async def dispatch(self, slot: ActorSlot, channel: Channel, envelope: Envelope) -> None:
        if envelope.kind in (Kind.REPLY, Kind.ERROR):
            origin = self._forwarded.pop(envelope.corr_id or "", None)
            if origin is not None:
                await self._forward(origin, envelope)
            return
        if envelope.token is None or not hmac.compare_digest(envelope.token, self._token):
            if envelope.kind is Kind.REQUEST:
                await channel.reply_error(envelope, "bad-token", "wrong or missing token")
            return
        if envelope.recipient != SUPERVISOR:
            await self._route(slot, channel, envelope)
            return
        if slot.process is not None:
            failpoints.caller_pid.set(slot.process.pid)
        try:
            if envelope.kind is Kind.REQUEST:
                # A request that found the ledger unreachable committed nothing: it
                # waits for the ledger and runs again; its reply is held, not failed.
                body = await run_held(lambda: self._handle(slot, envelope), self.ledger)
            else:
                body = await self._handler(slot, envelope)
        except Exception as exc:
            code = getattr(exc, "code", "internal")
            if not isinstance(code, str):
                code = "internal"
            if code == "internal":
                log.exception("%s: handler failed", slot.id)
            if envelope.kind is Kind.REQUEST:
                await send_or_drop(channel.reply_error(envelope, code, str(exc)))
            return
        if envelope.kind is Kind.REQUEST:
            await send_or_drop(channel.reply(envelope, body or {}))

    def _handle(self, slot: ActorSlot, envelope: Envelope) -> Awaitable[dict[str, Any] | None]:
        """The request's handler; with a ledger on a server, run cooperatively: while
        it waits for the server, other actors' requests run (supervisor/ledger/cooperative.py)."""
        if self.ledger.cooperative:
            return cooperatively(self._handler, slot, envelope)
        return self._handler(slot, envelope)

    async def _route(self, slot: ActorSlot, channel: Channel, envelope: Envelope) -> None:
        target = self.slots.get(envelope.recipient)
        if target is None or target.channel is None or target.state is not ActorState.RUNNING:
            if envelope.kind is Kind.REQUEST:
                await channel.reply_error(envelope, "no-such-actor", f"no running actor {envelope.recipient!r}")
            return
        if envelope.kind is Kind.REQUEST:
            self._forwarded[envelope.msg_id] = slot.id
        forwarded = Envelope(
            envelope.kind,
            envelope.sender,
            envelope.recipient,
            envelope.body,
            msg_id=envelope.msg_id,
            corr_id=envelope.corr_id,
            sent_at=envelope.sent_at,
        )
        try:
            await target.channel.send(forwarded, timeout=SEND_TIMEOUT_S)
        except (ChannelClosed, MailboxFull) as exc:
            self._forwarded.pop(envelope.msg_id, None)
            if envelope.kind is Kind.REQUEST:
                await channel.reply_error(envelope, "undeliverable", str(exc))

    async def _forward(self, origin_id: str, envelope: Envelope) -> None:
        origin = self.slots.get(origin_id)
        if origin is not None and origin.channel is not None:
            await send_or_drop(origin.channel.send(envelope, timeout=SEND_TIMEOUT_S))

    # -- the supervisor's own messages to an actor ---------------------------------

    async def request(self, actor_id: str, body: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
        slot = self.slots[actor_id]
        await slot.ready.wait()
        if slot.channel is None:
            raise ChannelClosed(f"actor {actor_id} is not running")
        return await slot.channel.request(actor_id, body, timeout)

    async def tell(self, actor_id: str, body: dict[str, Any]) -> bool:
        slot = self.slots.get(actor_id)
        if slot is None or slot.channel is None or slot.state is not ActorState.RUNNING:
            return False
        try:
            await slot.channel.tell(actor_id, body, timeout=SEND_TIMEOUT_S)
        except (ChannelClosed, MailboxFull):
            return False
        return True


async def send_or_drop(awaitable: Awaitable[Any]) -> None:
    """A send whose failure changes nothing (the other side is gone or full)."""
    try:
        await awaitable
    except (ChannelClosed, MailboxFull, trio.ClosedResourceError) as exc:
        log.debug("send failed: %s", exc)
