"""A provider request's identity and the retry check that compares it (seed 004
V1.39: "重建请求指纹"; V1.40: "仅含字段名的 retry_superseded 审计"): pure, no process."""

from __future__ import annotations

import msgspec

from corral.actors.providers.base import ProviderRequest
from corral.actors.request_identity import request_identity
from corral.supervisor.runs import retry_identity

CONFIG = {"model": "m1", "api_key": "sk-secretVALUE0123456789", "headers": {"Authorization": "Bearer xyz"}}


def _request(**changes: object) -> ProviderRequest:
    base = {"run_id": "run-a", "agent_id": "llm", "task": "say done", "loop_index": 0, "history": (), "tools": ()}
    return ProviderRequest(**{**base, **changes})  # type: ignore[arg-type]


def test_the_same_request_has_the_same_identity_whatever_names_it() -> None:
    one = request_identity(_request(slot="run-a:0"), "openai", CONFIG)
    other = request_identity(_request(slot="run-a:0-transient-1", agent_id="llm-2"), "openai", dict(CONFIG))
    assert one == other
    assert retry_identity.changed_parts(retry_identity.stored(one) or "", other) == ()


def test_each_changed_part_is_named_and_nothing_else() -> None:
    kept = retry_identity.stored(request_identity(_request(project_context="Be brief."), "openai", CONFIG))
    assert kept is not None
    now = request_identity(
        _request(project_context="Be verbose.", history=({"role": "user", "kind": "steer", "text": "x"},)),
        "openai",
        {**CONFIG, "model": "m2"},
    )
    assert retry_identity.changed_parts(kept, now) == ("history", "project_context", "provider")


def test_a_credential_counts_only_as_present_and_no_text_is_kept() -> None:
    one = request_identity(_request(project_context="SECRET-CONTEXT"), "openai", CONFIG)
    rotated = {**CONFIG, "api_key": "sk-anotherVALUE987654321", "headers": {"Authorization": "Bearer abc"}}
    assert request_identity(_request(project_context="SECRET-CONTEXT"), "openai", rotated) == one
    kept = retry_identity.stored(one) or ""
    assert "SECRET-CONTEXT" not in kept and "sk-" not in kept and "Bearer" not in kept
    assert set(msgspec.json.decode(kept)) == set(retry_identity.PARTS)


def test_a_kept_identity_that_does_not_decode_supersedes_the_retry() -> None:
    now = request_identity(_request(), "openai", CONFIG)
    assert retry_identity.changed_parts("{not json", now) == retry_identity.PARTS
    assert retry_identity.changed_parts('{"task": "0"}', now) == retry_identity.PARTS
