"""MCP servers (supervisor/mcp/mcp_service.py): a server actor's catalog or failure,
and an agent's call of an MCP tool once its action is ``executing``."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

import msgspec
from msgspec import UNSET, UnsetType

from corral.mailbox.protocol.base import Ack, Id, Method, Request

ServerId = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]


class OtherContent(msgspec.Struct, kw_only=True):
    """A content item of a result that is not text (an image, audio, a resource):
    its facts only, never its bytes (seed 004 V1.22: "只给类型、MIME、大小和 SHA-256 元数据")."""

    type: str
    mime_type: str | UnsetType | None = UNSET
    bytes: int | UnsetType = UNSET
    sha256: str | UnsetType = UNSET


class McpResult(msgspec.Struct, kw_only=True):
    """An MCP CallToolResult as plain JSON (actors/mcp_actor.py ``result_payload``):
    its text joined, its structured content kept as the server gave it (any JSON)."""

    is_error: bool
    text: str
    structured: Any
    other_content: list[OtherContent]


class McpAnswer(msgspec.Struct, kw_only=True):
    """``mcp.call``'s reply: the server's result (inline, or a preview with the
    ``sidecar`` file that holds it whole), or why the call failed cleanly (``code``,
    ``error``). The fields a kind of answer lacks stay absent (``UNSET``)."""

    ok: bool
    result: McpResult | UnsetType = UNSET
    sidecar: str | UnsetType = UNSET
    bytes: int | UnsetType = UNSET
    truncated: bool | UnsetType = UNSET
    code: str | UnsetType = UNSET
    error: str | UnsetType = UNSET


class McpReady(Request[Ack], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``mcp.ready``: the server's session is up; ``tools`` as its tools/list gave them
    (supervisor/mcp/mcp_catalog.py turns them into catalog entries, or skips them)."""

    METHOD: ClassVar[Method] = Method.MCP_READY
    server: ServerId
    tools: list[dict[str, Any]]
    #: Kept to 8000 and 200 characters by the supervisor.
    instructions: str = ""
    server_info: dict[str, str] = msgspec.field(default_factory=dict)


class McpFailed(Request[Ack], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``mcp.failed``: the server could not start or stopped answering; its log file
    and the last lines of its stderr (bounded by the supervisor)."""

    METHOD: ClassVar[Method] = Method.MCP_FAILED
    server: ServerId
    error: str = "failed"
    log: str = ""
    stderr_tail: list[str] = msgspec.field(default_factory=list)


class McpCall(Request[McpAnswer], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``mcp.call``: one tools/call for an executing MCP tool action of the caller's run."""

    METHOD: ClassVar[Method] = Method.MCP_CALL
    action_id: Id
    arguments: dict[str, Any]


#: MCP servers' requests (the package's ``TypedRequest`` includes them).
McpRequest = McpReady | McpFailed | McpCall
