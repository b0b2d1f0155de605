"""``preview.validate`` (seed 004 V1.1 §3): the project's loopback preview, checked in
a real browser. The tool takes the seed's four inputs and no URL, port or path: the
preview is the registry's (``_registry``): the newest running process session of this
run (a dev server: ``process.start``) that listens on a loopback port the host's
browser reaches (its processes' own sockets, read by the session's actor:
sandbox/listening_ports.py), or else the spec's ``[project] preview_url``. The URL is
made here, on 127.0.0.1, and judged after parsing.

Desktop (1280x720) and mobile (390x844) each load the page in a fresh context that
reaches only the preview's own origin (every other request and socket is aborted
and counted), wait ``settleMs`` (800) after load, and report the document's
``readyState``, title, a visible-text summary, its DOM's characters, console errors
and warnings, uncaught exceptions and failed requests. The check fails on a missing
viewport, a document not complete, an empty body, an ``expectedText`` not visible,
a missing or blank canvas, a console error (unless ``failOnConsoleError`` is
false) or an uncaught exception. The project revision and the registry's preview (its
running session and port, or the spec's page) are read before and after: a drift voids the result.
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
from typing import Annotated, Any, Literal, NamedTuple, NotRequired
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
    """The seed's inputs, by the seed's names, and nothing else (V1.1 §3: "工具不接受 URL、
    脚本、请求头、Cookie 或浏览器 Profile"): the preview is found in the registry, never named."""

    viewports: NotRequired[Annotated[list[Literal["desktop", "mobile"]], Field(
        min_length=2, max_length=2, description="both, always: desktop and mobile")]]
    expectedText: NotRequired[Annotated[list[Annotated[str, Field(min_length=1, max_length=MAX_EXPECTED_TEXT_CHARS)]],
                                        Field(max_length=MAX_EXPECTED_TEXTS,
                                              description="texts each viewport must show")]]
    settleMs: NotRequired[Annotated[int, Field(
        ge=0, le=MAX_SETTLE_MS, description=f"wait after load (default {DEFAULT_SETTLE_MS})")]]
    failOnConsoleError: NotRequired[Annotated[bool, Field(description="default true")]]


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
        expected_text=tuple(tool_input.get("expectedText", ())),
        settle_ms=int(tool_input.get("settleMs", DEFAULT_SETTLE_MS)),
        fail_on_console_error=bool(tool_input.get("failOnConsoleError", True)),
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


def _spec_page(spec_url: str) -> str:
    """The spec's ``[project] preview_url``, judged again as a loopback page."""
    parts = urlsplit(spec_url)
    own_path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return preview_url(int(parts.port or 0), own_path, origin_of(spec_url))


class Found(NamedTuple):
    """The one preview the registry holds: its exact URL and what it is."""

    url: str
    identity: str


async def _listening(ctx: ToolContext, process_id: str) -> list[int]:
    """The loopback ports a running session of this run listens on (none when it is
    no longer running or its actor cannot answer)."""
    try:
        state = await ctx.ask(SessionPoll(run_id=ctx.run_id, process_id=process_id, max_chars=1))
    except RemoteError:
        return []
    return list(state.listening) if state.status == "running" else []


async def _registry(ctx: ToolContext) -> Found | None:
    """The project's preview (seed 004 V1.1 §3's PreviewRegistry): the newest running
    session of this run that listens on a loopback port the browser reaches, else
    the spec's ``preview_url``; None while a session runs that listens on nothing yet."""
    try:
        preview = await ctx.ask(ProjectPreview(run_id=ctx.run_id))
    except RemoteError as exc:
        raise ToolError(f"no preview: {exc.message}", "not-a-preview") from None
    for process_id in preview.sessions:
        ports = await _listening(ctx, process_id)
        if len(ports) > 1:
            raise ToolError(f"process {process_id} listens on several loopback ports ({', '.join(map(str, ports))}):"
                            " which one is the preview is not known; serve it on one port", "not-a-preview")
        if ports:
            return Found(preview_url(ports[0], "/"), f"session {process_id} on port {ports[0]}")
    if preview.url is not None:
        return Found(_spec_page(preview.url), f"page {preview.url}")
    if preview.sessions:
        return None  # a dev server that is still starting
    raise ToolError("no preview to check: start the project's dev server with process.start (serving on"
                    " 127.0.0.1), or set [project] preview_url in the spec", "not-a-preview")


async def _find_preview(ctx: ToolContext) -> Found:
    """The registry's preview, waiting a bounded time for a starting dev server to listen."""
    deadline = trio.current_time() + READY_TIMEOUT_S
    while (found := await _registry(ctx)) is None:
        if trio.current_time() > deadline:
            raise ToolError(f"no running process session of this run listens on a loopback port after"
                            f" {READY_TIMEOUT_S:g}s: start the preview first", "not-ready")
        await trio.sleep(0.1)
    return found


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


async def _wait_ready(url: str) -> None:
    """The spec's preview may still be starting: its port is polled until it accepts."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", int(parts.port or 0)
    deadline = trio.current_time() + READY_TIMEOUT_S
    while not await trio.to_thread.run_sync(_accepts, host, port):
        if trio.current_time() > deadline:
            raise ToolError(f"nothing accepts connections on {parts.netloc} after {READY_TIMEOUT_S:g}s",
                            "not-ready")
        await trio.sleep(0.1)


async def _revision(ctx: ToolContext) -> int:
    """The project revision now (the supervisor's)."""
    return (await ctx.ask(ProjectVerification(run_id=ctx.run_id))).revision


async def _drift(ctx: ToolContext, revision: int, before: Found) -> str | None:
    """Why a check's evidence no longer speaks for the project (None: it still does):
    the revision or the preview moved while the browser looked (seed 004 V1.1 §3)."""
    now = await _revision(ctx)
    if now != revision:
        return f"the project revision moved from {revision} to {now} during the check"
    try:
        after = await _registry(ctx)
    except ToolError as exc:
        return f"the preview changed during the check: {exc}"
    if after is None or after != before:
        return f"the preview changed during the check ({before.identity} -> {after.identity if after else 'none'})"
    return None


class PreviewValidate:
    schema = schema(
        "preview.validate",
        "Check the project's preview in Chromium: the dev server this run started (process.start) listening on"
        " 127.0.0.1, or else the spec's preview_url; it takes no URL or port."
        " Desktop and mobile screenshots, console errors, a non-blank canvas; other origins are blocked."
        " Fails unless both viewports pass.",
        PreviewArgs,
        read_only=True,
        effect="read",
    )

    async def run(self, ctx: ToolContext, tool_input: dict[str, Any]) -> ToolResult:
        options = check_options(tool_input)
        # Read before and after: evidence is only for the revision and preview it saw.
        revision = await _revision(ctx)
        found = await _find_preview(ctx)
        url, identity = found
        await _wait_ready(url)
        out = evidence_dir(ctx.home, ctx.agent_id, ctx.run_id, revision, ctx.action_id)
        try:
            reports = await trio.to_thread.run_sync(check_preview, url, out, options)
        except BrowserMissing as exc:
            raise ToolError(str(exc), "blocked") from None
        # In a thread: a test's ``block`` here holds this check, not the agent's loop.
        await trio.to_thread.run_sync(failpoints.hit, "preview.after-check")
        drift = await _drift(ctx, revision, found)
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
