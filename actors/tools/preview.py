"""``preview.validate`` (seed 004 V1.1 §3): the project's loopback preview, checked in
a real browser. The preview is a process session this run started (a dev server:
``process.start``), named by its process id and the port it serves; the URL is made
here, on 127.0.0.1, and judged after parsing, never taken from the model whole.

Desktop (1280x720) and mobile (390x844) each load the page in a fresh context that
reaches only the preview's own origin (every other request and socket is aborted
and counted). The check fails on one viewport only, a missing or blank canvas, a
console error or an uncaught exception. Screenshots go to the run's evidence
directory, ``<home>/evidence/<run>/<action>/``; the receipt holds their names,
sha256s and sizes, never their bytes. It changes nothing in the project (effect
class ``read``), so recovery may run it again.

Chromium runs with its own sandbox or not at all: a host that refuses it (corral
running as root, no user namespaces) makes the check ``blocked``, naming what is
missing, never a pass without it (the seed forbids ``--no-sandbox``).
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Annotated, Any, NotRequired
from urllib.parse import urlsplit

import trio
from pydantic import Field
from typing_extensions import TypedDict

from corral.actors.session import private_dirs
from corral.actors.tools.base import Tool, ToolContext, ToolError, ToolResult, schema
from corral.actors.tools.preview_browser import BrowserMissing, check_preview, messages
from corral.core.loopback_url import NotLoopback, loopback_page, origin_of
from corral.mailbox.errors import RemoteError
from corral.mailbox.protocol import ProjectPreview, SessionPoll

#: How long the preview may take to accept connections after the tool is called.
READY_TIMEOUT_S = 15.0
MAX_PATH_CHARS = 512


class PreviewArgs(TypedDict):
    process_id: NotRequired[Annotated[str, Field(
        description="the process session (process.start) serving the preview; omit it to check the spec's"
        " [project] preview_url")]]
    port: NotRequired[Annotated[int, Field(ge=1, le=65535, description="the port it serves on 127.0.0.1")]]
    path: NotRequired[Annotated[str, Field(description="the page's path (default: / or the preview_url's)")]]


def evidence_dir(home: Path, run_id: str, action_id: str) -> Path:
    """Where one action's browser evidence lives: every level private to the user."""
    runs = home / "evidence" / run_id
    private_dirs(runs)
    out = runs / action_id
    out.mkdir(mode=0o700, exist_ok=True)
    return out


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
    spec_url = answer.get("url")
    if not isinstance(spec_url, str):
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
    if state.get("status") != "running":
        raise ToolError(f"process {process_id} is {state.get('status')}, not running: start the preview first",
                        "not-a-preview")


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
        if "process_id" in tool_input:
            if "port" not in tool_input:
                raise ToolError("a process session's preview needs its port", "bad-input")
            url = preview_url(int(tool_input["port"]), tool_input.get("path", "/"))
            await _check_session(ctx, tool_input["process_id"])
        elif "port" in tool_input:
            raise ToolError("a port goes with the process_id of the session serving it", "bad-input")
        else:
            url = await _spec_preview(ctx, tool_input.get("path"))
        await _wait_ready(url)
        out = evidence_dir(ctx.home, ctx.run_id, ctx.action_id)
        try:
            reports = await trio.to_thread.run_sync(check_preview, url, out)
        except BrowserMissing as exc:
            raise ToolError(str(exc), "blocked") from None
        viewports = {report.name: report.as_dict() for report in reports}
        passed = all(view["passed"] for view in viewports.values())
        output = {
            "url": url,
            "passed": passed,
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
        return ToolResult(passed, output, f"preview {'passed' if passed else 'failed'}: {verdicts}")


TOOLS: list[Tool] = [PreviewValidate()]
