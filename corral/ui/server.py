"""``corral ui``: the dashboard's HTTP server (starlette on hypercorn, under trio).

It is a thin layer over the same control methods as the CLI (``status``, ``runs``,
``show``, ``pending``, ``events``, ``continue_action``, ``reconcile``, ``answer``):
it reads nothing and writes nothing on its own.

Security, for a page that can approve side effects:

* it listens on 127.0.0.1 only;
* every request carries the token: in the URL the first time (``?token=``), then
  in an HttpOnly, SameSite=Strict cookie, or as ``Authorization: Bearer``. Without
  it: 401. The token is random per server, printed once, and kept in the 0600
  endpoint file ``<home>/ui.json``;
* nothing writes through GET; every POST needs the page's CSRF token in the
  ``X-CSRF-Token`` header, a JSON body, and no foreign ``Origin``;
* bad input is a 4xx, never a 500: a body is at most 1 MiB (refused while it
  streams in) and nests at most 32 levels (checked before parsing); a stream
  cursor is a decimal integer from 0 to 2^53 - 1.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from html import escape
from pathlib import Path
from typing import Any

import psutil
import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from corral.async_client import AsyncClient
from corral.client_types import RunResult
from corral.core import http_service, nesting
from corral.mailbox.control import ControlError, SupervisorGone
from corral.mailbox.errors import DeadlineExceeded
from corral.supervisor.home import home_dir as homes
from corral.supervisor.runs.run_store import RUN_ID
from corral.ui import conversation, pages, timeline

#: A structured question's request id (supervisor/interactive/question_shape.py).
REQUEST_ID = re.compile(r"^req-[0-9a-f]{24}$")

ENDPOINT_FILE = "ui.json"
COOKIE = "corral_ui"
#: How many events one stream read asks for, and how long it waits when none come.
STREAM_PAGE = 5000
STREAM_WAIT_MS = 10_000
#: USS is read from /proc at most this often per process (it costs ~0.2 ms each).
USS_TTL_S = 5.0
#: The timeline reads at most this many events (the newest).
TIMELINE_EVENTS = 50_000
#: A POST body: its size and how deep it may nest (the bodies are flat objects).
MAX_BODY = 1 << 20
MAX_DEPTH = 32
#: A stream cursor: a ledger event's number (decimal, at most 2^53 - 1).
_CURSOR = re.compile(r"^[0-9]{1,16}$")
MAX_CURSOR = 2**53 - 1
_ACTION_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,120}$")
_FINGERPRINT = re.compile(r"^[0-9a-f]{64}$")

Handler = Callable[[Request], Awaitable[Response]]


class BadInput(Exception):
    pass


class Dashboard:
    def __init__(self, home: Path, *, token: str | None = None, csrf: str | None = None) -> None:
        self.home = home
        self.token = token or secrets.token_urlsafe(24)
        self.csrf = csrf or secrets.token_urlsafe(24)
        self.origin = ""  # set once the port is known
        self.client = AsyncClient.connect(home, timeout=15.0)
        self._uss: dict[int, tuple[float, int]] = {}

    # -- the app ------------------------------------------------------------------

    def app(self) -> Starlette:
        page, post = self._page, self._post
        return Starlette(
            routes=[
                Route("/", page(self.tree_page)),
                Route("/runs", page(self.runs_page)),
                Route("/runs/{run_id}", page(self.run_page)),
                Route("/runs/{run_id}/conversation", page(self.conversation_page)),
                Route("/pending", page(self.pending_page)),
                Route("/timeline", page(self.timeline_page)),
                Route("/api/stream", self._guard(self.stream)),
                Route("/api/approve", post(self.approve), methods=["POST"]),
                Route("/api/deny", post(self.deny), methods=["POST"]),
                Route("/api/reconcile", post(self.reconcile), methods=["POST"]),
                Route("/api/answer", post(self.answer), methods=["POST"]),
            ]
        )

    def authorized(self, request: Request) -> bool:
        offered = (
            request.query_params.get("token")
            or request.cookies.get(COOKIE)
            or request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        )
        return bool(offered) and secrets.compare_digest(offered.encode(), self.token.encode())

    def _guard(self, handler: Handler) -> Handler:
        async def guarded(request: Request) -> Response:
            if not self.authorized(request):
                return JSONResponse({"error": "a valid token is required (the URL corral ui printed)"}, 401)
            try:
                response = await handler(request)
            except (SupervisorGone, DeadlineExceeded, homes.HomeError) as exc:
                return JSONResponse({"error": f"the supervisor is not reachable: {exc}"}, 503)
            if request.query_params.get("token"):
                response.set_cookie(COOKIE, self.token, httponly=True, samesite="strict", path="/")
            return response

        return guarded

    def _page(self, render: Callable[[Request], Awaitable[tuple[str, str]]]) -> Handler:
        async def handler(request: Request) -> Response:
            try:
                title, body = await render(request)
            except ControlError as exc:
                status = 404 if exc.code == "not-found" else 400
                return HTMLResponse(f"<p>{escape(exc.message)}</p>", status)
            if request.query_params.get("fragment") == "1":
                return HTMLResponse(body)
            # The stream starts where this page's data ends: nothing in between is missed.
            cursor = int((await self.client.status())["cursor"] or 0)
            return HTMLResponse(pages.layout(title, body, csrf=self.csrf, cursor=cursor, path=request.url.path))

        return self._guard(handler)

    def _post(self, act: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]) -> Handler:
        async def handler(request: Request) -> Response:
            token = request.headers.get("x-csrf-token", "")
            if not token or not secrets.compare_digest(token.encode(), self.csrf.encode()):
                return JSONResponse({"error": "missing or wrong CSRF token"}, 403)
            origin = request.headers.get("origin")
            if origin is not None and origin != self.origin:
                return JSONResponse({"error": f"cross-origin request from {origin} refused"}, 403)
            if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
                return JSONResponse({"error": "send a JSON body"}, 415)
            try:
                raw = await http_service.read_body(request, MAX_BODY)
            except http_service.BodyTooLarge as exc:
                return JSONResponse({"error": str(exc)}, 413)
            except http_service.BadBody as exc:
                return JSONResponse({"error": str(exc)}, 400)
            try:
                nesting.check_json(raw, MAX_DEPTH)
                body = json.loads(raw)
                if not isinstance(body, dict):
                    raise BadInput("the body must be a JSON object")
                return JSONResponse(await act(body))
            except (ValueError, BadInput) as exc:  # nesting.TooDeep is a ValueError
                return JSONResponse({"error": str(exc)}, 400)
            except RecursionError:  # the depth check above should make this unreachable
                return JSONResponse({"error": "the body nests too deeply"}, 400)
            except ControlError as exc:
                return JSONResponse({"error": exc.message, "code": exc.code}, 409)

        return self._guard(handler)

    # -- pages --------------------------------------------------------------------

    async def tree_page(self, request: Request) -> tuple[str, str]:
        status = await self.client.status()
        pids = [actor["pid"] for actor in status.get("actors", []) if actor.get("pid")]
        uss = await trio.to_thread.run_sync(self.uss_of, pids)
        return "Actors", pages.tree(status, uss)

    async def runs_page(self, request: Request) -> tuple[str, str]:
        return "Runs", pages.runs(await self.client.runs())

    async def run_page(self, request: Request) -> tuple[str, str]:
        run_id = request.path_params["run_id"]
        if not RUN_ID.match(run_id):
            raise ControlError("not-found", f"no run {run_id!r}")
        shown: RunResult = await self.client.show(run_id)
        return f"Run {run_id}", pages.run(shown.raw)

    async def conversation_page(self, request: Request) -> tuple[str, str]:
        run_id = request.path_params["run_id"]
        if not RUN_ID.match(run_id):
            raise ControlError("not-found", f"no run {run_id!r}")
        said = await self.client.transcript(run_id)
        shown: RunResult = await self.client.show(run_id)
        return f"Conversation {run_id}", conversation.page(said, shown.raw)

    async def pending_page(self, request: Request) -> tuple[str, str]:
        return "Pending", pages.pending((await self.client.pending()).raw)

    async def timeline_page(self, request: Request) -> tuple[str, str]:
        events = await self.recent_events()
        picture = timeline.lanes(events, now=time.time())
        return "Timeline", pages.timeline(timeline.svg(picture, title=str(self.home)), timeline.summary(picture))

    async def recent_events(self) -> list[dict[str, Any]]:
        last = int((await self.client.status())["cursor"] or 0)
        cursor = max(0, last - TIMELINE_EVENTS)
        events: list[dict[str, Any]] = []
        while cursor < last:
            reply = await self.client.call("events", since=cursor, limit=STREAM_PAGE)
            if not reply["events"]:
                break
            events.extend(reply["events"])
            cursor = reply["cursor"]
        return events

    def uss_of(self, pids: list[int]) -> dict[int, int]:
        now = time.monotonic()
        found: dict[int, int] = {}
        for pid in pids:
            cached = self._uss.get(pid)
            if cached is not None and now - cached[0] < USS_TTL_S:
                found[pid] = cached[1]
                continue
            try:
                uss = int(psutil.Process(pid).memory_full_info().uss)
            except (psutil.Error, OSError):
                continue
            self._uss[pid] = (now, uss)
            found[pid] = uss
        for gone in set(self._uss) - set(pids):
            self._uss.pop(gone, None)  # two pages may read at once (worker threads)
        return found

    # -- the live stream ----------------------------------------------------------

    async def stream(self, request: Request) -> Response:
        """Server-sent events from the ledger's event stream. Each carries its
        cursor as its id, so a browser that reconnects (``Last-Event-ID``) resumes
        right after the last event it got: nothing is skipped, nothing repeated."""
        # Checked before the response starts: past that point a bad cursor can only
        # cut the stream (a cursor past 2^64 did, in the ledger's encoder).
        offered = request.headers.get("last-event-id") or request.query_params.get("since") or "0"
        if not _CURSOR.match(offered) or int(offered) > MAX_CURSOR:
            return JSONResponse({"error": f"since (Last-Event-ID) must be a cursor from 0 to {MAX_CURSOR}"}, 400)
        since = int(offered)
        # One connection per stream: a long-poll must not hold the pages' client.
        reader = AsyncClient.connect(self.home, timeout=STREAM_WAIT_MS / 1000 + 10)

        async def frames() -> AsyncIterator[str]:
            cursor = since
            try:
                yield "retry: 1000\n\n"
                while True:
                    reply = await reader.call("events", since=cursor, limit=STREAM_PAGE, wait_ms=STREAM_WAIT_MS)
                    events = reply["events"]
                    if not events:
                        yield ": idle\n\n"
                        continue
                    yield "".join(
                        f"id: {event['cursor']}\nevent: ledger\ndata: {json.dumps(event, default=str)}\n\n"
                        for event in events
                    )
                    cursor = reply["cursor"]
            except (SupervisorGone, DeadlineExceeded, homes.HomeError):
                yield "event: gone\ndata: {}\n\n"
            finally:
                reader.close()

        return StreamingResponse(
            frames(), media_type="text/event-stream", headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        )

    # -- actions (the same control methods as the CLI) ----------------------------------

    async def approve(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self.client.approve(_action_id(body), fingerprint=_fingerprint(body))

    async def deny(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self.client.deny(_action_id(body), fingerprint=_fingerprint(body))

    async def reconcile(self, body: dict[str, Any]) -> dict[str, Any]:
        outcome = body.get("outcome")
        if outcome not in ("ok", "failed"):
            raise BadInput("outcome must be 'ok' or 'failed'")
        note = body.get("note") or "resolved in corral ui"
        if not isinstance(note, str) or len(note) > 1000:
            raise BadInput("note must be a string of at most 1000 characters")
        return await self.client.reconcile(_action_id(body), outcome, note)

    async def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        """A structured request's answers (``request`` and ``answers``: question id to
        label), or the ``text`` of a one-question request, with its ``request`` either
        way. The response id is derived from the request and the answers, so a
        second click sends the same response."""
        run_id, text = body.get("run"), body.get("text")
        if not isinstance(run_id, str) or not RUN_ID.match(run_id):
            raise BadInput("run must be a run id")
        request, answers = body.get("request"), body.get("answers")
        # The question shown names its request: an answer is never matched to
        # whichever question is open now (seed 004 V1.23).
        if not isinstance(request, str) or not REQUEST_ID.match(request):
            raise BadInput("request must be the id of the request answered")
        if answers is not None:
            if not isinstance(answers, dict) or not 1 <= len(answers) <= 3 or not all(
                isinstance(key, str) and len(key) <= 40 and isinstance(value, str) and 1 <= len(value) <= 2000
                for key, value in answers.items()
            ):
                raise BadInput("answers must map each question id to its answer (1 to 3 of them)")
            return await self.client.answer(run_id, request_id=request, answers=answers)
        if not isinstance(text, str) or not 1 <= len(text) <= 4000:
            raise BadInput("text must be 1 to 4000 characters")
        return await self.client.answer(run_id, text, request_id=request)


def _action_id(body: dict[str, Any]) -> str:
    action_id = body.get("action")
    if not isinstance(action_id, str) or not _ACTION_ID.match(action_id):
        raise BadInput("action must be an action id")
    return action_id


def _fingerprint(body: dict[str, Any]) -> str | None:
    fingerprint = body.get("fingerprint")
    if fingerprint in (None, ""):
        return None
    if not isinstance(fingerprint, str) or not _FINGERPRINT.match(fingerprint):
        raise BadInput("fingerprint must be 64 hex digits")
    return fingerprint


# -- serving --------------------------------------------------------------------


def write_endpoint(home: Path, info: dict[str, Any]) -> Path:
    """``<home>/ui.json``, 0600 from its first byte (it holds the token)."""
    path = home / ENDPOINT_FILE
    partial = path.with_name(path.name + ".partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(info, out)
    os.replace(partial, path)
    return path
