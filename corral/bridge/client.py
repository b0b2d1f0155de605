"""``corral.bridge.Client``: a small synchronous JSON-RPC client of the bridge.

Every mutating call gets an idempotency key (a fresh one unless you pass yours);
to retry after a lost reply, call again with the same key and the same
parameters: the bridge returns the committed receipt, never a second fact.
"""

from __future__ import annotations

import http.client
import itertools
import json
import secrets
from typing import Any
from urllib.parse import urlsplit

from corral.bridge.methods import METHODS


class BridgeCallError(Exception):
    """The bridge refused a call: ``reason`` is the protocol's error name
    ("revision-conflict", "stale", "forbidden", ...), ``data`` its details."""

    def __init__(self, code: int, reason: str, message: str, data: dict[str, Any]) -> None:
        super().__init__(f"{reason}: {message}")
        self.code = code
        self.reason = reason
        self.message = message
        self.data = data


class Client:
    def __init__(self, url: str, token: str, *, timeout: float = 30.0) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"the bridge url must be http://HOST:PORT, not {url!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        self.token = token
        self.timeout = timeout
        self._ids = itertools.count(1)
        self._conn: http.client.HTTPConnection | None = None

    @staticmethod
    def new_key() -> str:
        return "k-" + secrets.token_hex(12)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        spec = METHODS.get(method)
        if spec is not None and spec.mutating and "idempotency_key" not in params:
            params["idempotency_key"] = self.new_key()
        reply = self.post({"jsonrpc": "2.0", "id": next(self._ids), "method": method, "params": params})
        if "error" in reply:
            error = reply["error"]
            data = dict(error.get("data") or {})
            raise BridgeCallError(int(error["code"]), str(data.pop("reason", error["code"])), error["message"], data)
        result: dict[str, Any] = reply["result"]
        return result

    def post(self, message: Any, raw: bytes | None = None) -> Any:
        """One exchange on the kept-alive connection; a connection the server closed
        meanwhile is opened again once (safe: a mutating call carries its key)."""
        body = raw if raw is not None else json.dumps(message).encode()
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        for attempt in (1, 2):
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            try:
                self._conn.request("POST", "/rpc", body=body, headers=headers)
                reply = self._conn.getresponse()
                text = reply.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.close()
                if attempt == 2:
                    raise
                continue
            if reply.status != 200:
                raise BridgeCallError(reply.status, "http", text.decode(errors="replace")[:300], {})
            return json.loads(text)
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
