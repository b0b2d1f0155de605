"""One preview check in Chromium (seed 004 V1.1 §3): both viewports of one loopback
URL, each in a fresh browser context that reaches nothing but the URL's own origin.

Driven over CDP by playwright's sync API (the tool runs it in a worker thread). What
it gathers per viewport is a ``ViewportReport``; whether that passes is the pure
``viewport_problems`` below, so the rules are read in one place.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from corral.core.redact import summarize

CHROMIUM = Path("/usr/bin/chromium")
#: Seed 004 V1.1 §3: the two viewports, both required.
VIEWPORTS: dict[str, tuple[int, int]] = {"desktop": (1280, 720), "mobile": (390, 844)}
#: Messages of one kind kept per viewport, and characters of each.
MAX_MESSAGES = 10
MAX_MESSAGE_CHARS = 300
NAVIGATION_TIMEOUT_MS = 20_000
#: Pixels of the canvas sampled at most (a grid over it when it is larger).
SAMPLE_SIDE = 128

#: Reads the first canvas through a 2D copy (a WebGL canvas too), sampled on a grid:
#: how many sampled pixels are not transparent and how many distinct RGBA values.
_CANVAS_JS = """
(side) => {
  const c = document.querySelector('canvas');
  if (!c) return {present: false};
  const r = c.getBoundingClientRect();
  const out = {present: true, width: c.width, height: c.height,
               visible_area: Math.max(0, Math.round(r.width)) * Math.max(0, Math.round(r.height))};
  if (!c.width || !c.height) return {...out, opaque: 0, colors: 0, sampled: 0};
  const w = Math.min(side, c.width), h = Math.min(side, c.height);
  const t = document.createElement('canvas'); t.width = w; t.height = h;
  const g = t.getContext('2d');
  try { g.drawImage(c, 0, 0, w, h); } catch (e) { return {...out, error: String(e).slice(0, 200)}; }
  const d = g.getImageData(0, 0, w, h).data;
  const seen = new Set(); let opaque = 0;
  for (let i = 0; i < d.length; i += 4) {
    if (d[i + 3] !== 0) opaque++;
    if (seen.size < 16) seen.add((d[i] << 24 | d[i + 1] << 16 | d[i + 2] << 8 | d[i + 3]) >>> 0);
  }
  return {...out, opaque: opaque, colors: seen.size, sampled: w * h};
}
"""
#: Two animation frames: what the page drew on load is on the canvas by then.
_SETTLE_JS = "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r(true))))"
#: The document's facts (seed 004 V1.1 §3): its readiness, its visible text, how large
#: its DOM is, and whether its body holds anything.
_DOCUMENT_JS = """
() => ({
  ready_state: document.readyState,
  text: document.body ? document.body.innerText : '',
  dom_chars: document.documentElement ? document.documentElement.outerHTML.length : 0,
  body_elements: document.body ? document.body.childElementCount : 0,
})
"""
#: Characters of the visible-text summary the observation keeps.
TEXT_SUMMARY_CHARS = 300
#: The seed's default wait after load before the evidence is read.
DEFAULT_SETTLE_MS = 800


@dataclass(frozen=True)
class CheckOptions:
    """What the model may ask of one check (seed 004 V1.1 §3's inputs)."""

    expected_text: tuple[str, ...] = ()
    settle_ms: int = DEFAULT_SETTLE_MS
    fail_on_console_error: bool = True


class BrowserMissing(Exception):
    """No Chromium, no playwright, or no sandbox for Chromium: the check is blocked,
    not failed, and never passed. The message names what is missing."""


@dataclass
class ViewportReport:
    name: str
    status: int | None = None
    title: str = ""
    canvas: dict[str, Any] = field(default_factory=dict)
    console_errors: list[str] = field(default_factory=list)
    console_warnings: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    failed_requests: list[str] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)
    ready_state: str = ""
    #: The whole visible text (never stored: the summary and the expected texts are).
    text: str = ""
    dom_chars: int = 0
    body_elements: int = 0
    screenshot: str = ""
    sha256: str = ""
    bytes: int = 0
    error: str = ""
    options: CheckOptions = field(default_factory=CheckOptions)

    def problems(self) -> list[str]:
        return viewport_problems(self)

    def as_dict(self) -> dict[str, Any]:
        problems = self.problems()
        return {
            "passed": not problems, "problems": problems, "http_status": self.status, "title": self.title,
            "ready_state": self.ready_state, "text_summary": summarize(self.text, TEXT_SUMMARY_CHARS),
            "dom_chars": self.dom_chars, "canvas": self.canvas, "console_errors": len(self.console_errors),
            "console_warnings": len(self.console_warnings), "page_errors": len(self.page_errors),
            "failed_requests": len(self.failed_requests), "blocked_requests": len(self.blocked),
            "expected_text_missing": missing_text(self), "screenshot": self.screenshot, "sha256": self.sha256,
            "bytes": self.bytes,
        }


def missing_text(report: ViewportReport) -> list[str]:
    """The expected texts the page does not show (pure)."""
    return [text for text in report.options.expected_text if text not in report.text]


def viewport_problems(report: ViewportReport) -> list[str]:
    """Why one viewport fails (empty: it passes). Pure: the whole rule set."""
    problems = []
    if report.error:
        problems.append(f"the page did not load: {report.error}")
    elif report.status is None or not 200 <= report.status < 400:
        problems.append(f"the page answered HTTP {report.status}")
    elif report.ready_state != "complete":
        problems.append(f"the document is {report.ready_state or 'not read'}, not complete")
    if not report.error and not report.body_elements and not report.text.strip():
        problems.append("the body is empty")
    for text in missing_text(report):
        problems.append(f"the expected text {summarize(text, 80)!r} is not visible")
    canvas = report.canvas
    if not canvas.get("present"):
        problems.append("no canvas")
    elif canvas.get("error"):
        problems.append(f"the canvas cannot be read: {canvas['error']}")
    elif not canvas.get("visible_area"):
        problems.append("the canvas is not visible")
    elif not canvas.get("opaque") or int(canvas.get("colors", 0)) < 2:
        problems.append("the canvas is blank (transparent or one colour)")
    if report.console_errors and report.options.fail_on_console_error:
        problems.append(f"{len(report.console_errors)} console error(s)")
    if report.page_errors:
        problems.append(f"{len(report.page_errors)} uncaught exception(s)")
    if report.blocked:
        problems.append(f"{len(report.blocked)} request(s) to another origin blocked")
    if not report.sha256:
        problems.append("no screenshot")
    return problems


def origin_of(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    return parts.scheme, (parts.hostname or "").lower(), parts.port


def _keep(bucket: list[str], text: str) -> None:
    if len(bucket) < MAX_MESSAGES:
        bucket.append(summarize(text, MAX_MESSAGE_CHARS))
    else:
        bucket.append("")  # counted, not kept: as_dict reports the count, messages() the first few


def messages(reports: list[ViewportReport]) -> list[str]:
    """The first console errors, exceptions, warnings and failed requests of every
    viewport, redacted and bounded."""
    kept: list[str] = []
    for report in reports:
        for kind, texts in (("error", report.console_errors), ("exception", report.page_errors),
                            ("warning", report.console_warnings), ("failed request", report.failed_requests)):
            for text in texts:
                if text and len(kept) < MAX_MESSAGES:
                    kept.append(f"{report.name} {kind}: {text}")
    return kept


#: Where the browser's traffic goes by default: a proxy nobody serves (seed 004 V1.1
#: §3: "浏览器默认走不可达代理，只为精确 HTTP / WS origin 配置 bypass"), behind the request
#: interception that already aborts every other origin.
UNREACHABLE_PROXY = "http://127.0.0.1:9"


def launch_args(netloc: str) -> list[str]:
    """Chromium's arguments for a preview at ``netloc`` (``127.0.0.1:<port>``): no
    name resolves, and every request but the preview's own goes to the unreachable
    proxy (``<-loopback>`` takes away Chromium's implicit bypass of loopback, so only
    the exact origin is bypassed, not the host's other loopback services)."""
    return ["--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
            f"--proxy-server={UNREACHABLE_PROXY}", f"--proxy-bypass-list=<-loopback>;{netloc}",
            "--disable-extensions", "--no-first-run"]


def _launch(driver: Any, netloc: str) -> Any:
    """Chromium with its own sandbox, or BrowserMissing: seed 004 V1.1 §3 forbids
    ``--no-sandbox``, so a host that refuses Chromium its sandbox blocks the check
    (never a pass without it). A fresh profile every time."""
    common: dict[str, Any] = {"executable_path": str(CHROMIUM), "headless": True, "args": launch_args(netloc)}
    try:
        return driver.chromium.launch(chromium_sandbox=True, **common)
    except Exception as exc:
        if "sandbox" not in str(exc).lower():
            raise
        raise BrowserMissing(sandbox_missing(str(exc))) from None


#: Chromium's own words on why its sandbox failed (its stderr, as playwright relays it).
_CHROMIUM_SAID = re.compile(r"ERROR:[^\]]*\]\s*([^\n]*sandbox[^\n]*)", re.IGNORECASE)


def sandbox_missing(error: str, euid: int | None = None) -> str:
    """The BLOCKED reason for a Chromium that could not start sandboxed: what it
    said, and what this host lacks. Pure."""
    said = _CHROMIUM_SAID.search(error)
    detail = f" (Chromium: {summarize(said.group(1), 200)})" if said else ""
    if (os.geteuid() if euid is None else euid) == 0:
        lacking = ("corral runs as root, and Chromium refuses its sandbox to root: run corral as another user"
                   " (with unprivileged user namespaces, or Chromium's setuid chrome-sandbox helper)")
    else:
        lacking = ("this host gives Chromium neither unprivileged user namespaces (sysctl"
                   " kernel.unprivileged_userns_clone, user.max_user_namespaces, or an AppArmor userns"
                   " restriction) nor its setuid chrome-sandbox helper")
    return (f"blocked: Chromium's sandbox is not available{detail}; {lacking}. The preview is not checked:"
            " seed 004 V1.1 §3 forbids --no-sandbox, so nothing passes without it")


def sandbox_problem() -> str:
    """Why a preview check would be blocked on this host ("" when Chromium starts
    sandboxed): a real start of Chromium, closed at once."""
    if not CHROMIUM.is_file():
        return f"no Chromium (looked for {CHROMIUM})"
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return "no playwright (the dev extra installs it)"
    try:
        with sync_playwright() as driver:
            _launch(driver, "127.0.0.1:1").close()
    except BrowserMissing as exc:
        return str(exc).removeprefix("blocked: ")
    return ""


def _console(report: ViewportReport, message: Any) -> None:
    if message.type == "error":
        _keep(report.console_errors, message.text)
    elif message.type == "warning":
        _keep(report.console_warnings, message.text)


def _request_failed(report: ViewportReport, origin: tuple[str, str, int | None], request: Any) -> None:
    """A same-origin request that failed on the network (another origin's is counted
    as blocked, by the route that aborted it)."""
    if origin_of(request.url) == origin:
        _keep(report.failed_requests, f"{request.url} ({request.failure or 'failed'})")


def _request(report: ViewportReport, origin: tuple[str, str, int | None], request: Any) -> None:
    """Every request the page makes, redirects included: the route sees only the first
    URL of a redirect chain, so a redirect to another origin is caught here and counted
    as blocked, a fatal policy failure of the viewport (seed 004 V1.1 §3: "跨 origin
    redirect target…必须在连接或握手前阻断并记为致命策略失败"); beneath this, the
    unreachable proxy keeps its connection from being made."""
    if request.redirected_from is not None and origin_of(request.url) != origin:
        _keep(report.blocked, request.url)


def _response(report: ViewportReport, response: Any) -> None:
    if response.status >= 400:
        _keep(report.failed_requests, f"{response.url} (HTTP {response.status})")


def _one_viewport(
    browser: Any, url: str, name: str, size: tuple[int, int], out: Path, options: CheckOptions
) -> ViewportReport:
    report = ViewportReport(name, options=options)
    origin = origin_of(url)
    context = browser.new_context(viewport={"width": size[0], "height": size[1]}, service_workers="block",
                                  accept_downloads=False)
    try:
        def route(route: Any) -> None:
            if origin_of(route.request.url) == origin:
                route.continue_()
            else:
                _keep(report.blocked, route.request.url)
                route.abort("blockedbyclient")

        context.route("**/*", route)
        context.route_web_socket("**/*", lambda ws: _refuse_socket(ws, origin, report))
        page = context.new_page()
        page.on("console", lambda msg: _console(report, msg))
        page.on("pageerror", lambda exc: _keep(report.page_errors, str(exc)))
        page.on("request", lambda request: _request(report, origin, request))
        page.on("requestfailed", lambda request: _request_failed(report, origin, request))
        page.on("response", lambda response: _response(report, response))
        try:
            response = page.goto(url, wait_until="load", timeout=NAVIGATION_TIMEOUT_MS)
            report.status = response.status if response is not None else None
            page.evaluate(_SETTLE_JS)
            if options.settle_ms:
                page.wait_for_timeout(options.settle_ms)  # the page's own settling time, as asked
            report.title = summarize(page.title(), 120)
            facts = page.evaluate(_DOCUMENT_JS)
            report.ready_state = str(facts.get("ready_state") or "")
            report.text = str(facts.get("text") or "")
            report.dom_chars = int(facts.get("dom_chars") or 0)
            report.body_elements = int(facts.get("body_elements") or 0)
            report.canvas = page.evaluate(_CANVAS_JS, SAMPLE_SIDE)
        except Exception as exc:  # playwright's errors: a page that did not load is a verdict
            report.error = summarize(str(exc).splitlines()[0] if str(exc) else type(exc).__name__, 300)
        target = out / f"{name}.png"
        try:
            data = page.screenshot(path=str(target), type="png")
            report.screenshot, report.sha256, report.bytes = target.name, hashlib.sha256(data).hexdigest(), len(data)
        except Exception as exc:
            report.error = report.error or summarize(f"screenshot failed: {exc}", 300)
    finally:
        context.close()
    return report


def _refuse_socket(ws: Any, origin: tuple[str, str, int | None], report: ViewportReport) -> None:
    scheme, host, port = origin_of(ws.url)
    if (host, port) == origin[1:] and scheme == "ws":
        ws.connect_to_server()
    else:
        _keep(report.blocked, ws.url)
        ws.close()


def check_preview(url: str, out: Path, options: CheckOptions | None = None) -> list[ViewportReport]:
    """Both viewports of ``url`` (already judged loopback by the caller), screenshots
    into ``out``, in a Chromium that runs with its own sandbox (BrowserMissing when it
    cannot)."""
    if not CHROMIUM.is_file():
        raise BrowserMissing(f"blocked: no chromium at {CHROMIUM}")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise BrowserMissing("blocked: playwright is not installed (the dev extra installs it)") from None
    with sync_playwright() as driver:
        browser = _launch(driver, urlsplit(url).netloc)
        try:
            return [_one_viewport(browser, url, name, size, out, options or CheckOptions())
                    for name, size in VIEWPORTS.items()]
        finally:
            browser.close()
