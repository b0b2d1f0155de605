"""The OpenAI-compatible provider, over real HTTP against the fake server.

Every test synchronises on what the fake server or proxy recorded, never on
sleeps; the only timeouts are the provider's own (short) ones under test.
"""

from __future__ import annotations

import json
import secrets
import socket
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from corral.actors.providers.base import (
    MAX_ACTIONS_PER_PLAN,
    ErrorKind,
    PlanError,
    ProviderError,
    ProviderRequest,
    ProviderResponse,
    RepairCategory,
    ToolSchema,
)
from corral.actors.providers.openai import (
    TEXT_JSON_INSTRUCTION,
    OpenAIConfig,
    OpenAIConfigError,
    OpenAIHTTPError,
    OpenAIProvider,
    build_chat_payload,
)
from corral.actors.providers.plan_parse import (
    MAX_REPAIR_CHARS,
    RepairCounter,
    parse_chat_completion,
    repair_message,
    strip_reasoning,
    validate,
)
from fake_openai import (
    FakeOpenAIServer,
    Fault,
    FaultProxy,
    Reply,
    completion,
    serve_in_thread,
    tool_call,
)

NO_KEY_ENV = "CORRAL_TEST_NO_SUCH_KEY"

READ_FILE = ToolSchema(
    name="read_file",
    description="Read a text file",
    input_schema={
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "required": ["path"],
        "additionalProperties": False,
    },
    read_only=True,
)
WRITE_FILE = ToolSchema(
    name="write_file",
    description="Write a text file",
    input_schema={
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "content": {"type": "string"},
            "mode": {"type": "string", "enum": ["overwrite", "append"]},
        },
        "required": ["path", "content"],
        "additionalProperties": False,
    },
    read_only=False,
)
FS_STAT = ToolSchema(
    name="fs.stat",
    description="Stat paths",
    input_schema={
        "type": "object",
        "properties": {"paths": {"type": "array", "items": {"type": "string"}}},
        "required": ["paths"],
    },
    read_only=True,
)
TOOLS = (READ_FILE, WRITE_FILE, FS_STAT)


def make_request(history: tuple[dict[str, Any], ...] = ()) -> ProviderRequest:
    return ProviderRequest(
        run_id="run-1",
        agent_id="agent-1",
        task="Summarise notes.txt",
        loop_index=len(history),
        history=history,
        tools=TOOLS,
        slot="run-1:0",
    )


def make_provider(url: str, **settings: Any) -> OpenAIProvider:
    config: dict[str, Any] = {
        "base_url": url,
        "model": "fake-model",
        "api_key_env": NO_KEY_ENV,
        "timeout_s": 5.0,
    }
    config.update(settings)
    return OpenAIProvider(OpenAIConfig.from_mapping(config))


async def start(nursery: trio.Nursery, server: FakeOpenAIServer | FaultProxy) -> str:
    url: str = await nursery.start(server.serve)
    return url


async def complete_once(nursery: trio.Nursery, reply: Reply, **settings: Any) -> ProviderResponse:
    server = FakeOpenAIServer([reply])
    provider = make_provider(await start(nursery, server), **settings)
    return await provider.complete(make_request())


@pytest.fixture(autouse=True)
def _no_ambient_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(NO_KEY_ENV, raising=False)


# --- plans over HTTP --------------------------------------------------------------


async def test_native_tool_calls_become_a_plan(nursery: trio.Nursery) -> None:
    body = completion(
        tool_calls=[
            tool_call("read_file", {"path": "notes.txt"}),
            tool_call("fs_stat", {"paths": ["a", "b"]}),  # the wire name of fs.stat
        ]
    )
    server = FakeOpenAIServer([Reply(body=body)])
    provider = make_provider(await start(nursery, server))

    response = await provider.complete(make_request())
    plan = provider.parse(response, TOOLS)

    assert [(a.tool, a.input) for a in plan.actions] == [
        ("read_file", {"path": "notes.txt"}),
        ("fs.stat", {"paths": ["a", "b"]}),
    ]
    assert plan.final_reply is None
    assert json.loads(response.text) == body
    assert response.meta["status"] == 200
    assert response.meta["seq"] == 1
    assert response.meta["mode"] == "native"
    [record] = server.requests
    assert (record.method, record.path, record.seq) == ("POST", "/v1/chat/completions", 1)


async def test_plain_text_is_the_final_reply_with_native_tools(nursery: trio.Nursery) -> None:
    content = "Here is the summary:\n```python\nprint('not a plan')\n```"
    response = await complete_once(nursery, Reply(body=completion(content)))
    plan = make_provider("http://127.0.0.1:1").parse(response, TOOLS)
    assert plan.final_reply == content


async def test_tool_call_leaked_into_content_is_still_a_call(nursery: trio.Nursery) -> None:
    content = json.dumps({"name": "read_file", "arguments": {"path": "a.txt"}})
    response = await complete_once(nursery, Reply(body=completion(content)))
    plan = make_provider("http://127.0.0.1:1").parse(response, TOOLS)
    assert [(a.tool, a.input) for a in plan.actions] == [("read_file", {"path": "a.txt"})]


@pytest.mark.parametrize(
    ("content", "expected_actions", "expected_final"),
    [
        (
            'Sure.\n```json\n{"actions": [{"tool": "read_file", "input": {"path": "n"}}]}\n```',
            [("read_file", {"path": "n"})],
            None,
        ),
        ('{"final": "All done."} (that is my answer)', [], "All done."),
        ('I will now answer: {"final": "ok"}', [], "ok"),
    ],
)
async def test_text_json_fallback(
    nursery: trio.Nursery,
    content: str,
    expected_actions: list[tuple[str, dict[str, Any]]],
    expected_final: str | None,
) -> None:
    server = FakeOpenAIServer([Reply(body=completion(content))])
    provider = make_provider(await start(nursery, server), native_tools=False)

    response = await provider.complete(make_request())
    plan = provider.parse(response, TOOLS)

    assert response.meta["mode"] == "text-json"
    assert [(a.tool, a.input) for a in plan.actions] == expected_actions
    assert plan.final_reply == expected_final


async def test_text_json_mode_rejects_prose(nursery: trio.Nursery) -> None:
    server = FakeOpenAIServer([Reply(body=completion("I think we are done here."))])
    provider = make_provider(await start(nursery, server), native_tools=False)
    response = await provider.complete(make_request())
    with pytest.raises(PlanError) as caught:
        provider.parse(response, TOOLS)
    assert caught.value.category is RepairCategory.BAD_JSON


async def test_recorded_mode_wins_over_a_changed_config(nursery: trio.Nursery) -> None:
    # A response committed under text-JSON is re-read the same way after a restart
    # with native tools configured.
    server = FakeOpenAIServer([Reply(body=completion('{"final": "from json"}'))])
    url = await start(nursery, server)
    response = await make_provider(url, native_tools=False).complete(make_request())
    plan = make_provider(url, native_tools=True).parse(response, TOOLS)
    assert plan.final_reply == "from json"


@pytest.mark.parametrize(
    ("native", "content", "final"),
    [
        (True, '<think>call read_file {"path": </think>The answer is 42.', "The answer is 42."),
        (False, '<thinking>{"final": "wrong"}</thinking>\n{"final": "right"}', "right"),
        (False, 'I should answer.</think>{"final": "after orphan close"}', "after orphan close"),
    ],
)
async def test_reasoning_blocks_are_stripped(
    nursery: trio.Nursery, native: bool, content: str, final: str
) -> None:
    server = FakeOpenAIServer([Reply(body=completion(content))])
    provider = make_provider(await start(nursery, server), native_tools=native)
    plan = provider.parse(await provider.complete(make_request()), TOOLS)
    assert plan.final_reply == final


def _too_many_calls() -> list[dict[str, Any]]:
    n = MAX_ACTIONS_PER_PLAN + 1
    return [tool_call("read_file", {"path": f"f{i}"}, f"c{i}") for i in range(n)]


@pytest.mark.parametrize(
    ("body", "category"),
    [
        (completion(tool_calls=[tool_call("rm_rf", {})]), RepairCategory.UNKNOWN_TOOL),
        (completion(tool_calls=[tool_call("read_file", '{"path": ')]), RepairCategory.BAD_JSON),
        (completion(tool_calls=[tool_call("read_file", {"path": 3})]), RepairCategory.SCHEMA_MISMATCH),
        (completion(tool_calls=[tool_call("read_file", {})]), RepairCategory.SCHEMA_MISMATCH),
        (
            completion(tool_calls=[tool_call("read_file", {"path": "a", "extra": 1})]),
            RepairCategory.SCHEMA_MISMATCH,
        ),
        (
            completion(tool_calls=[tool_call("write_file", {"path": "a", "content": "", "mode": "x"})]),
            RepairCategory.SCHEMA_MISMATCH,
        ),
        (completion(tool_calls=_too_many_calls()), RepairCategory.TOO_MANY_ACTIONS),
        (completion(content=""), RepairCategory.EMPTY_PLAN),
        (completion(content="<think>only thoughts, then out of tokens"), RepairCategory.EMPTY_PLAN),
        (completion(content='{"actions": []}'), RepairCategory.EMPTY_PLAN),
    ],
)
async def test_each_repair_category(
    nursery: trio.Nursery, body: dict[str, Any], category: RepairCategory
) -> None:
    response = await complete_once(nursery, Reply(body=body))
    with pytest.raises(PlanError) as caught:
        make_provider("http://127.0.0.1:1").parse(response, TOOLS)
    assert caught.value.category is category

    message = repair_message(caught.value.category, caught.value.detail)
    assert message["role"] == "user"
    assert category.value in message["content"]
    assert len(message["content"]) <= MAX_REPAIR_CHARS


@pytest.mark.parametrize(
    "body",
    [b"<html>502 Bad Gateway</html>", b"", b"   ", b'{"choices": []}', b"[1, 2]", b'{"id": "x"'],
)
async def test_garbage_or_empty_body_is_bad_json_at_parse(nursery: trio.Nursery, body: bytes) -> None:
    response = await complete_once(nursery, Reply(body=body))
    with pytest.raises(PlanError) as caught:
        make_provider("http://127.0.0.1:1").parse(response, TOOLS)
    assert caught.value.category is RepairCategory.BAD_JSON


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
async def test_timeout_is_transient_with_exactly_one_request(nursery: trio.Nursery, reply: Reply) -> None:
    server = FakeOpenAIServer([reply], default=Reply(body=completion("a hidden retry")))
    provider = make_provider(await start(nursery, server), timeout_s=0.3)
    with pytest.raises(ProviderError) as caught:
        await provider.complete(make_request())
    assert caught.value.kind is ErrorKind.TRANSIENT
    # complete() has returned and its client is closed: nothing can still be sent.
    assert len(server.requests) == 1


async def test_hung_request_is_abandoned_by_the_client(nursery: trio.Nursery) -> None:
    server = FakeOpenAIServer([Reply(hang=True)])
    provider = make_provider(await start(nursery, server), timeout_s=0.3)
    with pytest.raises(ProviderError):
        await provider.complete(make_request())
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
    nursery: trio.Nursery, fault: Fault | None, upstream_sees: int
) -> None:
    server = FakeOpenAIServer([Reply(hang=True)])
    proxy = FaultProxy(await start(nursery, server), {1: fault} if fault else {})
    provider = make_provider(await start(nursery, proxy), timeout_s=0.3)
    with pytest.raises(ProviderError) as caught:
        await provider.complete(make_request())
    assert caught.value.kind is ErrorKind.TRANSIENT
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


# --- the API key ------------------------------------------------------------------


@pytest.fixture(params=["sk-decoy-", "plain-decoy-"])
def decoy(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    # The env name escapes redaction's name heuristics, and the "plain-" form escapes
    # its key patterns: only the provider's own registration protects that one.
    key = str(request.param) + secrets.token_hex(16)
    monkeypatch.setenv("CORRAL_DECOY", key)
    yield key


def _texts_of(exc: BaseException) -> str:
    parts = []
    seen: BaseException | None = exc
    while seen is not None:
        parts += [str(seen), repr(seen)]
        seen = seen.__cause__ or seen.__context__
    return "\n".join(parts)


async def test_decoy_key_is_sent_but_never_kept(nursery: trio.Nursery, decoy: str) -> None:
    server = FakeOpenAIServer(
        [
            Reply(body=completion(f"I saw your key {decoy}, nice")),
            Reply(500, {"error": {"message": f"bad key {decoy}"}}),
            Reply(hang=True),
        ],
        expected_api_key=decoy,
    )
    provider = make_provider(await start(nursery, server), api_key_env="CORRAL_DECOY", timeout_s=0.3)

    response = await provider.complete(make_request())
    with pytest.raises(ProviderError) as http_error:
        await provider.complete(make_request())
    with pytest.raises(ProviderError) as timeout_error:
        await provider.complete(make_request())
    plan = provider.parse(response, TOOLS)

    # Sent, and correct: the server compared it and recorded only the verdict.
    assert [(r.has_authorization, r.authorized) for r in server.requests] == [(True, True)] * 3
    kept = [
        response.text,
        json.dumps(response.meta),
        plan.final_reply or "",
        _texts_of(http_error.value),
        _texts_of(timeout_error.value),
        repr(server.requests),
        repr(provider),
        repr(provider.config),
    ]
    for text in kept:
        assert decoy not in text
    assert "[redacted]" in response.text


async def test_wrong_key_is_an_http_error(nursery: trio.Nursery, decoy: str) -> None:
    server = FakeOpenAIServer([Reply(body=completion("never"))], expected_api_key="sk-other-1234567")
    provider = make_provider(await start(nursery, server), api_key_env="CORRAL_DECOY")
    with pytest.raises(OpenAIHTTPError) as caught:
        await provider.complete(make_request())
    assert caught.value.status == 401
    assert decoy not in _texts_of(caught.value)
    assert [r.authorized for r in server.requests] == [False]


async def test_key_file_with_mode_0600_is_used(nursery: trio.Nursery, tmp_path: Path) -> None:
    key = "sk-file-" + secrets.token_hex(16)
    path = tmp_path / "key"
    path.write_text(key + "\n")
    path.chmod(0o600)
    server = FakeOpenAIServer([Reply(body=completion("ok"))], expected_api_key=key)
    provider = make_provider(await start(nursery, server), api_key_file=str(path))
    await provider.complete(make_request())
    assert [r.authorized for r in server.requests] == [True]


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
def test_key_file_readable_by_others_is_refused(tmp_path: Path, mode: int) -> None:
    key = "sk-file-" + secrets.token_hex(16)
    path = tmp_path / "key"
    path.write_text(key)
    path.chmod(mode)
    with pytest.raises(OpenAIConfigError) as caught:
        make_provider("http://127.0.0.1:1/v1", api_key_file=str(path))
    message = str(caught.value)
    assert caught.value.kind is ErrorKind.FATAL
    assert f"{mode:04o}" in message
    assert "chmod 600" in message
    assert key not in message


def test_missing_key_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(OpenAIConfigError, match="does not exist"):
        make_provider("http://127.0.0.1:1/v1", api_key_file=str(tmp_path / "absent"))


def test_too_short_key_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_SHORT", "abc")
    with pytest.raises(OpenAIConfigError, match="shorter than"):
        make_provider("http://127.0.0.1:1/v1", api_key_env="CORRAL_SHORT")


# --- configuration ----------------------------------------------------------------


def test_config_from_mapping_defaults() -> None:
    config = OpenAIConfig.from_mapping({"base_url": "http://localhost:8000/v1/", "model": "m"})
    assert config.base_url == "http://localhost:8000/v1"
    assert config.endpoint == "http://localhost:8000/v1/chat/completions"
    assert config.api_key_env == "OPENAI_API_KEY"
    assert config.max_response_bytes == 256 * 1024
    assert config.native_tools is True
    assert config.temperature is None


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"timeout": 3}, "unknown openai provider setting"),
        ({"api_key": "sk-x"}, "api_key must not be in the config"),
        ({"timeout_s": "30"}, "timeout_s must be a number"),
        ({"timeout_s": 0}, "timeout_s must be in"),
        ({"max_response_bytes": 0}, "max_response_bytes must be a positive integer"),
        ({"max_response_bytes": True}, "max_response_bytes must be a positive integer"),
        ({"native_tools": "no"}, "native_tools must be true or false"),
        ({"temperature": 3}, "temperature must be in"),
        ({"base_url": "http://user:pw@host/v1"}, "must not contain credentials"),
        ({"base_url": "localhost:8000"}, "base_url must be an http(s) URL"),
        ({"model": ""}, "model must be a non-empty string"),
    ],
)
def test_config_errors_are_clear(overrides: dict[str, Any], fragment: str) -> None:
    settings: dict[str, Any] = {"base_url": "http://localhost:8000/v1", "model": "m"}
    settings.update(overrides)
    with pytest.raises(OpenAIConfigError) as caught:
        OpenAIConfig.from_mapping(settings)
    assert fragment in str(caught.value)
    assert caught.value.kind is ErrorKind.FATAL


def test_config_requires_model() -> None:
    with pytest.raises(OpenAIConfigError, match="needs 'model'"):
        OpenAIConfig.from_mapping({"base_url": "http://localhost/v1"})


# --- the request body -------------------------------------------------------------


HISTORY: tuple[dict[str, Any], ...] = (
    {"action_id": "a1", "tool": "read_file", "status": "ok", "output": "x" * 20_000},
    {"role": "repair", "category": "unknown-tool", "detail": "no tool 'rm'"},
)


def test_native_payload_has_one_schema_per_tool() -> None:
    config = OpenAIConfig(base_url="http://localhost/v1", model="m", temperature=0)
    payload = build_chat_payload(config, make_request(HISTORY))

    assert payload["model"] == "m"
    assert payload["temperature"] == 0
    assert payload["stream"] is False
    functions = [spec["function"] for spec in payload["tools"]]
    assert [f["name"] for f in functions] == ["read_file", "write_file", "fs_stat"]
    assert [f["parameters"] for f in functions] == [t.input_schema for t in TOOLS]
    system, task, observation, repair = payload["messages"]
    assert system["role"] == "system"
    assert task == {"role": "user", "content": "Task: Summarise notes.txt"}
    assert observation["content"].startswith("Observation for action a1 (tool read_file")
    assert len(observation["content"]) < 9000  # bounded
    assert "unknown-tool" in repair["content"]


def test_text_json_payload_describes_tools_in_the_prompt() -> None:
    config = OpenAIConfig(base_url="http://localhost/v1", model="m", native_tools=False)
    payload = build_chat_payload(config, make_request())
    assert "tools" not in payload
    system = payload["messages"][0]["content"]
    assert TEXT_JSON_INSTRUCTION in system
    for tool in TOOLS:
        assert tool.name in system


def test_payload_redacts_secrets_in_observations(decoy: str) -> None:
    history = ({"action_id": "a1", "tool": "read_file", "status": "ok", "output": decoy},)
    provider = OpenAIProvider(
        OpenAIConfig(base_url="http://localhost/v1", model="m", api_key_env="CORRAL_DECOY")
    )
    payload = build_chat_payload(provider.config, make_request(history))
    assert decoy not in json.dumps(payload)


# --- pure parsing -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "stripped"),
    [
        ("<think>a</think>answer", "answer"),
        ("<THINK>a</THINK> <reasoning>b</reasoning> answer", "answer"),
        ("<think>never closed, out of tokens", ""),
        ("thinking without the opening tag</think>answer", "answer"),
        ('<think type="x">a</think>{"final": "x"}', '{"final": "x"}'),
        ("no reasoning at all", "no reasoning at all"),
    ],
)
def test_strip_reasoning(text: str, stripped: str) -> None:
    assert strip_reasoning(text) == stripped


@pytest.mark.parametrize(
    ("value", "schema", "ok"),
    [
        (1, {"type": "integer"}, True),
        (True, {"type": "integer"}, False),
        (1.5, {"type": "integer"}, False),
        (1.5, {"type": "number"}, True),
        (None, {"type": ["string", "null"]}, True),
        ("b", {"enum": ["a", "b"]}, True),
        ("c", {"enum": ["a", "b"]}, False),
        (["a", 1], {"type": "array", "items": {"type": "string"}}, False),
        ({"a": {"b": 1}}, {"properties": {"a": {"properties": {"b": {"type": "string"}}}}}, False),
        ({"x": 1}, {"type": "object", "additionalProperties": {"type": "integer"}}, True),
        ({"x": "1"}, {"type": "object", "additionalProperties": {"type": "integer"}}, False),
        ({}, {"type": "object", "required": ["a"]}, False),
        ("s", {"type": "string", "minLength": 5}, True),  # unknown keywords ignored
    ],
)
def test_validate(value: Any, schema: dict[str, Any], ok: bool) -> None:
    assert (validate(value, schema) is None) is ok


def test_validation_detail_names_the_path() -> None:
    body = json.dumps(completion(tool_calls=[tool_call("fs.stat", {"paths": ["a", 2]})]))
    with pytest.raises(PlanError) as caught:
        parse_chat_completion(body, TOOLS)
    assert "$.paths[1]" in caught.value.detail


def test_plan_with_both_actions_and_final_is_a_mismatch() -> None:
    body = json.dumps(completion('{"actions": [], "final": "x"}'))
    with pytest.raises(PlanError) as caught:
        parse_chat_completion(body, TOOLS, text_json=True)
    assert caught.value.category is RepairCategory.SCHEMA_MISMATCH


def test_repair_message_is_bounded_and_redacted(decoy: str) -> None:
    make_provider("http://127.0.0.1:1/v1", api_key_env="CORRAL_DECOY")  # loads the key
    message = repair_message(RepairCategory.BAD_JSON, f"{decoy} " + "y" * 5000)
    assert len(message["content"]) <= MAX_REPAIR_CHARS
    assert decoy not in message["content"]


def test_repair_counter_counts_per_category() -> None:
    counter = RepairCounter()
    assert not counter.exhausted(2)
    counter.record(RepairCategory.BAD_JSON)
    counter.record(RepairCategory.BAD_JSON)
    counter.record(RepairCategory.UNKNOWN_TOOL)
    assert counter.count(RepairCategory.BAD_JSON) == 2
    assert counter.total == 3
    assert counter.exhausted(2, RepairCategory.BAD_JSON)
    assert not counter.exhausted(2, RepairCategory.UNKNOWN_TOOL)
    assert counter.exhausted(2)
    assert counter.as_dict() == {"bad-json": 2, "unknown-tool": 1}
    assert RepairCounter(counter.as_dict()).as_dict() == counter.as_dict()


def test_repair_counter_rebuilds_from_history() -> None:
    counter = RepairCounter.from_history(HISTORY + HISTORY)
    assert counter.as_dict() == {"unknown-tool": 2}
