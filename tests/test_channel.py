"""Channels: request/reply correlation, deadlines, and backpressure with bounded memory,
on both link transports (nng and the raw stream socket)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import trio

from corral.mailbox import DeadlineExceeded, Kind, MailboxFull
from corral.mailbox.channel import open_channel
from corral.mailbox.errors import ChannelClosed
from corral.mailbox.transport import NNG, STREAM, Transport


@pytest.fixture(params=[NNG, STREAM], ids=lambda transport: transport.kind)
def transport(request: pytest.FixtureRequest) -> Transport:
    chosen: Transport = request.param
    return chosen


async def test_requests_are_correlated_even_when_answered_out_of_order(
    short_tmp: Path, transport: Transport
) -> None:
    address = f"ipc://{short_tmp}/c.ipc"
    async with (
        open_channel(address, "server", listen=True, transport=transport) as server,
        open_channel(address, "client", listen=False, transport=transport) as client,
    ):

        async def serve() -> None:
            held = []
            async for envelope in server.inbox:
                held.append(envelope)
                if len(held) == 2:
                    for request in reversed(held):
                        await server.reply(request, {"n": request.body["n"]})
                    return

        results: dict[int, int] = {}

        async def ask(n: int) -> None:
            results[n] = (await client.request("server", {"n": n}, timeout=10))["n"]

        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve)
            nursery.start_soon(ask, 1)
            nursery.start_soon(ask, 2)
        assert results == {1: 1, 2: 2}


async def test_a_request_without_answer_hits_its_deadline(short_tmp: Path, transport: Transport) -> None:
    address = f"ipc://{short_tmp}/c.ipc"
    async with (
        open_channel(address, "server", listen=True, transport=transport),
        open_channel(address, "client", listen=False, transport=transport) as client,
    ):
        with pytest.raises(DeadlineExceeded, match="no reply within"):
            await client.request("server", {"method": "ignored"}, timeout=0.2)


async def test_a_full_mailbox_pushes_back_on_the_sender(short_tmp: Path, transport: Transport) -> None:
    address = f"ipc://{short_tmp}/c.ipc"
    async with (
        open_channel(address, "server", listen=True, inbox_size=4, transport=transport) as server,
        open_channel(address, "client", listen=False, transport=transport) as client,
    ):
        blob = "x" * 65536
        sent = 0
        with pytest.raises(MailboxFull):
            for _ in range(10_000):
                await client.tell("server", {"blob": blob, "n": sent}, timeout=0.5)
                sent += 1
        # Bounded: the sender got stuck long before 10k frames of 64 KiB.
        assert sent < 200
        # Draining the mailbox lets the sender go on.
        received = 0
        while received < sent:
            envelope = await server.inbox.receive()
            assert envelope.kind is Kind.TELL and envelope.body["n"] == received
            received += 1
        await client.tell("server", {"after": True}, timeout=5)
        # The send that gave up sent nothing: the next frame is the one after it.
        assert (await server.inbox.receive()).body == {"after": True}


async def test_garbage_on_a_channel_is_answered_and_the_channel_survives(
    short_tmp: Path, transport: Transport
) -> None:
    address = f"ipc://{short_tmp}/c.ipc"
    async with (
        open_channel(address, "server", listen=True, transport=transport) as server,
        open_channel(address, "client", listen=False, transport=transport) as client,
    ):
        await client.send_frame(b"\xc1\xc1 not msgpack")
        error = await client.inbox.receive()
        assert error.kind is Kind.ERROR and error.body["code"] == "malformed-frame"
        assert server.bad_frames == 1
        await client.tell("server", {"still": "works"})
        assert (await server.inbox.receive()).body == {"still": "works"}


async def test_many_tasks_sending_into_a_full_channel_all_get_through(short_tmp: Path, transport: Transport) -> None:
    address = f"ipc://{short_tmp}/c.ipc"
    async with open_channel(address, "server", listen=True, inbox_size=2, transport=transport) as server, open_channel(
        address, "client", listen=False, transport=transport
    ) as client:
        payload = {"blob": "x" * 65536}

        async def sender(n: int) -> None:
            for i in range(20):
                await client.tell("server", {**payload, "n": n, "i": i}, timeout=30)

        got = 0
        async with trio.open_nursery() as nursery:
            for n in range(8):
                nursery.start_soon(sender, n)
            while got < 160:
                await server.inbox.receive()
                got += 1
        assert got == 160


async def test_big_frames_arrive_whole_and_in_order_with_small_ones_queued_behind(
    short_tmp: Path, transport: Transport
) -> None:
    # Far past the socket's buffers: the writer task finishes each one while later
    # sends wait their turn, so nothing interleaves.
    address = f"ipc://{short_tmp}/c.ipc"
    async with (
        open_channel(address, "server", listen=True, transport=transport) as server,
        open_channel(address, "client", listen=False, transport=transport) as client,
    ):
        sizes = [900_000, 10, 700_000, 10, 10]

        async def send_all() -> None:
            for n, size in enumerate(sizes):
                await client.tell("server", {"n": n, "blob": "x" * size}, timeout=10)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send_all)
            got = [await server.inbox.receive() for _ in sizes]
        assert [(e.body["n"], len(e.body["blob"])) for e in got] == list(enumerate(sizes))


async def test_a_frame_past_max_is_answered_and_one_past_the_hard_limit_cuts_the_link(
    short_tmp: Path, transport: Transport
) -> None:
    address = f"ipc://{short_tmp}/c.ipc"
    async with (
        open_channel(address, "server", listen=True, max_frame=1000, transport=transport) as server,
        open_channel(address, "client", listen=False, max_frame=100_000, transport=transport) as client,
    ):
        await client.tell("server", {"blob": "x" * 2000})  # over 1000, under the 4000 hard limit
        error = await client.inbox.receive()
        assert error.kind is Kind.ERROR and error.body["code"] == "frame-too-large"
        await client.tell("server", {"small": 1})
        assert (await server.inbox.receive()).body == {"small": 1}
        # A header announcing 5000 bytes: the server drops the link without reading it.
        await client.send_frame(b"\0" * 5000)
        with pytest.raises(trio.EndOfChannel):
            await server.inbox.receive()
        assert server.frames_in == 2


async def test_a_listener_takes_one_peer_and_removes_its_socket_file(short_tmp: Path, transport: Transport) -> None:
    path = short_tmp / "one.ipc"
    listener = transport.listen(f"ipc://{path}", 1 << 20)
    first = await transport.dial(listener.address, 1 << 20)
    accepted = await listener.accept()
    assert not path.exists()
    with pytest.raises((ConnectionError, FileNotFoundError)):
        await transport.dial(listener.address, 1 << 20)
    for link in (first, accepted):
        link.close()


async def test_a_listener_removes_only_its_own_socket_file(short_tmp: Path, transport: Transport) -> None:
    path = short_tmp / "a0.ipc"
    listener = transport.listen(f"ipc://{path}", 1 << 20)
    path.unlink()  # the home went; a new supervisor made its own a0.ipc there
    path.write_bytes(b"another supervisor's")
    listener.close()
    assert path.read_bytes() == b"another supervisor's"


async def test_a_link_over_loopback_tcp_carries_frames_both_ways(transport: Transport) -> None:
    listener = transport.listen("tcp://127.0.0.1:0", 1 << 20)
    assert listener.address.startswith("tcp://127.0.0.1:") and not listener.address.endswith(":0")
    client = await transport.dial(listener.address, 1 << 20)
    server = await listener.accept()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client.run_writer)
        nursery.start_soon(server.run_writer)
        await client.send(b"ping", 5)
        assert await server.receive() == b"ping"
        await server.send(b"pong", 5)
        assert await client.receive() == b"pong"
        client.close()
        assert await server.receive() is None  # the peer went away: end of the link
        server.close()
        nursery.cancel_scope.cancel()


async def test_a_second_peer_never_gets_through(transport: Transport) -> None:
    # Over tcp the address stays reachable after the first peer came (no file to remove).
    listener = transport.listen("tcp://127.0.0.1:0", 1 << 20)
    first = await transport.dial(listener.address, 1 << 20)
    server = await listener.accept()
    with trio.fail_after(10):
        try:
            second = await transport.dial(listener.address, 1 << 20)
        except ConnectionError:
            pass  # the stream listener stopped listening
        else:
            assert await second.receive() is None  # nng: its pipe was closed before it was added
            second.close()
        await first.send(b"still mine", 5)
        assert await server.receive() == b"still mine"
    for link in (first, server):
        link.close()


async def test_sending_on_a_link_whose_peer_went_is_an_error(short_tmp: Path, transport: Transport) -> None:
    listener = transport.listen(f"ipc://{short_tmp}/gone.ipc", 1 << 20)
    client = await transport.dial(listener.address, 1 << 20)
    server = await listener.accept()
    client.close()
    assert await server.receive() is None
    with pytest.raises(ChannelClosed):
        for _ in range(100):  # the stream link learns it on a later send
            await server.send(b"late", 5)
    server.close()


def test_sending_to_a_peer_that_went_away_is_an_error_not_a_sigpipe() -> None:
    # Actors run with SIGPIPE at its default disposition (sandbox/child_setup.py).
    # The stream link's own send (nng writes from its threads, with MSG_NOSIGNAL).
    script = """
import signal, socket, trio
from corral.mailbox import link as links
from corral.mailbox.errors import ChannelClosed
signal.signal(signal.SIGPIPE, signal.SIG_DFL)
mine, theirs = socket.socketpair()
theirs.close()
async def main():
    link = links.Link(mine, 1 << 20)
    try:
        await link.send(b"x" * 10, 5)
        await link.send(b"x" * 10, 5)
    except ChannelClosed:
        print("closed")
trio.run(main)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert (result.returncode, result.stdout.strip()) == (0, "closed"), result.stderr
