"""``preview.validate`` (seed 004 V1.1 §3): the project's loopback preview, checked in
a real browser. The preview is a process session this run started (a dev server:
``process.start``), named by its process id and the port it serves; the URL is made
here, on 127.0.0.1, and judged after parsing, never taken from the model whole.

Desktop (1280x720) and mobile (390x844) each load the page in a fresh context that
reaches only the preview's own origin (every other request and socket is aborted
and counted), wait ``settle_ms`` (800) after load, and report the document's
``readyState``, title, a visible-text summary, its DOM's characters, console errors
and warnings, uncaught exceptions and failed requests. The check fails on a missing
viewport, a document not complete, an empty body, an ``expected_text`` not visible,
a missing or blank canvas, a console error (unless ``fail_on_console_error`` is
false) or an uncaught exception. The project revision and the preview (its running
session, or the spec's page) are read before and after: a drift voids the result.
Screenshots go to ``<home>/evidence/<agent>/<run>/<revision>/<action>/``; the
receipt holds their names, sha256s and sizes, never their bytes. It changes nothing
in the project (effect class ``read``), so recovery may run it again.

Chromium runs with its own sandbox or not at all: a host that refuses it (corral
running as root, no user namespaces) makes the check ``blocked``, naming what is
missing, never a pass without it (the seed forbids ``--no-sandbox``).
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Annotated, Any, Literal, NotRequired
from urllib.parse import urlsplit

import trio
from pydantic import Field
from typing_extensions import TypedDict

from corral.actors.session import private_dirs
from corral.actors.tools.base import Tool, ToolContext, ToolError, ToolResult, schema
from corral.actors.tools.preview_browser import (
    DEFAULT_SETTLE_MS,
    VIEWPORTS,
    BrowserMissing,
    CheckOptions,
    check_preview,
    messages,
)
from corral.core import failpoints
from corral.core.loopback_url import NotLoopback, loopback_page, origin_of
from corral.mailbox.errors import RemoteError
from corral.mailbox.protocol import ProjectPreview, ProjectVerification, SessionPoll

#: How long the preview may take to accept connections after the tool is called.
READY_TIMEOUT_S = 15.0
MAX_PATH_CHARS = 512


#: The seed's bounds on what the model may ask (V1.1 §3's inputs).
MAX_EXPECTED_TEXTS = 8
MAX_EXPECTED_TEXT_CHARS = 200
MAX_SETTLE_MS = 10_000


class PreviewArgs(TypedDict):
    process_id: NotRequired[Annotated[str, Field(
        description="the process session (process.start) serving the preview; omit it to check the spec's"
        " [project] preview_url")]]
    port: NotRequired[Annotated[int, Field(ge=1, le=65535, description="the port it serves on 127.0.0.1")]]
    path: NotRequired[Annotated[str, Field(description="the page's path (default: / or the preview_url's)")]]
    viewports: NotRequired[Annotated[list[Literal["desktop", "mobile"]], Field(
        min_length=2, max_length=2, description="both, always: desktop and mobile")]]
    expected_text: NotRequired[Annotated[list[Annotated[str, Field(min_length=1, max_length=MAX_EXPECTED_TEXT_CHARS)]],
                                         Field(max_length=MAX_EXPECTED_TEXTS,
                                               description="texts each viewport must show")]]
    settle_ms: NotRequired[Annotated[int, Field(
        ge=0, le=MAX_SETTLE_MS, description=f"wait after load (default {DEFAULT_SETTLE_MS})")]]
    fail_on_console_error: NotRequired[Annotated[bool, Field(description="default true")]]


def evidence_dir(home: Path, agent_id: str, run_id: str, revision: int, action_id: str) -> Path:
    """Where one action's browser evidence lives, bound to the project revision it
    was taken on (seed 004 V1.1 §3: ``<agent>/<run>/<revision>/``), one directory per
    action: every level private to the user."""
    evidence = home / "evidence"
    revision_dir = evidence / agent_id / run_id / str(revision)
    private_dirs(evidence / agent_id)  # ``evidence`` and the agent's, each 0700
    private_dirs(revision_dir)  # the run's and the revision's
    out = revision_dir / action_id
    out.mkdir(mode=0o700, exist_ok=True)
    return out


def check_options(tool_input: dict[str, Any]) -> CheckOptions:
    """The check's options; viewports, when given, are exactly desktop and mobile."""
    viewports = tool_input.get("viewports")
    if viewports is not None and sorted(viewports) != sorted(VIEWPORTS):
        raise ToolError(f"viewports must be exactly {' and '.join(VIEWPORTS)} (not {viewports})", "bad-input")
    return CheckOptions(
        expected_text=tuple(tool_input.get("expected_text", ())),
        settle_ms=int(tool_input.get("settle_ms", DEFAULT_SETTLE_MS)),
        fail_on_console_error=bool(tool_input.get("fail_on_console_error", True)),
    )


def preview_url(port: int, path: str, origin: str | None = None) -> str:
    """``http://127.0.0.1:<port><path>`` (or ``<origin><path>`` for the spec's
    preview), refused unless it parses back to exactly that loopback origin (a path
    cannot smuggle a host, a scheme or credentials)."""
    if not path.startswith("/") or path.startswith("//") or len(path) > MAX_PATH_CHARS:
        raise ToolError(f"path must start with one '/' and be at most {MAX_PATH_CHARS} characters", "bad-input")
    if any(ch in path for ch in "\\#@") or not path.isprintable():
        raise ToolError("path may not hold '\\', '#', '@' or control characters", "bad-input")
    base = origin if origin is not None else f"http://127.0.0.1:{port}"
    url = f"{base}{path}"
    try:
        loopback_page(url)
    except NotLoopback as exc:
        raise ToolError(f"{url[:200]!r} is not a page of the loopback preview: {exc}", "bad-input") from None
    if origin_of(url) != base:
        raise ToolError(f"{url[:200]!r} is not a page of the loopback preview", "bad-input")
    return url


async def _spec_preview(ctx: ToolContext, path: str | None) -> str:
    """The spec's ``[project] preview_url`` (with another path if one is given)."""
    try:
        answer = await ctx.ask(ProjectPreview())
    except RemoteError as exc:
        raise ToolError(f"no preview: {exc.message}", "not-a-preview") from None
    spec_url = answer.url
    if spec_url is None:
        raise ToolError("no preview to check: pass the process_id and port of the preview you started"
                        " (process.start), or set [project] preview_url in the spec", "not-a-preview")
    parts = urlsplit(spec_url)
    own_path = path if path is not None else (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return preview_url(int(parts.port or 0), own_path, origin_of(spec_url))


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


async def _wait_ready(url: str) -> None:
    """The dev server may still be starting: its port is polled until it accepts."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", int(parts.port or 0)
    deadline = trio.current_time() + READY_TIMEOUT_S
    while not await trio.to_thread.run_sync(_accepts, host, port):
        if trio.current_time() > deadline:
            raise ToolError(f"nothing accepts connections on {parts.netloc} after {READY_TIMEOUT_S:g}s",
                            "not-ready")
        await trio.sleep(0.1)


async def _check_session(ctx: ToolContext, process_id: str) -> None:
    """The session is this run's own (the supervisor checks) and still running."""
    try:
        state = await ctx.ask(SessionPoll(run_id=ctx.run_id, process_id=process_id, max_chars=1))
    except RemoteError as exc:
        raise ToolError(f"process {process_id[:64]!r}: {exc.message}", "not-a-preview") from None
    if state.status != "running":
        raise ToolError(f"process {process_id} is {state.status}, not running: start the preview first",
                        "not-a-preview")


async def _revision(ctx: ToolContext) -> int:
    """The project revision now (the supervisor's)."""
    return (await ctx.ask(ProjectVerification(run_id=ctx.run_id))).revision


async def _preview_identity(ctx: ToolContext, tool_input: dict[str, Any]) -> str:
    """What the preview is: the running session serving it, or the spec's page."""
    if "process_id" in tool_input:
        await _check_session(ctx, tool_input["process_id"])  # still this run's, still running
        return f"session {tool_input['process_id']}"
    return f"page {await _spec_preview(ctx, tool_input.get('path'))}"


async def _drift(ctx: ToolContext, tool_input: dict[str, Any], revision: int, identity: str) -> str | None:
    """Why a check's evidence no longer speaks for the project (None: it still does):
    the revision or the preview moved while the browser looked (seed 004 V1.1 §3)."""
    now = await _revision(ctx)
    if now != revision:
        return f"the project revision moved from {revision} to {now} during the check"
    try:
        after = await _preview_identity(ctx, tool_input)
    except ToolError as exc:
        return f"the preview changed during the check: {exc}"
    return None if after == identity else f"the preview changed during the check ({identity} -> {after})"


class PreviewValidate:
    schema = schema(
        "preview.validate",
        "Check the project's preview (a process session of this run serving on 127.0.0.1:port, or the spec's"
        " preview_url when no session is named) in Chromium:"
        " desktop and mobile screenshots, console errors, a non-blank canvas; other origins are blocked."
        " Fails unless both viewports pass.",
        PreviewArgs,
        read_only=True,
        effect="read",
    )

    async def run(self, ctx: ToolContext, tool_input: dict[str, Any]) -> ToolResult:
        options = check_options(tool_input)
        if "process_id" in tool_input:
            if "port" not in tool_input:
                raise ToolError("a process session's preview needs its port", "bad-input")
            url = preview_url(int(tool_input["port"]), tool_input.get("path", "/"))
        elif "port" in tool_input:
            raise ToolError("a port goes with the process_id of the session serving it", "bad-input")
        else:
            url = await _spec_preview(ctx, tool_input.get("path"))
        # Read before and after: evidence is only for the revision and preview it saw.
        revision = await _revision(ctx)
        identity = await _preview_identity(ctx, tool_input)
        await _wait_ready(url)
        out = evidence_dir(ctx.home, ctx.agent_id, ctx.run_id, revision, ctx.action_id)
        try:
            reports = await trio.to_thread.run_sync(check_preview, url, out, options)
        except BrowserMissing as exc:
            raise ToolError(str(exc), "blocked") from None
        # In a thread: a test's ``block`` here holds this check, not the agent's loop.
        await trio.to_thread.run_sync(failpoints.hit, "preview.after-check")
        drift = await _drift(ctx, tool_input, revision, identity)
        viewports = {report.name: report.as_dict() for report in reports}
        passed = drift is None and all(view["passed"] for view in viewports.values())
        output = {
            "url": url,
            "passed": passed,
            "revision": revision,
            "preview": identity,
            "stale": drift,
            "viewports": viewports,
            "messages": messages(reports),
            "evidence_dir": str(out.relative_to(ctx.home)),
            # What image.inspect takes to look at the screenshots (this run's only).
            "inspect_paths": [f"evidence:{ctx.action_id}/{view['screenshot']}" for view in viewports.values()
                              if view["screenshot"]],
            # Always: a check without Chromium's sandbox is blocked, never run (seed 004 V1.1 §3).
            "browser_sandbox": True,
        }
        verdicts = ", ".join(f"{name} {'pass' if view['passed'] else 'FAIL'}" for name, view in viewports.items())
        if drift is not None:
            return ToolResult(False, output, f"preview check void: {drift} ({verdicts})")
        return ToolResult(passed, output, f"preview {'passed' if passed else 'failed'}: {verdicts}")


TOOLS: list[Tool] = [PreviewValidate()]
