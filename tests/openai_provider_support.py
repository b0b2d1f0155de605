"""What the OpenAI provider tests share: tool schemas, a request, a provider aimed
at a fake server, and the fixtures for the key.

The fixtures reach a test module only by being imported into it (pytest finds
fixtures by name in the module), so each module imports the ones it uses with a
redundant alias (``import x as x``) that tells ruff the import is deliberate.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import trio
from trio.testing import MockClock

from corral.actors.providers.base import ProviderError, ProviderRequest, ProviderResponse, ToolSchema
from corral.actors.providers.openai import OpenAIConfig, OpenAIProvider
from fake_openai import FakeOpenAIServer, Reply
from fault_proxy import FaultProxy

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
    if "structured" not in config and "native_tools" not in config:
        # These tests script native tool calls; the default way is json_schema.
        config["structured"] = "tools"
    return OpenAIProvider(OpenAIConfig.from_mapping(config))


async def start(nursery: trio.Nursery, server: FakeOpenAIServer | FaultProxy) -> str:
    url: str = await nursery.start(server.serve)
    return url


async def complete_once(nursery: trio.Nursery, reply: Reply, **settings: Any) -> ProviderResponse:
    server = FakeOpenAIServer([reply])
    provider = make_provider(await start(nursery, server), **settings)
    return await provider.complete(make_request())


async def time_out(clock: MockClock, provider: OpenAIProvider, arrived: Callable[[], Awaitable[None]]) -> ProviderError:
    """Call ``provider`` against a server that will not answer in time and return the
    error. Its deadline passes only once ``arrived()`` says the server (or proxy) has
    the request, whatever the load: with ``deadline_clock`` no time passes otherwise."""
    errors: list[ProviderError] = []

    async def call() -> None:
        with pytest.raises(ProviderError) as caught:
            await provider.complete(make_request())
        errors.append(caught.value)

    async with trio.open_nursery() as inner:
        inner.start_soon(call)
        await arrived()
        clock.jump(provider.config.timeout_s)
    [error] = errors
    return error


@pytest.fixture
def no_ambient_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """A provider made by ``make_provider`` has no key, whatever the environment."""
    monkeypatch.delenv(NO_KEY_ENV, raising=False)


@pytest.fixture(params=["sk-decoy-", "plain-decoy-"])
def decoy(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    # The env name escapes redaction's name heuristics, and the "plain-" form escapes
    # its key patterns: only the provider's own registration protects that one.
    key = str(request.param) + secrets.token_hex(16)
    monkeypatch.setenv("CORRAL_DECOY", key)
    yield key
