"""Actor links on nng: one Pair0 socket per link, over ``ipc://`` (or ``tcp://``),
driven from trio through nng's pollable descriptors.

Why this shape: pynng's async calls hand every send to nng's threads and wait for
them (140-240 µs a send, measured, with trio's loop blocked meanwhile). Here every
send and receive is non-blocking (``block=False``; ``pynng.TryAgain`` when nng can
take or give nothing now), and a task that must wait waits in trio on nng's
``send_fd`` / ``recv_fd``, which nng makes readable when a send can go / a message
is there: no thread hop, and the loop never blocks.

The guarantees of the stream link (mailbox/link.py), kept:

- a frame is whole or not at all: one frame is one nng message;
- bounded: nng holds at most ``SEND_BUFFER`` frames the peer has not taken; a send
  that finds no room waits on ``send_fd`` up to its timeout and then gives up with
  ``MailboxFull`` having sent nothing (nng never took the frame); waiting senders
  go in the order they came, so frames never overtake each other;
- an oversized frame cuts the link: ``recv_max_size`` is the hard limit, nng closes
  the pipe of a peer that sends more, and both ends see the link end;
- one peer: the first pipe is the link's, any later one is closed before it is
  added, and a pipe that goes ends the link (the dialer's reconnects are refused).
  (nng closes a listener's pipes with the listener, so it listens on until the
  link closes; the ipc:// file is removed once the peer came.)

nng tells us about pipes from its own threads; those callbacks only schedule work
on the trio loop (``run_sync_soon``). nng is not fork-safe: no nng socket may exist
in a process that forks (the fork server never opens one; sandbox/forkserver.py).

An actor's process gets nng's smallest thread pools (``size_pools_for_one_link``):
nng sizes them for a busy server by default, 12 threads on 2 CPUs in every actor,
for the one socket an actor has.
"""

from __future__ import annotations

import functools
import os
import resource
from pathlib import Path
from typing import Any

import pynng
import trio

from corral.mailbox.addresses import bound_tcp_address
from corral.mailbox.errors import ChannelClosed, MailboxFull
from corral.mailbox.link import file_identity

#: Frames nng may hold on each side beyond what the peer's reader took: with the
#: stream link's QUEUE_FRAMES, what a peer that stopped reading can cost is bounded.
SEND_BUFFER = 8
RECV_BUFFER = 8

#: nng's thread pools in a process whose one nng socket is an actor's link, at the
#: floors nng accepts (it raises a smaller task pool to 2): with the poller and the
#: reaper, 6 threads where its defaults (two task threads and one expiry thread per
#: CPU, four resolvers) start 12 on 2 CPUs, per actor. One link's messages need no
#: more: its pipe's callbacks run one after the other, and ``ipc://`` resolves nothing.
ONE_LINK_POOLS = (
    (pynng.lib.NNG_INIT_NUM_TASK_THREADS, 2),
    (pynng.lib.NNG_INIT_MAX_TASK_THREADS, 2),
    (pynng.lib.NNG_INIT_NUM_EXPIRE_THREADS, 1),
    (pynng.lib.NNG_INIT_MAX_EXPIRE_THREADS, 1),
    (pynng.lib.NNG_INIT_NUM_RESOLVER_THREADS, 1),
)


@functools.cache
def size_pools_for_one_link() -> None:
    """Give this process nng's smallest thread pools, once, before its first nng
    socket: nng reads these parameters when its first socket opens and ignores them
    afterwards, so a process that opened one before (a test that also listens)
    keeps the pools it has. ``dial`` calls it: the dialing end of a link is an
    actor, whose process (forked by a fork server that never opens nng) has no other
    nng socket. The supervisor, which listens for every actor and serves its control
    socket, keeps nng's defaults."""
    for parameter, value in ONE_LINK_POOLS:
        pynng.lib.nng_init_set_parameter(parameter, value)


class NngLink:
    """One Pair0 socket and its one peer. Built before the socket listens or dials,
    so no pipe event can come before the callbacks are in place."""

    def __init__(self, hard_limit: int) -> None:
        self.hard_limit = hard_limit
        self._token = trio.lowlevel.current_trio_token()
        #: Whether a pipe was admitted (read and written by nng's threads only).
        self._admitted = False
        self.socket = pynng.Pair0(recv_max_size=hard_limit, send_buffer_size=SEND_BUFFER, recv_buffer_size=RECV_BUFFER)
        self.socket.add_pre_pipe_connect_cb(self._admit)
        self.socket.add_post_pipe_remove_cb(self._pipe_went)
        # pynng has nng call it back (in Python, so holding the GIL) at every pipe
        # event; the one after a pipe is added tells us nothing _admit did not.
        # Each callback is an nng thread waiting for the GIL, up to the switch
        # interval while the loop runs, with that thread's other work held up: a
        # supervisor starting 1,000 actors paid it 1,000 times.
        pynng.lib.nng_pipe_notify(self.socket.socket, pynng.lib.NNG_PIPE_EV_ADD_POST, pynng.ffi.NULL, pynng.ffi.NULL)
        self._send_fd: int = self.socket.send_fd
        self._recv_fd: int = self.socket.recv_fd
        #: Set (on the loop) once the peer's pipe is up.
        self.came = trio.Event()
        #: The peer's pipe went: what it sent before is still read, nothing more is sent.
        self._peer_gone = False
        self._closed = False
        #: Senders that found no room wait their turn here, first come first served.
        self._turn = trio.StrictFIFOLock()
        self._senders_waiting = 0
        #: Waits on nng's descriptors, cancelled when the link ends.
        self._waits: set[trio.CancelScope] = set()

    # -- from nng's threads: hand over to the loop, nothing else ---------------------

    def _admit(self, pipe: Any) -> None:
        """One peer per link: any pipe after the first is closed before it is added
        (pynng runs pipe callbacks one at a time). The first is the peer that came:
        should nng fail to add it after all, its removal ends the link."""
        if self._admitted:
            pipe.close()
            return
        self._admitted = True
        self._soon(self.came.set)

    def _pipe_went(self, pipe: Any) -> None:
        self._soon(self._on_peer_gone)

    def _soon(self, call: Any) -> None:
        try:
            self._token.run_sync_soon(call)
        except trio.RunFinishedError:
            pass  # the loop is gone (the process is ending): nobody to tell

    # -- on the loop ---------------------------------------------------------------

    def _on_peer_gone(self) -> None:
        if not self._peer_gone:
            self._peer_gone = True
            self.came.set()  # a listener still waiting learns it at once
            self._wake_all()

    def _wake_all(self) -> None:
        for scope in self._waits:
            scope.cancel()

    @property
    def _ended(self) -> bool:
        return self._closed or self._peer_gone

    async def _wait(self, fd: int) -> None:
        """Until nng's descriptor is readable or the link ends (the caller looks again)."""
        scope = trio.CancelScope()
        self._waits.add(scope)
        try:
            with scope:
                await trio.lowlevel.wait_readable(fd)
        except trio.ClosedResourceError:
            pass  # closed meanwhile: the caller sees _ended
        finally:
            self._waits.discard(scope)

    async def send(self, frame: bytes, timeout: float) -> None:
        if self._ended:
            raise ChannelClosed("link is closed")
        if not self._senders_waiting and self._try_send(frame):
            return
        self._senders_waiting += 1
        try:
            with trio.move_on_after(timeout):
                async with self._turn:
                    while not self._ended:
                        if self._try_send(frame):
                            return
                        await self._wait(self._send_fd)
                raise ChannelClosed("link is closed")
        finally:
            self._senders_waiting -= 1
        raise MailboxFull(f"the peer read nothing for {timeout}s")

    def _try_send(self, frame: bytes) -> bool:
        """True when nng took the frame, False when it has no room for it now."""
        try:
            self.socket.send(frame, block=False)
        except pynng.TryAgain:
            return False
        except pynng.NNGException as exc:
            raise ChannelClosed(f"link closed while sending: {exc}") from None
        return True

    async def run_writer(self) -> None:
        """Nothing to do: nng's own queue writes what sends handed it."""

    async def receive(self) -> bytes | None:
        """The next whole frame, or None once the peer went and all it sent was read."""
        while True:
            if self._closed:
                return None
            try:
                frame: bytes = self.socket.recv(block=False)
                return frame
            except pynng.TryAgain:
                if self._peer_gone:
                    return None
            except pynng.NNGException:
                return None
            await self._wait(self._recv_fd)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._wake_all()
        for fd in (self._send_fd, self._recv_fd):
            trio.lowlevel.notify_closing(fd)  # nng closes them with the socket
        self.socket.close()


class NngListener:
    """Where one peer dials in: listening before the peer starts, closed once it came.

    On ``ipc://`` nng binds a temporary name that is then renamed to the address:
    nng removes the file it bound when it stops listening, by name, which would
    remove another's socket file made at that name since; this listener removes the
    address's file itself, only while it is still this listener's (as the stream
    listener does)."""

    def __init__(self, address: str, hard_limit: int, *, authenticated: bool = False) -> None:
        """``authenticated``: the peer must be the one meant. nng has no handshake of
        ours, and its first pipe becomes the link (``_admit``): on ``ipc://`` only
        the owner of the home can connect (its ``s/`` directory is mode 700), but a
        loopback tcp port is open to every local user, who could connect first and
        take the link (issue 48 D.14). Such a listener is refused: the supervisor
        links nng over ``ipc://`` only, and ``transport = "tcp"`` is the stream
        link, which checks a secret (mailbox/link.py)."""
        if authenticated and not address.startswith("ipc://"):
            raise ValueError(f"an nng link on {address!r} cannot check its peer: only ipc:// is private")
        self.link = NngLink(hard_limit)
        self._path: Path | None = None
        self._made: tuple[int, int] | None = None
        self._closed = False
        try:
            if address.startswith("ipc://"):
                self._path = Path(address.removeprefix("ipc://"))
                bound = self._path.with_name("~" + self._path.name[1:])
                self.link.socket.listen(f"ipc://{bound}")
                os.replace(bound, self._path)
                self._made = file_identity(self._path)
                self.address = address
            elif address.startswith("tcp://"):
                listener = self.link.socket.listen(address)
                self.address = bound_tcp_address(listener) if address.endswith(":0") else address
            else:
                raise ValueError(f"address {address!r} is neither ipc:// nor tcp://")
        except BaseException:
            self.link.close()
            raise

    async def accept(self) -> NngLink:
        try:
            await self.link.came.wait()
        finally:
            self.close()
        return self.link

    def close(self) -> None:
        """Nobody else can dial in (the link, once its peer came, lives on)."""
        if self._closed:
            return
        self._closed = True
        if self._path is not None and self._made is not None and file_identity(self._path) == self._made:
            self._path.unlink(missing_ok=True)
        if not self.link.came.is_set():
            self.link.close()  # nobody came: the socket goes with the listener


def lift_open_files_limit() -> None:
    """Raise this process's soft limit of open files to its hard limit. The listening
    end of an nng link holds ~6 descriptors (its listener, the pipe's connection,
    nng's pollable descriptors), where a stream link holds 1: at a common soft
    limit of 1,024, a supervisor would run out near 150 actors."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass  # an unlimited hard limit past the kernel's nr_open: keep the soft one


async def dial(address: str, hard_limit: int) -> NngLink:
    size_pools_for_one_link()
    link = NngLink(hard_limit)
    try:
        # Synchronous: nng connects (a local connect) and returns; the first send
        # waits on send_fd until the pipe is up.
        link.socket.dial(address, block=True)
    except pynng.NNGException as exc:
        link.close()
        raise ConnectionError(f"cannot connect to {address}: {exc}") from None
    except BaseException:
        link.close()
        raise
    return link
