"""What an actor link is made of: nng (mailbox/link_nng.py, the default) or a raw
stream socket (mailbox/link.py, the measured fast path). Both ends of a link use
the same one: the supervisor picks it from ``[supervisor].transport`` and names it
in the actor's config (``ActorConfig.link``); ``transport_of`` is the one place a
name becomes a transport.
"""

from __future__ import annotations

from typing import Literal, Protocol

from corral.mailbox import link, link_nng

#: A link's kind, as the actor's config carries it.
LinkKind = Literal["nng", "stream"]


class Link(Protocol):
    """One peer, whole frames both ways, bounded sends (``MailboxFull``)."""

    async def send(self, frame: bytes, timeout: float) -> None: ...

    async def run_writer(self) -> None: ...

    async def receive(self) -> bytes | None: ...

    def close(self) -> None: ...


class Listener(Protocol):
    #: What the peer dials (a tcp port 0 resolved).
    address: str

    async def accept(self) -> Link: ...

    def close(self) -> None: ...


class Transport(Protocol):
    """``secret``: the listener takes as its peer only a dialer that proves it holds
    the same bytes (a per-actor secret from the boot config). The stream link checks
    it on every address (mailbox/link.py); nng links listen on ``ipc://`` only when
    given one, whose socket file sits in the home's mode-700 ``s/`` directory, out of
    every other user's reach (mailbox/link_nng.py)."""

    kind: LinkKind

    def listen(self, address: str, hard_limit: int, secret: bytes | None = None) -> Listener: ...

    async def dial(self, address: str, hard_limit: int, secret: bytes | None = None) -> Link: ...


class StreamTransport:
    kind: LinkKind = "stream"

    def listen(self, address: str, hard_limit: int, secret: bytes | None = None) -> Listener:
        return link.Listener(address, hard_limit, secret)

    async def dial(self, address: str, hard_limit: int, secret: bytes | None = None) -> Link:
        return await link.dial(address, hard_limit, secret)


class NngTransport:
    kind: LinkKind = "nng"

    def listen(self, address: str, hard_limit: int, secret: bytes | None = None) -> Listener:
        return link_nng.NngListener(address, hard_limit, authenticated=secret is not None)

    async def dial(self, address: str, hard_limit: int, secret: bytes | None = None) -> Link:
        return await link_nng.dial(address, hard_limit)


STREAM = StreamTransport()
NNG = NngTransport()


def transport_of(kind: LinkKind) -> Transport:
    return NNG if kind == "nng" else STREAM
