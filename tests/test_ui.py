"""``corral ui``: the timeline model, the server's guards (token, CSRF, no writes
through GET), the resumable live stream, a real approval clicked in headless
Chromium, and ``corral chaos --report``."""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import subprocess
from collections.abc import Iterator
from html import escape
from pathlib import Path
from typing import Any

import pytest

from corral.ui import timeline
from tests.harness import CORRAL, Daemon, agent_spec, cli, effects, wait_run

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "ui"
CHROMIUM = "/usr/bin/chromium"

STEPS = """
[[agents.steps]]
actions = [{ tool = "fs.list", input = { path = "." } }, { tool = "effect.record", input = { label = "e1" } }]
[[agents.steps]]
final = "done"
"""


def _event(cursor: int, at: float, boot: str, kind: str, subject: str, **data: Any) -> dict[str, Any]:
    return {"cursor": cursor, "at": at, "boot_id": boot, "kind": kind, "subject": subject, "data": data}


def test_timeline_draws_lifetimes_kills_restarts_and_supervisor_deaths() -> None:
    events = [
        _event(1, 0.0, "b1", "boot-started", "b1"),
        _event(2, 0.1, "b1", "actor-started", "writer", pid=10),
        _event(3, 1.0, "b1", "actor-exited", "writer", exit_code=-9, restart=True),
        _event(4, 1.1, "b1", "actor-restarted", "writer", trigger="writer"),
        _event(5, 1.2, "b1", "actor-started", "writer", pid=11),
        _event(6, 1.3, "b1", "actor-started", "helper", pid=12),
        _event(7, 1.5, "b1", "actor-exited", "helper", exit_code=0, restart=False),
        # No boot-ended: the first supervisor was killed; its actors went with it.
        _event(8, 3.0, "b2", "boot-started", "b2"),
        _event(9, 3.1, "b2", "actor-started", "writer", pid=20),
        _event(10, 4.0, "b2", "boot-ended", "b2", reason="down"),
    ]
    picture = timeline.lanes(events)
    names = [lane.name for lane in picture.lanes]
    assert names == ["supervisor", "helper", "writer"]
    supervisor, helper, writer = picture.lanes
    assert [(s.start, s.end, s.ending) for s in supervisor.segments] == [(0.0, 1.5, "killed"), (3.0, 4.0, "stopped")]
    assert [(s.pid, s.ending) for s in writer.segments] == [(10, "killed"), (11, "supervisor-gone"), (20, "stopped")]
    assert [(s.pid, s.ending) for s in helper.segments] == [(12, "exited")]
    assert (writer.kills, writer.restarts, supervisor.kills, helper.kills) == (1, 1, 1, 0)
    assert timeline.summary(picture) == {"lanes": 3, "kills": 2, "restarts": 1, "boots": 2}
    drawn = timeline.svg(picture, title="t <&>")
    assert drawn.count('class="mark kill"') == 2 and drawn.count('class="mark restart"') == 1
    assert drawn.count("<rect ") == 6
    assert "t &lt;&amp;&gt;" in drawn and "<script" not in drawn


@pytest.fixture
def swarm(short_tmp: Path) -> Iterator[Daemon]:
    (short_tmp / "ws").mkdir()
    spec = short_tmp / "spec.toml"
    spec.write_text(agent_spec(steps=STEPS, policy='[agents.policy]\n"effect.record" = "confirm"'))
    daemon = Daemon(short_tmp / "h", spec)
    try:
        daemon.up()
        yield daemon
    finally:
        daemon.shutdown()


@pytest.fixture
def dashboard(swarm: Daemon) -> Iterator[dict[str, Any]]:
    with _serving(swarm) as info:
        yield info


@contextlib.contextmanager
def _serving(swarm: Daemon) -> Iterator[dict[str, Any]]:
    """``corral ui --port 0 --json`` on ``swarm``'s home: its endpoint line; stopped
    (SIGTERM) and reaped on the way out."""
    process = subprocess.Popen(
        [*CORRAL, "--home", str(swarm.home), "ui", "--port", "0", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line, f"corral ui did not start: {process.stderr.read() if process.stderr else ''}"
        yield json.loads(line)
    finally:
        process.terminate()
        process.wait(timeout=20)
    assert process.returncode == 0, "Ctrl-C (SIGTERM) stops the dashboard cleanly"
    assert not (swarm.home / "ui.json").exists(), "the endpoint file goes with the server"


def _request(info: dict[str, Any], method: str, path: str, body: bytes | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, str, dict[str, str]]:
    conn = http.client.HTTPConnection("127.0.0.1", info["port"], timeout=20)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        reply = conn.getresponse()
        return reply.status, reply.read().decode(), {k.lower(): v for k, v in reply.getheaders()}
    finally:
        conn.close()


def _sse(info: dict[str, Any], path: str, count: int, headers: dict[str, str] | None = None) -> list[int]:
    """The ids of the first ``count`` ledger events the stream sends. Bounded: the
    stream's keep-alives would hold a socket timeout off forever, so a missing event
    fails the test (and its fixtures reap the daemons) instead of hanging it."""
    import time

    deadline = time.monotonic() + 30
    conn = http.client.HTTPConnection("127.0.0.1", info["port"], timeout=20)
    try:
        conn.request("GET", path, headers=headers or {})
        reply = conn.getresponse()
        assert reply.status == 200 and reply.getheader("content-type", "").startswith("text/event-stream")
        ids: list[int] = []
        while len(ids) < count:
            assert time.monotonic() < deadline, f"only {len(ids)} of {count} events within 30 s: {ids}"
            line = reply.fp.readline().decode()
            assert line, "the stream ended early"
            if line.startswith("id: "):
                ids.append(int(line[4:]))
        return ids
    finally:
        conn.close()


def test_the_server_wants_its_token_and_csrf_and_never_writes_through_get(
    swarm: Daemon, dashboard: dict[str, Any]
) -> None:
    info = dashboard
    token = info["token"]
    assert (swarm.home / "ui.json").stat().st_mode & 0o777 == 0o600
    assert info["url"] == f"http://127.0.0.1:{info['port']}/?token={token}"
    run_id = swarm.call("run", agent_id="writer", task="approve me")["run_id"]
    wait_run(swarm, run_id, {"waiting-confirmation"})
    for path in ("/", "/runs", "/pending", f"/runs/{run_id}", "/timeline", "/api/stream", "/?token=wrong"):
        assert _request(info, "GET", path)[0] == 401, path
    status, page, headers = _request(info, "GET", f"/?token={token}")
    assert status == 200 and "writer" in page and "Actor tree" in page
    assert "httponly" in headers["set-cookie"].lower() and "samesite=strict" in headers["set-cookie"].lower()
    assert "http://" not in page.replace(info["url"], "") and "https://" not in page, "no asset from elsewhere"
    csrf = re.search(r'name="csrf" content="([^"]+)"', page)
    assert csrf is not None
    auth = {"Authorization": f"Bearer {token}"}
    status, page, _ = _request(info, "GET", f"/runs/{run_id}", headers=auth)
    assert status == 200 and "waiting-confirmation" in page and "fs.list" in page
    assert _request(info, "GET", "/runs/run-000000000000", headers=auth)[0] == 404
    action_id = swarm.call("pending")["actions"][0]["action_id"]
    good = {**auth, "Content-Type": "application/json", "X-CSRF-Token": csrf.group(1)}
    body = json.dumps({"action": action_id}).encode()
    assert _request(info, "GET", f"/api/approve?action={action_id}", headers=auth)[0] == 405
    assert _request(info, "POST", "/api/approve", body, {**good, "X-CSRF-Token": "nope"})[0] == 403
    assert _request(info, "POST", "/api/approve", body, {**good, "Origin": "http://evil.example"})[0] == 403
    assert _request(info, "POST", "/api/approve", body, {**good, "Content-Type": "text/plain"})[0] == 415
    for bad in (b"[1]", b"{not json", json.dumps({"action": "../x"}).encode(),
                json.dumps({"action": action_id, "fingerprint": "zz"}).encode()):
        assert _request(info, "POST", "/api/approve", bad, good)[0] == 400, bad
    assert _request(info, "POST", "/api/reconcile", json.dumps({"action": action_id, "outcome": "maybe"}).encode(),
                    good)[0] == 400
    # A refusal from the ledger (wrong fingerprint) is a 409 with its reason.
    wrong = json.dumps({"action": action_id, "fingerprint": "0" * 64}).encode()
    status, text, _ = _request(info, "POST", "/api/approve", wrong, good)
    assert status == 409 and "fingerprint" in text
    assert [a["action_id"] for a in swarm.call("pending")["actions"]] == [action_id], "nothing changed"
    assert effects(swarm.home.parent / "effects.log") == []
    status, text, _ = _request(info, "POST", "/api/approve", body, good)
    assert status == 200, text
    shown = wait_run(swarm, run_id, {"completed", "failed"})
    assert shown["run"]["status"] == "completed" and len(effects(swarm.home.parent / "effects.log")) == 1
    status, page, _ = _request(info, "GET", f"/runs/{run_id}", headers=auth)
    # The action timeline: each executed action a bar, coloured by how it ended.
    assert status == 200 and page.count('class="action ok"') == 2 and '<svg class="actions"' in page


def test_the_live_stream_resumes_after_a_reconnect_without_a_gap(swarm: Daemon, dashboard: dict[str, Any]) -> None:
    run_id = swarm.call("run", agent_id="writer", task="make events")["run_id"]
    wait_run(swarm, run_id, {"waiting-confirmation"})
    auth = {"Authorization": f"Bearer {dashboard['token']}"}
    last = int(swarm.call("status")["cursor"])
    assert last > 10
    first = _sse(dashboard, "/api/stream?since=0", last - 3, auth)
    assert first == list(range(1, last - 2)), "every event, in order, from the start"
    # A browser reconnects with the last id it saw: the stream goes on right after it.
    resumed = _sse(dashboard, "/api/stream?since=0", 3, {**auth, "Last-Event-ID": str(first[-1])})
    assert resumed == [last - 2, last - 1, last]
    assert _request(dashboard, "GET", "/api/stream?since=-4", headers=auth)[0] == 400
    assert _request(dashboard, "GET", "/api/stream?since=x", headers=auth)[0] == 400


def test_approve_by_clicking_in_chromium_and_watch_the_run_finish(swarm: Daemon, dashboard: dict[str, Any]) -> None:
    playwright = pytest.importorskip("playwright.sync_api", reason="the dev extra installs playwright")
    assert Path(CHROMIUM).exists(), "Debian's chromium is needed (scripts/bootstrap.sh installs it)"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    run_id = swarm.call("run", agent_id="writer", task="approve me in the browser")["run_id"]
    wait_run(swarm, run_id, {"waiting-confirmation"})
    with playwright.sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 720})
            page.goto(dashboard["url"])
            page.wait_for_selector("#live.on", timeout=15_000)  # the live stream is connected
            assert page.locator('[data-actor="writer"]').count() == 1
            page.screenshot(path=str(ARTIFACTS / "tree.png"))
            page.click("header >> text=Pending")
            page.click("button:has-text('Approve')")
            # The page updates itself from the live stream: no reload here.
            page.wait_for_selector("text=No action waits for a person", timeout=20_000)
            page.goto(f"http://127.0.0.1:{dashboard['port']}/runs/{run_id}")
            page.wait_for_selector("#final-reply:has-text('done')", timeout=20_000)
            assert "completed" in page.inner_text("h2")
            page.screenshot(path=str(ARTIFACTS / "run.png"), full_page=True)
            page.goto(f"http://127.0.0.1:{dashboard['port']}/timeline")
            assert page.locator("svg.timeline rect.life").count() >= 2
            page.screenshot(path=str(ARTIFACTS / "timeline.png"))
            # The cookie is the page's; without it (a fresh context) the server says 401.
            stranger = browser.new_context().new_page()
            assert stranger.goto(f"http://127.0.0.1:{dashboard['port']}/pending").status == 401
        finally:
            browser.close()
    assert len(effects(swarm.home.parent / "effects.log")) == 1
    assert (ARTIFACTS / "run.png").stat().st_size > 10_000


#: Issue 49: an agent with its own instructions (inline and from a file) and a typed
#: output, every text of them hostile to a page that would not escape it.
INSTRUCTED = """
[[agents]]
id = "forecaster"
instructions = 'You forecast. Never say <script>alert("role")</script> & never guess; key wx-secret-8f3a9c2e71.'
instructions_file = "roles/forecaster.md"
steps = [{ final = { city = "<b>Oslo</b> & co", temperature_c = -2.5 } }]
[agents.output]
type = "object"
required = ["city", "temperature_c"]
additionalProperties = false
properties = { city = { type = "string" }, temperature_c = { type = "number" } }
"""
WEATHER_KEY = "wx-secret-8f3a9c2e71"


def test_the_run_page_shows_the_instructions_that_led_the_prompt_and_the_typed_output(short_tmp: Path) -> None:
    (short_tmp / "ws").mkdir()
    (short_tmp / "roles").mkdir()
    (short_tmp / "roles" / "forecaster.md").write_text("FILE-ROLE: one city per answer.\n")
    spec = short_tmp / "spec.toml"
    spec.write_text(agent_spec(extra=INSTRUCTED, steps=STEPS))
    swarm = Daemon(short_tmp / "h", spec, env={"WEATHER_API_KEY": WEATHER_KEY})
    try:
        swarm.up()
        run_id = swarm.call("run", agent_id="forecaster", task="the weather in Oslo")["run_id"]
        shown = wait_run(swarm, run_id, {"completed", "failed"})
        assert shown["run"]["status"] == "completed", shown["run"]["reason"]
        assert shown["output"] == {"city": "<b>Oslo</b> & co", "temperature_c": -2.5}
        # ``show`` carries the instructions the run was given, redacted like everything it shows.
        assert shown["instructions"] == {
            "text": 'You forecast. Never say <script>alert("role")</script> & never guess; key [redacted].',
            "file": str((short_tmp / "roles" / "forecaster.md").resolve()),
        }
        with _serving(swarm) as info:
            auth = {"Authorization": f"Bearer {info['token']}"}
            status, page, _ = _request(info, "GET", f"/runs/{run_id}", headers=auth)
            assert status == 200, page
            assert 'Never say &lt;script&gt;alert(&quot;role&quot;)&lt;/script&gt; &amp; never guess' in page
            assert "<script>alert(" not in page and WEATHER_KEY not in page
            assert escape(str((short_tmp / "roles" / "forecaster.md").resolve())) in page
            assert "&lt;b&gt;Oslo&lt;/b&gt; &amp; co" in page and "<b>Oslo</b>" not in page
            _look_at_the_run_page(info, run_id)
    finally:
        swarm.shutdown()


def _look_at_the_run_page(info: dict[str, Any], run_id: str) -> None:
    """The run page in Chromium: the instructions and the output read as text, and
    none of their markup became an element."""
    playwright = pytest.importorskip("playwright.sync_api", reason="the dev extra installs playwright")
    assert Path(CHROMIUM).exists(), "Debian's chromium is needed (scripts/bootstrap.sh installs it)"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with playwright.sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 720})
            page.goto(f"http://127.0.0.1:{info['port']}/runs/{run_id}?token={info['token']}")
            instructions = page.inner_text("#instructions")
            assert 'Never say <script>alert("role")</script> & never guess; key [redacted].' in instructions
            assert "roles/forecaster.md" in instructions
            output = page.inner_text("#output")
            assert '"city": "<b>Oslo</b> & co"' in output and '"temperature_c": -2.5' in output
            # Their text is text: no element inside either, no script anywhere in the page's body.
            assert page.locator("#instructions pre *, #output pre *, main script").count() == 0
            page.screenshot(path=str(ARTIFACTS / "run-instructions-output.png"), full_page=True)
            # The file's text, as it led the prompt, is in the first turn's prompt the page links to.
            page.click("#instructions a")
            page.wait_for_selector("#turn-1")
            first = page.inner_text("#turn-1")
            assert first.index("Never say <script>") < first.index("FILE-ROLE: one city per answer.")
            assert WEATHER_KEY not in page.content()
        finally:
            browser.close()


def test_chaos_report_draws_each_episode_with_its_kills(short_tmp: Path) -> None:
    out = short_tmp / "chaos.html"
    result = cli(short_tmp / "unused", "chaos", "--mode", "failpoints", "--failpoint", "action.after-executing",
                 "--targets", "supervisor", "--report", str(out), "--quiet", timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    html = out.read_text()
    assert html.count("<svg") == 1 and "episode 0 (action.after-executing): PASS" in html
    assert 'class="mark kill"' in html, "the supervisor's kill is marked"
    assert "<script" not in html and "https://" not in html
    assert re.search(r"1 kills, \d+ restarts, 2 boots", html)


# -- issue 32, cases 20 to 22: bad input is a 4xx, never a 500 or unbounded memory --------


def _csrf_headers(info: dict[str, Any]) -> dict[str, str]:
    status, page, _ = _request(info, "GET", f"/?token={info['token']}")
    csrf = re.search(r'name="csrf" content="([^"]+)"', page)
    assert status == 200 and csrf is not None
    return {"Authorization": f"Bearer {info['token']}", "Content-Type": "application/json",
            "X-CSRF-Token": csrf.group(1)}


def test_an_answer_nested_100000_deep_is_a_400(swarm: Daemon, dashboard: dict[str, Any]) -> None:
    good = _csrf_headers(dashboard)
    for deep in (b'{"run": "run-000000000000", "text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
                 b'{"run": ' + b'{"a": ' * 100_000 + b"1" + b"}" * 100_000 + b"}"):
        status, text, _ = _request(dashboard, "POST", "/api/answer", deep, good)
        assert status == 400 and "nested" in text, (status, text[:300])
    status, text, _ = _request(dashboard, "POST", "/api/answer", json.dumps({"run": "x", "text": "y"}).encode(), good)
    assert status == 400 and "run id" in text, "and the dashboard answers on"


def test_the_dashboard_refuses_a_200_mb_chunked_body_while_it_streams(
    swarm: Daemon, dashboard: dict[str, Any]
) -> None:
    import psutil

    from tests.security.test_bad_input import MB, stream_post

    good = _csrf_headers(dashboard)
    ui = psutil.Process(dashboard["pid"])
    before = ui.memory_info().rss
    status, body, sent = stream_post(dashboard["port"], "/api/answer", good, 200 * MB)
    grown = ui.memory_info().rss - before
    assert grown < 50 * MB, f"the dashboard grew by {grown // MB} MB"
    assert status == 413 and sent < 50 * MB, f"refused while the body streamed, not after {sent // MB} MB: {body!r}"
    conn = http.client.HTTPConnection("127.0.0.1", dashboard["port"], timeout=20)
    try:
        conn.putrequest("POST", "/api/answer")
        for name, value in {**good, "Content-Length": str(200 * MB)}.items():
            conn.putheader(name, value)
        conn.endheaders()
        assert conn.getresponse().status == 413, "a declared length past the cap: refused before the body"
    finally:
        conn.close()


def _stream_status(info: dict[str, Any], path: str, headers: dict[str, str]) -> tuple[int, str]:
    """The status of a stream request, and its body unless it is a stream (which
    never ends: reading it would wait forever)."""
    conn = http.client.HTTPConnection("127.0.0.1", info["port"], timeout=20)
    try:
        conn.request("GET", path, headers=headers)
        reply = conn.getresponse()
        streaming = reply.getheader("content-type", "").startswith("text/event-stream")
        return reply.status, "(a stream)" if streaming else reply.read().decode()
    finally:
        conn.close()


def test_a_bad_last_event_id_is_a_400_not_a_cut_stream(swarm: Daemon, dashboard: dict[str, Any]) -> None:
    auth = {"Authorization": f"Bearer {dashboard['token']}"}
    utf8_digit = "\u0663".encode().decode("latin-1")  # a header is latin-1 on the wire
    for cursor in (str(10**30), str(2**64), str(2**53), "-1", "abc", "+5", "7 8", "1_0", utf8_digit):
        status, text = _stream_status(dashboard, "/api/stream", {**auth, "Last-Event-ID": cursor})
        assert status == 400 and "cursor" in text, (cursor, status, text[:200])
    assert _stream_status(dashboard, f"/api/stream?since={10**30}", auth)[0] == 400
