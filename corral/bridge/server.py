"""``corral bridge serve``: JSON-RPC 2.0 over HTTP (starlette on hypercorn, trio).

POST ``/rpc`` with ``Authorization: Bearer <token>`` (the scheme in any letter
case); the token names a principal in the registration file. The body is at most
1 MiB, refused while it streams in, and parsed strictly (duplicate keys, invalid
Unicode, floats, unsafe integers and nesting past 64 levels are a parse error):
one request or a batch of at most 50. Each request becomes one ``Store.execute``:
one SQLite transaction, serialised (the store is one writer), in a worker thread.
A notification (no ``id``) runs and gets no reply; a body of notifications only is
answered ``204 No Content``.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from pathlib import Path
from typing import Any

import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from corral.bridge.access import expire
from corral.bridge.methods import METHODS, PRINCIPAL_PATTERN
from corral.bridge.model import ERROR_CODES, BridgeError
from corral.bridge.store import Store
from corral.core import http_service, strict_json
from corral.core.private_file import PrivateFileError, read_private_file

MAX_BODY = 1 << 20
MAX_BATCH = 50
#: A registration file past this is not one (thousands of principals fit).
MAX_REGISTRATION = 4 << 20
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INTERNAL = -32700, -32600, -32601, -32603
#: What the audit log and the events name a notification's request by.
NOTIFICATION_ID = "notification"
_PRINCIPAL = re.compile(PRINCIPAL_PATTERN)
_DIGEST = re.compile(r"^[0-9a-fA-F]{64}$")
_ENTRY_FIELDS = frozenset({"token", "token_sha256"})


class RegistrationError(ValueError):
    pass


def load_principals(path: Path) -> dict[str, str]:
    """``{"principals": {"alice": {"token": "..."} | {"token_sha256": "..."}}}`` ->
    token digest -> principal. Tokens are compared by digest and never logged.

    Everything is checked here, naming the file and the entry: a name a request
    could never carry, an unknown field (a typo would otherwise drop a setting), a
    token and a ``token_sha256`` that disagree. It holds every principal's token, so
    it is read only if no group or other may read it, as an ``api_key_file`` is."""
    try:
        raw = read_private_file(path, "principals file", MAX_REGISTRATION)
    except PrivateFileError as exc:
        raise RegistrationError(str(exc)) from None
    try:
        data = strict_json.loads(raw)
    except strict_json.StrictJsonError as exc:
        raise RegistrationError(f"{path}: {exc}") from None
    if not isinstance(data, dict):
        raise RegistrationError(f"{path}: needs an object with 'principals'")
    unknown = sorted(set(data) - {"principals"})
    if unknown:
        raise RegistrationError(f"{path}: unknown field(s) {unknown} (only 'principals')")
    principals = data.get("principals")
    if not isinstance(principals, dict) or not principals:
        raise RegistrationError(f"{path}: needs a non-empty object 'principals'")
    by_digest: dict[str, str] = {}
    for name, entry in principals.items():
        where = f"{path}: principals[{json.dumps(name)}]"
        if not _PRINCIPAL.match(name):
            raise RegistrationError(f"{where}: not a principal name (1 to 64 of A-Z a-z 0-9 _ . -)")
        digest = _digest(where, entry)
        if digest in by_digest:
            raise RegistrationError(f"{path}: principals {by_digest[digest]} and {name} share a token")
        by_digest[digest] = name
    return by_digest


def _digest(where: str, entry: Any) -> str:
    """The entry's token digest (no token ever goes into a message)."""
    if not isinstance(entry, dict):
        raise RegistrationError(f"{where}: must be an object")
    unknown = sorted(set(entry) - _ENTRY_FIELDS)
    if unknown:
        raise RegistrationError(f"{where}: unknown field(s) {unknown} (only 'token' or 'token_sha256')")
    token, declared = entry.get("token"), entry.get("token_sha256")
    if token is not None and not (isinstance(token, str) and len(token) >= 16):
        raise RegistrationError(f"{where}: the token must be a string of 16+ characters")
    if declared is not None and not (isinstance(declared, str) and _DIGEST.match(declared)):
        raise RegistrationError(f"{where}: token_sha256 must be 64 hex digits")
    if token is None and declared is None:
        raise RegistrationError(f"{where}: needs a token (16+ characters) or token_sha256")
    digest = hashlib.sha256(token.encode()).hexdigest() if token is not None else str(declared).lower()
    if declared is not None and str(declared).lower() != digest:
        raise RegistrationError(f"{where}: token and token_sha256 disagree (keep one of them)")
    return digest


class Bridge:
    def __init__(self, db: Path, principals: dict[str, str]) -> None:
        self.store = Store(db, METHODS, expire)
        self.principals = principals
        self._one_writer = threading.Lock()

    def close(self) -> None:
        self.store.close()

    def principal(self, request: Request) -> str | None:
        # RFC 9110: the scheme is case-insensitive ("bearer", "BEARER").
        scheme, _, token = request.headers.get("authorization", "").strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        return self.principals.get(hashlib.sha256(token.strip().encode()).hexdigest())

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/rpc", self.rpc, methods=["POST"])])

    async def rpc(self, request: Request) -> Response:
        principal = self.principal(request)
        if principal is None:
            return JSONResponse({"error": "a registered bearer token is required"}, 401)
        try:
            body = await http_service.read_body(request, MAX_BODY)
        except http_service.BodyTooLarge as exc:
            return JSONResponse(_error(None, INVALID_REQUEST, str(exc), reason="too-large"), 413)
        except http_service.BadBody as exc:
            return JSONResponse(_error(None, INVALID_REQUEST, str(exc), reason="bad-body"), 400)
        try:
            message = strict_json.loads(body)
            strict_json.check_numbers(message)
        except strict_json.StrictJsonError as exc:
            return JSONResponse(_error(None, PARSE_ERROR, exc.message, reason=exc.code))
        if isinstance(message, list):
            if not message or len(message) > MAX_BATCH:
                return JSONResponse(_error(None, INVALID_REQUEST, f"a batch holds 1 to {MAX_BATCH} requests"))
            replies = [reply for item in message if (reply := await self.one(principal, item)) is not None]
            # JSON-RPC 2.0: no reply to a notification, and no empty array either.
            return JSONResponse(replies) if replies else Response(status_code=204)
        reply = await self.one(principal, message)
        return JSONResponse(reply) if reply is not None else Response(status_code=204)

    async def one(self, principal: str, message: Any) -> dict[str, Any] | None:
        """The reply to one request; None for a notification (a request without
        ``id``), which runs all the same. Whatever is not a request is answered."""
        if (
            not isinstance(message, dict)
            or message.get("jsonrpc") != "2.0"
            or not isinstance(message.get("method"), str)
        ):
            return _error(None, INVALID_REQUEST, "a JSON-RPC 2.0 request object is required")
        notification = "id" not in message
        request_id = message.get("id", NOTIFICATION_ID)
        if not isinstance(request_id, (str, int)) or isinstance(request_id, bool):
            return _error(None, INVALID_REQUEST, "an id is a string or an integer")
        extra = set(message) - {"jsonrpc", "method", "params", "id"}
        if extra:
            return _error(None if notification else request_id, INVALID_REQUEST, f"unknown members {sorted(extra)}")
        params = message.get("params", {})

        def run() -> dict[str, Any]:
            with self._one_writer:
                return self.store.execute(principal, message["method"], params, str(request_id))

        try:
            result = await trio.to_thread.run_sync(run)
        except BridgeError as exc:
            code = METHOD_NOT_FOUND if exc.code == "method-not-found" else ERROR_CODES.get(exc.code, INTERNAL)
            reply = _error(request_id, code, exc.message, reason=exc.code, **exc.data)
        else:
            reply = {"jsonrpc": "2.0", "id": request_id, "result": result}
        return None if notification else reply


def _error(request_id: Any, code: int, message: str, **data: Any) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if data:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": request_id, "error": error}


def describe() -> str:
    """The method table (``corral bridge methods``)."""
    rows = []
    for name, method in sorted(METHODS.items()):
        flags = [flag for flag, on in (("idempotent-key", method.mutating), ("CAS", method.cas),
                                        ("lease-bound", method.lease_bound)) if on]
        required = [k for k in method.params["required"] if k != "idempotency_key"]
        rows.append(f"{name:20} {', '.join(flags) or 'read':38} {method.summary}")
        rows.append(f"{'':20} params: {', '.join(required)}")
    return "\n".join(rows) + "\n" + json.dumps({"errors": ERROR_CODES}, sort_keys=True)
