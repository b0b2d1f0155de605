"""``corral bridge serve``: JSON-RPC 2.0 over HTTP (starlette on hypercorn, trio).

POST ``/rpc`` with ``Authorization: Bearer <token>``; the token names a principal
in the registration file. The body is parsed strictly (duplicate keys, invalid
Unicode, floats and unsafe integers are a parse error), at most 1 MiB, one request
or a batch of at most 50. Each request becomes one ``Store.execute``: one SQLite
transaction, serialised (the store is one writer), in a worker thread.
"""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path
from typing import Any

import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from corral.bridge.access import expire
from corral.bridge.methods import METHODS
from corral.bridge.model import ERROR_CODES, BridgeError
from corral.bridge.store import Store
from corral.core import strict_json

MAX_BODY = 1 << 20
MAX_BATCH = 50
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INTERNAL = -32700, -32600, -32601, -32603


class RegistrationError(ValueError):
    pass


def load_principals(path: Path) -> dict[str, str]:
    """``{"principals": {"alice": {"token": "..."} | {"token_sha256": "..."}}}`` ->
    token digest -> principal. Tokens are compared by digest and never logged."""
    try:
        data = strict_json.loads(path.read_bytes())
    except (OSError, strict_json.StrictJsonError) as exc:
        raise RegistrationError(f"{path}: {exc}") from None
    principals = data.get("principals") if isinstance(data, dict) else None
    if not isinstance(principals, dict) or not principals:
        raise RegistrationError(f"{path}: needs a non-empty object 'principals'")
    by_digest: dict[str, str] = {}
    for name, entry in principals.items():
        if not isinstance(entry, dict):
            raise RegistrationError(f"{path}: principals.{name} must be an object")
        token, digest = entry.get("token"), entry.get("token_sha256")
        if isinstance(token, str) and len(token) >= 16:
            digest = hashlib.sha256(token.encode()).hexdigest()
        if not isinstance(digest, str) or len(digest) != 64:
            raise RegistrationError(f"{path}: principals.{name} needs a token (16+ characters) or token_sha256")
        if digest in by_digest:
            raise RegistrationError(f"{path}: principals {by_digest[digest]} and {name} share a token")
        by_digest[digest] = name
    return by_digest


class Bridge:
    def __init__(self, db: Path, principals: dict[str, str]) -> None:
        self.store = Store(db, METHODS, expire)
        self.principals = principals
        self._one_writer = threading.Lock()

    def close(self) -> None:
        self.store.close()

    def principal(self, request: Request) -> str | None:
        header = request.headers.get("authorization", "")
        if not header.startswith("Bearer "):
            return None
        return self.principals.get(hashlib.sha256(header[7:].strip().encode()).hexdigest())

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/rpc", self.rpc, methods=["POST"])])

    async def rpc(self, request: Request) -> Response:
        principal = self.principal(request)
        if principal is None:
            return JSONResponse({"error": "a registered bearer token is required"}, 401)
        body = await request.body()
        if len(body) > MAX_BODY:
            return JSONResponse(_error(None, PARSE_ERROR, f"the body is over {MAX_BODY} bytes"), 413)
        try:
            message = strict_json.loads(body)
            strict_json.check_numbers(message)
        except strict_json.StrictJsonError as exc:
            return JSONResponse(_error(None, PARSE_ERROR, exc.message, reason=exc.code))
        if isinstance(message, list):
            if not message or len(message) > MAX_BATCH:
                return JSONResponse(_error(None, INVALID_REQUEST, f"a batch holds 1 to {MAX_BATCH} requests"))
            return JSONResponse([await self.one(principal, item) for item in message])
        return JSONResponse(await self.one(principal, message))

    async def one(self, principal: str, message: Any) -> dict[str, Any]:
        if (
            not isinstance(message, dict)
            or message.get("jsonrpc") != "2.0"
            or not isinstance(message.get("method"), str)
        ):
            return _error(None, INVALID_REQUEST, "a JSON-RPC 2.0 request object is required")
        request_id = message.get("id")
        if not isinstance(request_id, (str, int)) or isinstance(request_id, bool):
            return _error(None, INVALID_REQUEST, "every request needs an id (a string or an integer)")
        extra = set(message) - {"jsonrpc", "method", "params", "id"}
        if extra:
            return _error(request_id, INVALID_REQUEST, f"unknown members {sorted(extra)}")
        params = message.get("params", {})

        def run() -> dict[str, Any]:
            with self._one_writer:
                return self.store.execute(principal, message["method"], params, str(request_id))

        try:
            result = await trio.to_thread.run_sync(run)
        except BridgeError as exc:
            code = METHOD_NOT_FOUND if exc.code == "method-not-found" else ERROR_CODES.get(exc.code, INTERNAL)
            return _error(request_id, code, exc.message, reason=exc.code, **exc.data)
        return {"jsonrpc": "2.0", "id": request_id, "result": result}


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
