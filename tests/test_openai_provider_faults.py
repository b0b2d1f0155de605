"""The OpenAI-compatible provider when HTTP goes wrong: error statuses, redirects,
huge bodies, timeouts and refused connections against the fake server, then
dropped, delayed and held exchanges through the fault proxy.

Every test synchronises on what the fake server or proxy recorded, never on
sleeps; the only timeouts are the provider's own (short) ones under test, and those
run on ``deadline_clock``: they fire when the test jumps the clock, after the server
or proxy has the request, so a loaded machine cannot make them fire first.
"""

from __future__ import annotations

import socket
import tracemalloc

import pytest
import trio
from trio.testing import MockClock

from corral.actors.providers.base import ErrorKind, ProviderError, ProviderResponse
from corral.actors.providers.openai import OpenAIConfigError, OpenAIHTTPError
from fake_openai import FakeOpenAIServer, Reply, completion
from fault_proxy import Fault, FaultProxy
from loopback_http import serve_in_thread
from tests.openai_provider_support import TOOLS, make_provider, make_request, start, time_out

# Fixtures, imported so that pytest finds them in this module (see openai_provider_support).
from tests.openai_provider_support import no_ambient_key as no_ambient_key

pytestmark = pytest.mark.usefixtures("no_ambient_key")


# --- HTTP failures ----------------------------------------------------------------


async def test_500_is_an_http_error_sent_once(nursery: trio.Nursery) -> None:
    server = FakeOpenAIServer([Reply(500, {"error": {"message": "model overloaded"}})])
    provider = make_provider(await start(nursery, server))
    with pytest.raises(OpenAIHTTPError) as caught:
        await provider.complete(make_request())
    assert caught.value.kind is ErrorKind.HTTP
    assert caught.value.status == 500
    assert "model overloaded" in str(caught.value)
    await server.wait_for_outcomes(1)
    assert len(server.requests) == 1


async def test_redirect_is_not_followed(nursery: trio.Nursery) -> None:
    server = FakeOpenAIServer(default=Reply(302, b"", headers=(("Location", "/v1/chat/completions"),)))
    provider = make_provider(await start(nursery, server))
    with pytest.raises(OpenAIHTTPError) as caught:
        await provider.complete(make_request())
    assert caught.value.status == 302
    await server.wait_for_outcomes(1)
    assert len(server.requests) == 1


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "until-close"])
async def test_huge_body_fails_clearly_with_bounded_memory(nursery: trio.Nursery, declared: bool) -> None:
    limit = 64 * 1024
    chunk = b'{"pad": "' + b"x" * (64 * 1024) + b'"}'
    # 50 MiB: far more than the socket buffers, so a client that stops reading
    # leaves the server unable to finish.
    reply = Reply(body=chunk, repeat=800, content_length=declared)
    server = FakeOpenAIServer([reply])
    provider = make_provider(await start(nursery, server), max_response_bytes=limit)

    tracemalloc.start()
    try:
        with pytest.raises(OpenAIHTTPError) as caught:
            await provider.complete(make_request())
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert caught.value.kind is ErrorKind.HTTP
    assert "max_response_bytes" in str(caught.value)
    assert peak < 8 * 1024 * 1024
    await server.wait_for_outcomes(1)
    [record] = server.requests
    assert record.outcome == "client-gone"


@pytest.mark.parametrize("reply", [Reply(hang=True), Reply(delay_ms=60_000)], ids=["hang", "delay"])
async def test_timeout_is_transient_with_exactly_one_request(
    nursery: trio.Nursery, deadline_clock: MockClock, reply: Reply
) -> None:
    server = FakeOpenAIServer([reply], default=Reply(body=completion("a hidden retry")))
    provider = make_provider(await start(nursery, server), timeout_s=0.3)
    error = await time_out(deadline_clock, provider, lambda: server.wait_for_requests(1))
    assert error.kind is ErrorKind.TRANSIENT
    # complete() has returned and its client is closed: nothing can still be sent.
    assert len(server.requests) == 1


async def test_hung_request_is_abandoned_by_the_client(nursery: trio.Nursery, deadline_clock: MockClock) -> None:
    server = FakeOpenAIServer([Reply(hang=True)])
    provider = make_provider(await start(nursery, server), timeout_s=0.3)
    await time_out(deadline_clock, provider, lambda: server.wait_for_requests(1))
    await server.wait_for_outcomes(1)
    assert [r.outcome for r in server.requests] == ["hung-up"]


async def test_connection_refused_is_transient() -> None:
    # Bound but not listening: connecting is refused, and the port stays ours.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        provider = make_provider(f"http://127.0.0.1:{port}/v1")
        with pytest.raises(ProviderError) as caught:
            await provider.complete(make_request())
    assert caught.value.kind is ErrorKind.TRANSIENT


async def test_bad_scheme_is_a_config_error() -> None:
    with pytest.raises(OpenAIConfigError) as caught:
        make_provider("ftp://127.0.0.1/v1")
    assert caught.value.kind is ErrorKind.FATAL


# --- the fault proxy --------------------------------------------------------------


async def test_dropped_request_is_transient_and_never_reaches_upstream(
    nursery: trio.Nursery,
) -> None:
    server = FakeOpenAIServer([Reply(body=completion("second try"))])
    proxy = FaultProxy(await start(nursery, server), {1: Fault.drop()})
    provider = make_provider(await start(nursery, proxy))

    with pytest.raises(ProviderError) as caught:
        await provider.complete(make_request())
    assert caught.value.kind is ErrorKind.TRANSIENT
    assert [(r.seq, r.fault, r.outcome) for r in proxy.requests] == [(1, "drop-request", "dropped-request")]
    assert server.requests == []

    # The caller's explicit retry is a new request that goes through.
    response = await provider.complete(make_request())
    assert provider.parse(response, TOOLS).final_reply == "second try"
    assert len(proxy.requests) == 2
    assert len(server.requests) == 1


async def test_dropped_response_after_upstream_did_the_work(nursery: trio.Nursery) -> None:
    server = FakeOpenAIServer([Reply(body=completion("lost"))])
    proxy = FaultProxy(await start(nursery, server), {1: Fault.drop("response")})
    provider = make_provider(await start(nursery, proxy))

    with pytest.raises(ProviderError) as caught:
        await provider.complete(make_request())
    assert caught.value.kind is ErrorKind.TRANSIENT
    [upstream] = server.requests
    assert upstream.outcome == "responded"
    [record] = proxy.requests
    assert (record.forwarded, record.outcome) == (True, "dropped-response")


@pytest.mark.parametrize(
    ("fault", "upstream_sees"),
    [(None, 1), (Fault.delay(60_000), 0)],
    ids=["slow-upstream", "delayed-at-proxy"],
)
async def test_client_timeout_behind_the_proxy(
    nursery: trio.Nursery, deadline_clock: MockClock, fault: Fault | None, upstream_sees: int
) -> None:
    server = FakeOpenAIServer([Reply(hang=True)])
    proxy = FaultProxy(await start(nursery, server), {1: fault} if fault else {})
    provider = make_provider(await start(nursery, proxy), timeout_s=0.3)
    # The client gives up only once the request is as far as it gets: at the hung
    # upstream, or held in the proxy's delay (60 s of a clock that the test moves 0.3 s).
    arrived = server.wait_for_requests if fault is None else proxy.wait_for_requests
    error = await time_out(deadline_clock, provider, lambda: arrived(1))
    assert error.kind is ErrorKind.TRANSIENT
    assert len(proxy.requests) == 1
    if fault is None:
        # The proxy notices the client leaving and lets go of the upstream.
        await proxy.wait_for_outcomes(1)
        await server.wait_for_outcomes(1)
        assert [r.outcome for r in proxy.requests] == ["client-gone"]
        assert [r.outcome for r in server.requests] == ["hung-up"]
    assert len(server.requests) == upstream_sees


@pytest.mark.parametrize("own_event", [False, True])
async def test_held_request_waits_for_release(nursery: trio.Nursery, own_event: bool) -> None:
    server = FakeOpenAIServer([Reply(body=completion("released"))])
    release = trio.Event() if own_event else None
    proxy = FaultProxy(await start(nursery, server), {1: Fault.hold(release)})
    provider = make_provider(await start(nursery, proxy))
    responses: list[ProviderResponse] = []

    async def call() -> None:
        responses.append(await provider.complete(make_request()))

    async with trio.open_nursery() as inner:
        inner.start_soon(call)
        await proxy.wait_held(1)
        assert server.requests == []  # held before the upstream
        assert responses == []
        if release is not None:
            release.set()
        else:
            proxy.release(1)

    assert provider.parse(responses[0], TOOLS).final_reply == "released"
    assert len(server.requests) == 1


async def test_held_response_reaches_client_only_after_release(nursery: trio.Nursery) -> None:
    server = FakeOpenAIServer([Reply(body=completion("late"))])
    proxy = FaultProxy(await start(nursery, server), {1: Fault.hold(phase="response")})
    provider = make_provider(await start(nursery, proxy))
    responses: list[ProviderResponse] = []

    async def call() -> None:
        responses.append(await provider.complete(make_request()))

    async with trio.open_nursery() as inner:
        inner.start_soon(call)
        await proxy.wait_held(1)
        assert [r.outcome for r in server.requests] == ["responded"]
        assert responses == []
        proxy.release(1)

    assert provider.parse(responses[0], TOOLS).final_reply == "late"


async def test_servers_in_a_thread() -> None:
    # The shape multi-process tests use: servers on a helper thread, waits and
    # releases from the test's own loop.
    server = FakeOpenAIServer([Reply(body=completion("from a thread"))])
    with serve_in_thread(server) as upstream_url:
        proxy = FaultProxy(upstream_url, {1: Fault.hold()})
        with serve_in_thread(proxy) as proxy_url:
            provider = make_provider(proxy_url)
            responses: list[ProviderResponse] = []

            async def call() -> None:
                responses.append(await provider.complete(make_request()))

            async with trio.open_nursery() as inner:
                inner.start_soon(call)
                await proxy.wait_held(1)
                proxy.release(1)
            await server.wait_for_outcomes(1)
            await proxy.wait_for_outcomes(1)

    assert provider.parse(responses[0], TOOLS).final_reply == "from a thread"
    assert [r.outcome for r in server.requests] == ["responded"]
    assert [r.outcome for r in proxy.requests] == ["relayed"]

