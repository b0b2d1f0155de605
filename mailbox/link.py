"""The stream link (``transport = "unix"`` or ``"tcp"``): length-prefixed frames
over one Unix socket (or loopback TCP), one peer per link.

The measured fast path beside the default nng link (mailbox/link_nng.py): a
non-blocking stream socket under trio is a system call each way and never blocks
the loop, where nng puts its own I/O threads between the socket and the caller
(1.7x the round trip, docs/performance.md, issue 39).

A frame is delivered whole or not at all. A send writes at once when nothing is
queued ahead of it; what the socket does not take right away (the peer is slow,
or the frame is big) goes to the link's writer task, which owns it from then on.
When the writer's queue stays full (the peer stopped reading) a send gives up with
``MailboxFull`` having sent nothing, and the link stays usable.

A listener given a secret takes as its peer only a connection that proves it
(issue 48 D.14: any local user can connect to a loopback port, and the first
connection used to become the actor's link): it sends each connection a challenge
(``CHALLENGE_MAGIC`` and a fresh nonce) and waits for HMAC-SHA256(secret, challenge)
back, vetting every connection at once, so a silent one delays nobody; a wrong,
missing or late answer drops that connection with a log line, and the listener
listens on until the right peer has come. The supervisor makes a secret per actor
incarnation and hands it over with the actor's boot config (the fork server's
socket pair or an inherited pipe, never argv or the environment).
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import logging
import os
import secrets
import socket
import struct
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

from corral.mailbox.errors import ChannelClosed, MailboxFull

#: Frame header: the frame's length, little-endian.
HEADER = struct.Struct("<I")
RECEIVE_CHUNK = 256 * 1024
#: Frames a link's writer may hold beyond what the socket took: with the socket's
#: own buffers, what a peer that stopped reading can cost us is bounded.
QUEUE_FRAMES = 8

#: The listener's challenge: this, then NONCE_BYTES of randomness. The dialer
#: answers with HMAC-SHA256(secret, the whole challenge): PROOF_BYTES.
CHALLENGE_MAGIC = b"corral-link-1\n"
NONCE_BYTES = 32
PROOF_BYTES = hashlib.sha256().digest_size
#: How long a connection may take to answer the challenge (the real actor answers
#: in one round trip), and how long a dialer waits for it.
HANDSHAKE_TIMEOUT_S = 10.0
#: Connections vetted at once: past this the oldest is dropped, so a flood costs a
#: bounded number of descriptors and cannot hold the real actor out for long.
MAX_CANDIDATES = 16

log = logging.getLogger(__name__)


class FrameOverflow(ChannelClosed):
    """The peer announced a frame past the hard limit: the link is dropped, which
    bounds what a hostile peer can make us buffer."""


def _parse(address: str) -> tuple[socket.AddressFamily, str | tuple[str, int]]:
    if address.startswith("ipc://"):
        return socket.AF_UNIX, address.removeprefix("ipc://")
    if address.startswith("tcp://"):
        host, _, port = address.removeprefix("tcp://").rpartition(":")
        host = host.strip("[]")
        return (socket.AF_INET6 if ":" in host else socket.AF_INET), (host, int(port))
    raise ValueError(f"address {address!r} is neither ipc:// nor tcp://")


def _stream_socket(sock: socket.socket) -> socket.socket:
    sock.setblocking(False)
    if sock.family != socket.AF_UNIX:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


async def _ready(wait: Callable[[socket.socket], Awaitable[None]], sock: socket.socket) -> bool:
    """Wait until ``sock`` is ready; False when the link was closed meanwhile."""
    try:
        await wait(sock)
    except trio.ClosedResourceError:
        return False
    return True


class Link:
    def __init__(self, sock: socket.socket, hard_limit: int) -> None:
        self.sock = _stream_socket(sock)
        self.hard_limit = hard_limit
        self._buffer = bytearray()
        self._start = 0  # where the next frame begins in _buffer
        self._out_send, self._out_receive = trio.open_memory_channel[memoryview](QUEUE_FRAMES)
        #: Frames handed to the writer and not yet fully written: a send may write
        #: directly only when this is 0, so frames never overtake each other.
        self._queued = 0
        self._closed = False

    async def send(self, frame: bytes, timeout: float) -> None:
        if self._closed:
            raise ChannelClosed("link is closed")
        data = memoryview(HEADER.pack(len(frame)) + frame)
        if self._queued == 0:
            try:
                # MSG_NOSIGNAL: actors run with SIGPIPE at its default, and a peer that
                # went away must be a ChannelClosed, not a death by signal.
                sent = self.sock.send(data, socket.MSG_NOSIGNAL)
            except BlockingIOError:
                sent = 0
            except OSError as exc:
                raise ChannelClosed(f"link closed while sending: {exc}") from None
            if sent == len(data):
                return
            if sent:
                # Part of the frame is out: the writer finishes it (the queue is empty).
                self._queued += 1
                self._out_send.send_nowait(data[sent:])
                return
        self._queued += 1
        try:
            with trio.move_on_after(timeout) as waited:
                await self._out_send.send(data)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            self._queued -= 1
            raise ChannelClosed("link is closed") from None
        if waited.cancelled_caught:
            self._queued -= 1
            raise MailboxFull(f"the peer read nothing for {timeout}s")

    async def run_writer(self) -> None:
        """Write what sends queued, in order. Owned by the channel's reader nursery."""
        async for data in self._out_receive:
            while data:
                try:
                    sent = self.sock.send(data, socket.MSG_NOSIGNAL)
                except BlockingIOError:
                    if not await _ready(trio.lowlevel.wait_writable, self.sock):
                        return
                    continue
                except OSError:
                    self.close()
                    return
                data = data[sent:]
            self._queued -= 1

    async def receive(self) -> bytes | None:
        """The next whole frame, or None once the peer closed the link."""
        buffer = self._buffer
        while True:
            start = self._start
            if len(buffer) - start >= HEADER.size:
                (size,) = HEADER.unpack_from(buffer, start)
                if size > self.hard_limit:
                    raise FrameOverflow(f"peer announced a {size}-byte frame (limit {self.hard_limit})")
                end = start + HEADER.size + size
                if len(buffer) >= end:
                    self._start = end
                    return bytes(buffer[start + HEADER.size : end])
            # Drop what was read once per refill, not once per frame (many small
            # frames in one chunk would move the rest of it each time).
            del buffer[:start]
            self._start = 0
            try:
                data = self.sock.recv(RECEIVE_CHUNK)
            except BlockingIOError:
                if not await _ready(trio.lowlevel.wait_readable, self.sock):
                    return None
                continue
            except OSError:
                return None
            if not data:
                return None
            buffer += data

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._out_send.close()
        trio.lowlevel.notify_closing(self.sock)
        self.sock.close()


def link_proof(secret: bytes, challenge: bytes) -> bytes:
    """What a dialer that holds ``secret`` answers to ``challenge``."""
    return hmac.new(secret, challenge, hashlib.sha256).digest()


async def _send_all(sock: socket.socket, data: bytes) -> bool:
    """False when the peer went (or the socket was closed) before all of it went out."""
    view = memoryview(data)
    while view:
        try:
            sent = sock.send(view, socket.MSG_NOSIGNAL)
        except BlockingIOError:
            if not await _ready(trio.lowlevel.wait_writable, sock):
                return False
            continue
        except OSError:
            return False
        view = view[sent:]
    return True


async def _receive_exactly(sock: socket.socket, size: int) -> bytes | None:
    """``size`` bytes and not one more (what follows is the link's first frame), or
    None when the peer closed first."""
    data = b""
    while len(data) < size:
        try:
            chunk = sock.recv(size - len(data))
        except BlockingIOError:
            if not await _ready(trio.lowlevel.wait_readable, sock):
                return None
            continue
        except OSError:
            return None
        if not chunk:
            return None
        data += chunk
    return data


async def _challenge(sock: socket.socket, secret: bytes) -> str:
    """"" when the peer proved ``secret``, else why not."""
    challenge = CHALLENGE_MAGIC + secrets.token_bytes(NONCE_BYTES)
    if not await _send_all(sock, challenge):
        return "it went before the challenge"
    answer = await _receive_exactly(sock, PROOF_BYTES)
    if answer is None:
        return "it closed without answering"
    if not hmac.compare_digest(answer, link_proof(secret, challenge)):
        return "a wrong answer"
    return ""


async def _prove(sock: socket.socket, secret: bytes, address: str) -> None:
    """The dialer's half: answer the listener's challenge."""
    with trio.move_on_after(HANDSHAKE_TIMEOUT_S):
        challenge = await _receive_exactly(sock, len(CHALLENGE_MAGIC) + NONCE_BYTES)
        if challenge is None or not challenge.startswith(CHALLENGE_MAGIC):
            raise ConnectionError(f"{address} sent no link challenge")
        if not await _send_all(sock, link_proof(secret, challenge)):
            raise ConnectionError(f"{address} closed the link during its challenge")
        return
    raise ConnectionError(f"{address} sent no link challenge within {HANDSHAKE_TIMEOUT_S:g} s")


class _Candidate:
    """A connection being vetted: ``cut`` says why it is dropped if it is cancelled
    from outside (its time ran out, the real peer came first, a flood)."""

    def __init__(self, conn: socket.socket, peer: str) -> None:
        self.conn = conn
        self.peer = peer
        self.scope = trio.CancelScope(deadline=trio.current_time() + HANDSHAKE_TIMEOUT_S)
        self.cut = f"no answer within {HANDSHAKE_TIMEOUT_S:g} s"


def _peer_name(conn: socket.socket, peer: object) -> str:
    if conn.family != socket.AF_UNIX:
        host, port = peer[:2] if isinstance(peer, tuple) else ("?", "?")
        return f"{host}:{port}"
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    return f"pid {pid} (uid {uid})"


class Listener:
    """Where one peer dials in: bound before the peer starts, closed once it came.
    With a ``secret``, the peer is the first connection that proves it."""

    def __init__(self, address: str, hard_limit: int, secret: bytes | None = None) -> None:
        family, where = _parse(address)
        self.hard_limit = hard_limit
        self._secret = secret
        self._path = Path(str(where)) if family == socket.AF_UNIX else None
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            if self._path is not None:
                self._path.unlink(missing_ok=True)  # a stale socket file of a dead boot
            else:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(where)  # a literal path or loopback address: nothing to resolve
            # The socket file this listener made, by identity: close() removes only it.
            self._made = file_identity(self._path) if self._path is not None else None
            # Without a secret the first connection is the peer; with one, impostors
            # may come first, and the real peer must still find room in the queue.
            sock.listen(1 if secret is None else MAX_CANDIDATES)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        if self._path is not None:
            self.address = address
        else:
            host, port = sock.getsockname()[:2]
            self.address = f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"
        self._closed = False

    async def accept(self) -> Link:
        try:
            if self._secret is None:
                conn, _ = await self._next_connection()
            else:
                conn = await self._proven(self._secret)
            return Link(conn, self.hard_limit)
        finally:
            self.close()

    async def _next_connection(self) -> tuple[socket.socket, str]:
        while True:
            try:
                conn, peer = self.sock.accept()
            except BlockingIOError:
                await trio.lowlevel.wait_readable(self.sock)
                continue
            conn.setblocking(False)
            return conn, _peer_name(conn, peer)

    async def _proven(self, secret: bytes) -> socket.socket:
        """The first connection that proves ``secret``. Every connection is vetted
        at once (a silent one holds nobody up); each that fails, or is still being
        vetted when the real peer has come, is closed with a log line."""
        vetting: OrderedDict[int, _Candidate] = OrderedDict()
        proven: list[socket.socket] = []
        async with trio.open_nursery() as nursery:

            async def vet(candidate: _Candidate) -> None:
                try:
                    with candidate.scope:
                        candidate.cut = await _challenge(candidate.conn, secret)
                finally:
                    vetting.pop(id(candidate), None)
                    if candidate.cut or proven:
                        log.warning("link %s: dropped a connection from %s: it did not prove the actor's link"
                                    " secret (%s)", self.address, candidate.peer, candidate.cut or "a second proof")
                        candidate.conn.close()
                    else:
                        proven.append(candidate.conn)
                        for other in vetting.values():
                            other.cut = "the actor's own link came first"
                        nursery.cancel_scope.cancel()

            while not proven:  # once one has proven it, its task cancels this loop
                conn, peer = await self._next_connection()
                if len(vetting) >= MAX_CANDIDATES:
                    _, oldest = vetting.popitem(last=False)
                    oldest.cut = f"one of more than {MAX_CANDIDATES} connections at once"
                    oldest.scope.cancel()
                candidate = _Candidate(conn, peer)
                vetting[id(candidate)] = candidate
                nursery.start_soon(vet, candidate)
        return proven[0]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        trio.lowlevel.notify_closing(self.sock)
        self.sock.close()
        # Not another's file at the same name (a new home made at this path).
        if self._path is not None and self._made is not None and file_identity(self._path) == self._made:
            self._path.unlink(missing_ok=True)


def file_identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the file at ``path`` itself (a symlink is not followed), or
    None: a listener removes its socket file only while it is still the one it made."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return (info.st_dev, info.st_ino)


async def dial(address: str, hard_limit: int, secret: bytes | None = None) -> Link:
    """A link to the listener at ``address``; with ``secret``, once its challenge is answered."""
    family, where = _parse(address)
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        code = sock.connect_ex(where)
        if code in (errno.EINPROGRESS, errno.EAGAIN):
            await trio.lowlevel.wait_writable(sock)
            code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if code:
            raise ConnectionError(f"cannot connect to {address}: {errno.errorcode.get(code, code)}")
        if secret is not None:
            await _prove(sock, secret, address)
    except BaseException:
        sock.close()
        raise
    return Link(sock, hard_limit)
