"""Loopback HTTP plumbing for the tests' fake OpenAI server: the one in
corral/acceptance/loopback_http.py, which the fault proxy there also uses (one copy)."""

from __future__ import annotations

from corral.acceptance.loopback_http import (
    CHUNK,
    DEFAULT_WAIT_S,
    GONE,
    LOOPBACK,
    MAX_HEAD_BYTES,
    MAX_REQUEST_BODY,
    BadRequest,
    R,
    RecordLog,
    Request,
    listen,
    read_or_refuse,
    read_request,
    response_head,
    send_simple,
    serve_in_thread,
    wait_for_eof,
)

__all__ = [
    "CHUNK",
    "DEFAULT_WAIT_S",
    "GONE",
    "LOOPBACK",
    "MAX_HEAD_BYTES",
    "MAX_REQUEST_BODY",
    "BadRequest",
    "R",
    "RecordLog",
    "Request",
    "listen",
    "read_or_refuse",
    "read_request",
    "response_head",
    "send_simple",
    "serve_in_thread",
    "wait_for_eof",
]
