"""A provider request's stable identity (seed 004 V1.39: "请求指纹只包含实际 Provider 请求的
稳定语义"; V1.40: "请求、Provider 配置、Goal、steer 或项目 revision 任一稳定身份变化时，旧
sidecar 删除"): one SHA-256 per part of what the request sends, so that a durable
retry is sent only when it is the request that failed, and a changed part is named.

Only what the provider is sent counts: the task, the history, the tool catalog and
the servers' notes, the repository context, the agent's instructions, the output
schema, the images, the web search switch and the provider's settings. Not the
run's or agent's id, the loop or the lifecycle slot: they name the request, they
are not in its body. A provider setting whose name says it is a credential counts
only as present, never by its value (a digest of a key would still be derived
from it).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

import msgspec

from corral.actors.providers.base import ProviderRequest
from corral.mailbox.protocol import RequestIdentity

#: Provider setting names kept out of the identity by value.
_CREDENTIAL = re.compile(r"key|secret|token|password|auth|credential", re.IGNORECASE)


def _digest(value: Any) -> str:
    # Sorted keys: the same value in another insertion order is the same request.
    return hashlib.sha256(msgspec.json.encode(value, order="sorted")).hexdigest()


def _without_credentials(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {
            str(name): "<set>" if _CREDENTIAL.search(str(name)) else _without_credentials(inner)
            for name, inner in value.items()
        }
    if isinstance(value, list | tuple):
        return [_without_credentials(inner) for inner in value]
    return value


def _settings(provider: str, config: Mapping[str, Any]) -> dict[str, Any]:
    return {"provider": provider, "config": _without_credentials(config)}


def request_identity(request: ProviderRequest, provider: str, config: Mapping[str, Any]) -> RequestIdentity:
    """The identity of ``request`` sent by ``provider`` with its settings ``config``."""
    return RequestIdentity(
        task=_digest(request.task),
        history=_digest(request.history),
        tools=_digest(request.tools),
        tool_notes=_digest(request.tool_notes),
        project_context=_digest(request.project_context),
        instructions=_digest(request.instructions),
        output_schema=_digest(request.output_schema),
        # The images by their content's digest (what the ledger keeps of them too).
        images=_digest([(image.action_id, image.path, image.mime, image.sha256) for image in request.images]),
        web_search=_digest(request.web_search),
        provider=_digest(_settings(provider, config)),
    )
