"""The OpenAI-compatible provider's configuration: the API key (sent to the
server, never kept anywhere else; key files and their permissions) and the
checks on the config mapping.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import pytest
import trio
from trio.testing import MockClock

from corral.actors.providers.base import ErrorKind, ProviderError
from corral.actors.providers.openai import OpenAIConfig, OpenAIConfigError, OpenAIHTTPError
from corral.core.redact import redact_text
from corral.supervisor.runs.response_secrets import Handling, handoff_verdict
from fake_openai import FakeOpenAIServer, Reply, completion
from tests.openai_provider_support import TOOLS, make_provider, make_request, start, time_out

# Fixtures, imported so that pytest finds them in this module (see openai_provider_support).
from tests.openai_provider_support import decoy as decoy
from tests.openai_provider_support import no_ambient_key as no_ambient_key

pytestmark = pytest.mark.usefixtures("no_ambient_key")


# --- the API key ------------------------------------------------------------------


def _texts_of(exc: BaseException) -> str:
    parts = []
    seen: BaseException | None = exc
    while seen is not None:
        parts += [str(seen), repr(seen)]
        seen = seen.__cause__ or seen.__context__
    return "\n".join(parts)


async def test_decoy_key_is_sent_but_never_kept(nursery: trio.Nursery, deadline_clock: MockClock, decoy: str) -> None:
    server = FakeOpenAIServer(
        [
            Reply(body=completion(f"I saw your key {decoy}, nice")),
            Reply(500, {"error": {"message": f"bad key {decoy}"}}),
            Reply(hang=True),
        ],
        expected_api_key=decoy,
    )
    provider = make_provider(await start(nursery, server), api_key_env="CORRAL_DECOY", timeout_s=0.3)

    # On deadline_clock the first two cannot time out, however slow the machine; the
    # third's deadline passes once the server has it (and has checked its key).
    response = await provider.complete(make_request())
    with pytest.raises(ProviderError) as http_error:
        await provider.complete(make_request())
    timeout_error = await time_out(deadline_clock, provider, lambda: server.wait_for_requests(3))
    plan = provider.parse(response, TOOLS)

    # Sent, and correct: the server compared it and recorded only the verdict.
    assert [(r.has_authorization, r.authorized) for r in server.requests] == [(True, True)] * 3
    # The response is handed off as it came (seed 004 V1.43: the supervisor's handoff
    # decides): a final reply is stored filtered, and a plan holding the key refused.
    assert handoff_verdict(response.text, redact_text(response.text), {"actions": [], "final": plan.final_reply}
                           ).handling is Handling.FILTER
    assert decoy not in redact_text(response.text) and "[redacted]" in redact_text(response.text)
    assert handoff_verdict(response.text, redact_text(response.text), None).handling is Handling.REFUSE
    kept = [
        json.dumps(response.meta),
        _texts_of(http_error.value),
        _texts_of(timeout_error),
        repr(server.requests),
        repr(provider),
        repr(provider.config),
    ]
    for text in kept:
        assert decoy not in text


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
    assert config.structured == "json_schema" and config.native_tools is None
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


# --- reasoning effort (seed 004 V1.2) ---------------------------------------------------


def test_reasoning_effort_goes_in_the_body_unless_default() -> None:
    from corral.actors.providers.openai import build_chat_payload

    base = {"base_url": "http://localhost:8000/v1", "model": "m"}
    high = OpenAIConfig.from_mapping({**base, "reasoning_effort": "high"})
    assert build_chat_payload(high, make_request())["reasoning_effort"] == "high"
    assert "reasoning_effort" not in build_chat_payload(OpenAIConfig.from_mapping(base), make_request())
    with pytest.raises(OpenAIConfigError, match="reasoning_effort must be one of default, low, medium, high"):
        OpenAIConfig.from_mapping({**base, "reasoning_effort": "max"})


def test_reasoning_effort_is_per_agent_inherited_from_the_spec_and_checked_at_load() -> None:
    from corral.supervisor.spec.swarm_spec import SpecError, parse_spec

    openai = {"provider": "openai", "openai": {"base_url": "http://localhost:8000/v1", "model": "m"}}
    spec = parse_spec({
        "reasoning_effort": "medium",
        "agents": [{"id": "own", **openai, "reasoning_effort": "high"}, {"id": "inherits", **openai},
                   {"id": "plain", **openai, "reasoning_effort": "default"}, {"id": "s", "steps": [{"final": "x"}]}],
    })
    efforts = {agent.id: agent.provider_config.get("reasoning_effort") for agent in spec.agents}
    assert efforts == {"own": "high", "inherits": "medium", "plain": None, "s": None}
    for bad, message in [
        ({"agents": [{"id": "a", **openai, "reasoning_effort": "max"}]}, "reasoning_effort"),
        ({"reasoning_effort": "extreme"}, "reasoning_effort"),
        ({"agents": [{"id": "a", "steps": [{"final": "x"}], "reasoning_effort": "low"}]}, "only an openai provider"),
        ({"agents": [{"id": "a", "provider": "openai", "openai": {**openai["openai"], "reasoning_effort": "low"}}]},
         "set it on the agent"),
    ]:
        with pytest.raises(SpecError, match=message):
            parse_spec(bad)
