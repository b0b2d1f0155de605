"""``preview.validate`` (seed 004 V1.1 §3) on three real preview pages served by a
process session of the run (``python3 -m http.server`` started by ``process.start``):
a canvas that renders passes, a blank canvas fails, a page that throws fails. The
screenshots are real files whose sha256 the receipt names; they are copied to
test-artifacts/ as the attached evidence. With ``[project] require_preview`` the
run's final reply after its change is blocked until a check passed.

Chromium runs with its own sandbox or not at all (the seed forbids ``--no-sandbox``).
Where this machine refuses it (root, as in CI: Chromium refuses its sandbox to
root), the check is BLOCKED, naming what is missing, and the gate stays shut; the
passing path then runs with corral itself as an unprivileged user (``setpriv``),
where Chromium gets its sandbox. Where neither is possible, the passing path is
skipped with the reason: untestable here, never counted as a pass.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.actors.tools.base import ToolError
from corral.actors.tools.preview import preview_url
from corral.actors.tools.preview_browser import (
    CHROMIUM,
    CheckOptions,
    ViewportReport,
    sandbox_missing,
    sandbox_problem,
    viewport_problems,
)
from corral.sandbox.bwrap import bwrap_available
from tests.harness import CORRAL, Daemon, ledger_rows, module_daemon, wait_run

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "preview-validate"
#: The dev server's network must be the host's: the browser runs outside the sandbox.
SANDBOX = "[sandbox]\nnetwork = true\n" + ("" if bwrap_available() else 'mode = "allow-unsandboxed"\n')
SPEC = f"""
[project]
root = "ws"
require_preview = true
preview_url = "http://127.0.0.1:PORT/game.html"
{SANDBOX}
[policy]
default = "auto"
[[agents]]
id = "writer"
  [[agents.steps]]
  final = "each run brings its own script"
"""

#: The main test's spec: the preview is the spec's page, its index (the run rewrites it
#: between checks). The registry's other source, a dev server the run started, is
#: tested without a browser (test_a_dev_servers_port_is_the_preview_and_two_are_none)
#: and in the blocked path: a session's program as an unprivileged user is not what is
#: tested here.
MAIN_SPEC = SPEC.replace("/game.html", "/")

CANVAS = '<canvas id="c" width="240" height="120"></canvas>'
DRAW = ("const g = document.getElementById('c').getContext('2d');"
        " g.fillStyle = '#c33'; g.fillRect(10, 10, 80, 60); g.fillStyle = '#36c'; g.fillRect(120, 30, 60, 60);")
PAGES = {
    "game.html": f"<!doctype html><title>game</title><p>Level 1</p>{CANVAS}<script>{DRAW}</script>",
    "blank.html": f"<!doctype html><title>blank</title>{CANVAS}",
    "throws.html": f"<!doctype html><title>throws</title>{CANVAS}<script>{DRAW}"
                   " throw new Error('level 1 failed to load');</script>",
}
#: A page that warns and asks for a file that is not there (a 404, which Chromium also
#: logs as a console error): it passes only with fail_on_console_error = false.
NOISY = (f"<!doctype html><title>noisy</title><p>Level 2</p>{CANVAS}<img src='/missing.png' alt=''>"
         f"<script>{DRAW} console.warn('slow asset');</script>")
EMPTY = "<!doctype html><title>empty</title><body></body>"
#: A page whose image redirects to another loopback port: the redirect's target is
#: another origin, blocked and fatal (seed 004 V1.1 §3: "跨 origin redirect target").
REDIRECTS = (f"<!doctype html><title>redirects</title><p>Level 3</p>{CANVAS}<img src='/elsewhere.png' alt=''>"
             f"<script>{DRAW}</script>")
#: The test's dev server: the site's files, and ``/elsewhere.png`` redirecting to
#: another loopback port (argv: port, directory, the other port).
SERVER = (
    "import functools, http.server, sys\n"
    "class Handler(http.server.SimpleHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        if self.path == '/elsewhere.png':\n"
    "            self.send_response(302)\n"
    "            self.send_header('Location', f'http://127.0.0.1:{sys.argv[3]}/x.png')\n"
    "            self.end_headers()\n"
    "            return\n"
    "        super().do_GET()\n"
    "handler = functools.partial(Handler, directory=sys.argv[2])\n"
    "http.server.ThreadingHTTPServer(('127.0.0.1', int(sys.argv[1])), handler).serve_forever()\n"
)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


#: The port of the dev server the main test starts; the spec's preview_url names it too.
PORT = _free_port()


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    def pages(top: Path) -> None:
        (top / "ws" / "site").mkdir()
        for name, html in PAGES.items():
            (top / "ws" / "site" / name).write_text(html)

    with module_daemon(SPEC.replace("PORT", str(PORT)), prepare=pages) as running_daemon:
        yield running_daemon


def _actions(daemon: Daemon, run_id: str) -> list[dict[str, Any]]:
    return ledger_rows(daemon.home, "SELECT action_id, tool, phase, result FROM actions WHERE run_id = ?"
                       " ORDER BY loop_index, action_index", run_id)


#: Who runs corral for the passing path when this process cannot have Chromium's
#: sandbox (root): an unprivileged user, by uid (no name to look up).
NOBODY = 65534
PROBE = "from corral.actors.tools.preview_browser import sandbox_problem; print(sandbox_problem())"


def _sandbox_here() -> bool:
    """Whether Chromium starts with its own sandbox in this process: playwright
    asked directly, not through the code under test."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as driver:
        try:
            driver.chromium.launch(executable_path=str(CHROMIUM), headless=True, chromium_sandbox=True).close()
        except Exception as exc:
            if "sandbox" not in str(exc).lower():
                raise
            return False
    return True


def _as_user(top: Path) -> list[str] | None:
    """The command that runs corral where its browser gets Chromium's sandbox on this
    machine (this interpreter, as this user; as root: an interpreter every user can
    run, as an unprivileged user, through setpriv), or None when no way is open
    here. Probed for real: Chromium is started."""
    if os.geteuid() != 0:
        return [*CORRAL] if _sandbox_here() else None
    # The venv's interpreter may live where others cannot reach (/root): a venv of the
    # system's interpreter that reads this venv's packages, for the other user.
    system = shutil.which(f"python{sys.version_info.major}.{sys.version_info.minor}", path="/usr/local/bin:/usr/bin")
    if shutil.which("setpriv") is None or system is None:
        return None
    venv = top / "venv"
    subprocess.run([system, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True, timeout=120)
    (Path(sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"]) / "corral-under-test.pth"
     ).write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    command = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--",
               str(venv / "bin" / "python"), "-m", "corral"]
    probe = subprocess.run([*command[:-2], "-c", PROBE], capture_output=True, text=True, timeout=120, cwd=top,
                           env={**os.environ, "HOME": str(top)}, check=False)
    return command if probe.returncode == 0 and probe.stdout.strip() == "" else None


@pytest.fixture(scope="module")
def as_user() -> Iterator[list[str] | None]:
    """``_as_user``, made once for the module's two passing-path tests: its venv and
    its probe (a Chromium started) are the same for both, in a directory of its own
    that every user can read."""
    top = Path(tempfile.mkdtemp(prefix="crl-pv-", dir="/tmp"))
    top.chmod(0o755)
    try:
        yield _as_user(top)
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _corral(command: list[str], top: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*command, "--home", str(top / "home"), *args], capture_output=True, text=True,
                          cwd=top, env={**os.environ, "HOME": str(top)}, timeout=timeout, check=False)


def _dev_server(port: int) -> dict[str, Any]:
    """The run's own dev server: a process session serving ``site/`` on 127.0.0.1."""
    return {"tool": "process.start", "input": {
        "program": "python3", "args": ["-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", "site"],
        "timeout_s": 240}}


def _check(html: str, **inputs: Any) -> dict[str, Any]:
    """One step: the page becomes the preview's index, then the check, which names no
    URL, port or path (the registry finds the preview)."""
    return {"actions": [{"tool": "fs.write", "input": {"path": "site/index.html", "content": html}},
                        {"tool": "preview.validate", "input": inputs}]}


def _pages_script(port: int) -> list[dict[str, Any]]:
    """The run checks its pages one by one through the preview registry; inputs the
    seed does not have (a port, a URL) are refused."""
    return [
        # A change to the sources: the final reply now needs a passing preview.
        {"actions": [{"tool": "fs.write", "input": {"path": "site/notes.txt", "content": "level 1"}}]},
        {"final": "too early"},
        *(_check(PAGES[page]) for page in PAGES),
        {"actions": [{"tool": "preview.validate", "input": {"port": port}},
                     {"tool": "preview.validate", "input": {"url": f"http://127.0.0.1:{port}/"}}]},
        # The seed's inputs (V1.1 §3), by its names: expectedText, failOnConsoleError,
        # settleMs, and both viewports or none named.
        _check(NOISY, expectedText=["Level 2"], failOnConsoleError=False, settleMs=0),
        _check(PAGES["game.html"], expectedText=["Level 1", "Level 9"]),
        _check(EMPTY, viewports=["mobile", "desktop"]),
        _check(NOISY, settleMs=100),
        {"actions": [{"tool": "preview.validate", "input": {"viewports": ["desktop"]}},
                     {"tool": "preview.validate", "input": {"viewports": ["desktop", "desktop"]}}]},
        _check(REDIRECTS),
        _check(PAGES["game.html"]),  # the latest change is followed by a pass
        {"actions": [{"tool": "preview.validate", "input": {}}]},  # read again: the spec's page
        {"final": "checked"},
    ]


def test_three_preview_pages_get_their_verdicts_with_screenshots(short_tmp: Path, as_user: list[str] | None) -> None:
    """The passing path, in a sandboxed Chromium: as this user, or (as root) with
    corral run by an unprivileged user, as a careful operator would run it. The
    preview is the registry's: here the spec's page (the run starts no session), never
    named by the model; a session's port as the preview is tested without a browser
    (test_a_dev_servers_port_is_the_preview_and_two_are_none)."""
    short_tmp.chmod(0o755)  # the unprivileged user walks into it
    command = as_user
    if command is None:
        pytest.skip("untestable here: Chromium can have its sandbox neither as this user nor as an unprivileged"
                    " one (no setpriv, or no user namespaces); the BLOCKED path is tested instead")
    port = _free_port()
    site = short_tmp / "ws" / "site"
    site.mkdir(parents=True)
    (short_tmp / "swarm.toml").write_text(MAIN_SPEC.replace("PORT", str(port)))
    (short_tmp / "script.json").write_text(json.dumps({"steps": _pages_script(port)}))
    if os.geteuid() == 0:
        for path in [short_tmp, short_tmp / "ws", *(short_tmp / "ws").rglob("*"), short_tmp / "swarm.toml",
                     short_tmp / "script.json"]:
            os.chown(path, NOBODY, NOBODY)
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port), str(site), str(_free_port())],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        up = _corral(command, short_tmp, "up", "--spec", str(short_tmp / "swarm.toml"))
        assert up.returncode == 0, up.stderr[-2000:]
        try:
            ran = _corral(command, short_tmp, "run", "--agent", "writer", "--task", "check the preview", "--script",
                          str(short_tmp / "script.json"), "--wait", "--json", "--timeout", "200", timeout=260)
        finally:
            down = _corral(command, short_tmp, "down")
        assert down.returncode == 0, down.stderr[-2000:]
    finally:
        server.terminate()
        server.wait()
    shown = json.loads(ran.stdout)
    assert shown["run"]["status"] == "completed", ran.stdout[-3000:]
    home = short_tmp / "home"
    run_id = shown["run"]["run_id"]
    checks = [row for row in _rows(home, run_id) if row["tool"] == "preview.validate"]
    assert len(checks) == 14
    _check_the_seeds_inputs_and_evidence(home, run_id, checks[5:11])
    redirected = json.loads(checks[11]["result"])["output"]
    assert redirected["passed"] is False and checks[11]["phase"] == "failed", redirected
    for view in redirected["viewports"].values():
        assert view["blocked_requests"] >= 1 and "request(s) to another origin blocked" in " ".join(view["problems"])
    for row in checks[12:]:
        last = json.loads(row["result"])["output"]
        assert last["passed"] is True and last["url"] == f"http://127.0.0.1:{port}/", last
    errors = {row["action_id"]: row["error"] or "" for row in ledger_rows(
        home, "SELECT action_id, error FROM actions WHERE run_id = ?", run_id)}
    for row, name in zip(checks[3:5], ("port", "url"), strict=True):
        assert row["phase"] == "failed" and name in errors[row["action_id"]], errors[row["action_id"]]
    checks = checks[:3]
    verdicts = {}
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for page, row in zip(PAGES, checks, strict=True):
        output = json.loads(row["result"])["output"]
        assert output["url"] == f"http://127.0.0.1:{port}/" and output["browser_sandbox"] is True
        assert output["preview"] == f"page http://127.0.0.1:{port}/"
        verdicts[page] = (output["passed"], {name: view["passed"] for name, view in output["viewports"].items()})
        evidence = home / output["evidence_dir"]
        # Bound to the revision it was taken on: evidence/<agent>/<run>/<revision>/<action>/.
        assert output["revision"] >= 1 and output["stale"] is None
        assert evidence.relative_to(home).parts == ("evidence", "writer", run_id, str(output["revision"]),
                                                    row["action_id"])
        assert output["inspect_paths"] == [f"evidence:{row['action_id']}/{name}.png" for name in ("desktop", "mobile")]
        for name, view in output["viewports"].items():
            png = (evidence / view["screenshot"]).read_bytes()
            assert png.startswith(b"\x89PNG") and hashlib.sha256(png).hexdigest() == view["sha256"]
            assert view["bytes"] == len(png)
            shutil.copyfile(evidence / view["screenshot"], ARTIFACTS / f"{Path(page).stem}-{name}.png")
        if page == "blank.html":
            assert all("blank" in " ".join(view["problems"]) for view in output["viewports"].values())
        if page == "throws.html":
            assert any("level 1 failed to load" in text for text in output["messages"])
            assert output["viewports"]["desktop"]["page_errors"] == 1
        # A failed check is a failed action whose receipt says why; a passed one is ok.
        assert row["phase"] == ("ok" if output["passed"] else "failed"), row["phase"]
    assert verdicts == {
        "game.html": (True, {"desktop": True, "mobile": True}),
        "blank.html": (False, {"desktop": False, "mobile": False}),
        "throws.html": (False, {"desktop": False, "mobile": False}),
    }
    # The final reply before the check was blocked; the one after it went through.
    blocked = ledger_rows(home, "SELECT data FROM events WHERE kind = 'final-blocked' AND subject = ?", run_id)
    assert len(blocked) == 1 and "run preview.validate" in json.loads(blocked[0]["data"])["detail"]
    assert shown["final_reply"] == "checked"
    # No image bytes in the ledger: only names, sizes and hashes.
    ledger = b"".join(p.read_bytes() for p in home.glob("ledger.db*"))
    assert b"\x89PNG" not in ledger


def _check_the_seeds_inputs_and_evidence(home: Path, run_id: str, checks: list[dict[str, Any]]) -> None:
    """The seed (V1.1 §3): "expectedText / settleMs / failOnConsoleError"; evidence
    "document.readyState、title、可见文本摘要和 DOM 字符数" and "console error/warn、未捕获异常和失败网络请求";
    "viewports 必须且只能同时包含 desktop 与 mobile"; "空 body…都是失败"."""
    outputs = [json.loads(row["result"])["output"] if row["result"] else {} for row in checks]
    noisy, missing, empty, noisy_failing, _one_viewport, twice = outputs
    assert noisy["passed"] is True, noisy
    for view in noisy["viewports"].values():
        assert view["ready_state"] == "complete" and "Level 2" in view["text_summary"]
        assert view["dom_chars"] > len(NOISY) // 2 and view["title"] == "noisy"
        assert view["console_warnings"] == 1 and view["console_errors"] >= 1 and view["failed_requests"] == 1
        assert view["expected_text_missing"] == []
    assert any("warning: slow asset" in text for text in noisy["messages"])
    assert any("failed request" in text and "missing.png (HTTP 404)" in text for text in noisy["messages"])
    # The same page with console errors failing (the default) fails.
    assert noisy_failing["passed"] is False
    assert all("console error" in " ".join(v["problems"]) for v in noisy_failing["viewports"].values())
    assert missing["passed"] is False
    for view in missing["viewports"].values():
        assert view["expected_text_missing"] == ["Level 9"]
        assert "the expected text 'Level 9' is not visible" in view["problems"]
    assert empty["passed"] is False and all(
        "the body is empty" in view["problems"] for view in empty["viewports"].values())
    errors = {row["action_id"]: row["error"] or "" for row in ledger_rows(
        home, "SELECT action_id, error FROM actions WHERE run_id = ?", run_id)}
    one_viewport_error = errors[checks[4]["action_id"]]
    assert "viewports" in one_viewport_error, one_viewport_error  # refused by the schema: 2 items
    assert twice["code"] == "bad-input" and "exactly desktop and mobile" in twice["error"], twice
    assert [row["phase"] for row in checks] == ["ok", "failed", "failed", "failed", "failed", "failed"]


DRIFT_SPEC = f"""
[project]
root = "ws"
preview_url = "http://127.0.0.1:PORT/game.html"
{SANDBOX}
[policy]
default = "auto"
[[agents]]
id = "writer"
  [[agents.steps]]
  actions = [{{ tool = "preview.validate", input = {{}} }}]
  [[agents.steps]]
  final = "checked"
[[agents]]
id = "editor"
  [[agents.steps]]
  actions = [{{ tool = "fs.write", input = {{ path = "site/more.txt", content = "level 3" }} }}]
  [[agents.steps]]
  final = "edited"
"""


def test_a_revision_that_moves_during_the_check_voids_it(short_tmp: Path, as_user: list[str] | None) -> None:
    """The seed (V1.1 §3): "验证前后重读 project revision 和预览身份，任一漂移都使结果失效". The check
    is held after its browser evidence (failpoint ``preview.after-check``) while another
    agent's write moves the project revision; released, it re-reads and is void."""
    short_tmp.chmod(0o755)
    command = as_user
    if command is None:
        pytest.skip("untestable here: Chromium can have its sandbox neither as this user nor as an unprivileged"
                    " one (no setpriv, or no user namespaces)")
    port = _free_port()
    site = short_tmp / "ws" / "site"
    site.mkdir(parents=True)
    (site / "game.html").write_text(PAGES["game.html"])
    (short_tmp / "swarm.toml").write_text(DRIFT_SPEC.replace("PORT", str(port)))
    if os.geteuid() == 0:
        for path in [short_tmp, short_tmp / "ws", *(short_tmp / "ws").rglob("*"), short_tmp / "swarm.toml"]:
            os.chown(path, NOBODY, NOBODY)
    home = short_tmp / "home"
    held = {**os.environ, "HOME": str(short_tmp), "CORRAL_FAILPOINTS": "preview.after-check=block@once"}
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory",
                               str(site)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        up = subprocess.run([*command, "--home", str(home), "up", "--spec", str(short_tmp / "swarm.toml")],
                            capture_output=True, text=True, cwd=short_tmp, env=held, timeout=180, check=False)
        assert up.returncode == 0, up.stderr[-2000:]
        try:
            started = _corral(command, short_tmp, "run", "--agent", "writer", "--task", "check", "--json")
            assert started.returncode == 0, started.stderr[-2000:]
            run_id = json.loads(started.stdout)["run_id"]
            fired = home / "failpoints" / "preview.after-check.fired"
            deadline = time.monotonic() + 150  # a safety net: the check itself takes seconds
            while not fired.exists():
                assert time.monotonic() < deadline, "the check never reached its re-read"
                time.sleep(0.05)
            edited = _corral(command, short_tmp, "run", "--agent", "editor", "--task", "edit", "--wait", "--json",
                             "--timeout", "60", timeout=120)
            assert json.loads(edited.stdout)["run"]["status"] == "completed", edited.stdout[-2000:]
            (home / "failpoints" / "preview.after-check.release").touch()
            waited = _corral(command, short_tmp, "wait", run_id, "--json", "--timeout", "120", timeout=180)
        finally:
            down = _corral(command, short_tmp, "down")
        assert down.returncode == 0, down.stderr[-2000:]
    finally:
        server.terminate()
        server.wait()
    assert json.loads(waited.stdout)["run"]["status"] == "completed", waited.stdout[-2000:]
    [check] = [row for row in _rows(home, run_id) if row["tool"] == "preview.validate"]
    output = json.loads(check["result"])["output"]
    assert check["phase"] == "failed" and output["passed"] is False, output
    assert output["revision"] == 0 and output["stale"] == "the project revision moved from 0 to 1 during the check"
    assert all(view["passed"] for view in output["viewports"].values()), "the page itself was fine"


def _rows(home: Path, run_id: str) -> list[dict[str, Any]]:
    return ledger_rows(home, "SELECT action_id, tool, phase, result FROM actions WHERE run_id = ?"
                       " ORDER BY loop_index, action_index", run_id)


def test_without_chromiums_sandbox_the_check_is_blocked_and_the_gate_stays_shut(daemon: Daemon) -> None:
    """Seed 004 V1.1 §3 forbids --no-sandbox: where Chromium cannot have its sandbox
    (this process is root, as in CI), every check is BLOCKED naming what is missing,
    with no screenshot taken, and a passing check is still required to finish."""
    if _sandbox_here():
        pytest.skip("Chromium has its sandbox as this user: the passing path is tested instead")
    port = PORT
    server = {"tool": "process.start", "input": {
        "program": "python3", "args": ["-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", "site"],
        "timeout_s": 120}}
    steps = [
        {"actions": [{"tool": "fs.write", "input": {"path": "site/notes.txt", "content": "level 2"}}]},
        {"actions": [server]},
        {"actions": [{"tool": "preview.validate", "input": {}}, {"tool": "preview.validate", "input": {}}]},
        {"actions": [{"tool": "process.terminate", "input": {"process_id": "${running.process_id}"}}]},
        {"final": "checked"},
        {"final": "checked, really"},
    ]
    run_id = daemon.call("run", agent_id="writer", task="check the preview", script=json.dumps({"steps": steps}))[
        "run_id"]
    shown = wait_run(daemon, run_id, {"completed", "failed", "needs-input"}, timeout=120)
    checks = [row for row in _actions(daemon, run_id) if row["tool"] == "preview.validate"]
    assert len(checks) == 2
    for row in checks:
        output = json.loads(row["result"])["output"]
        assert row["phase"] == "failed" and output["code"] == "blocked", output
        assert "Chromium's sandbox is not available" in output["error"] and "--no-sandbox" in output["error"]
        if os.geteuid() == 0:
            assert "corral runs as root" in output["error"], output["error"]
        assert not (daemon.home / "evidence" / run_id / row["action_id"]).exists() or not any(
            (daemon.home / "evidence" / run_id / row["action_id"]).iterdir()), "no screenshot without the sandbox"
    # No pass without the sandbox: the final reply after the change stays blocked.
    assert shown["final_reply"] is None and shown["run"]["status"] != "completed", shown["run"]
    blocked = ledger_rows(daemon.home, "SELECT data FROM events WHERE kind = 'final-blocked' AND subject = ?", run_id)
    assert blocked and all("run preview.validate" in json.loads(b["data"])["detail"] for b in blocked)


def test_the_blocked_reason_names_what_the_host_lacks() -> None:
    said = ("Browser logs:\n[pid=1][err] [1:1:1207/055015.4:ERROR:content/browser/zygote_host/zygote_host_impl_linux"
            ".cc:103] Running as root without --no-sandbox is not supported. See https://crbug.com/638180.\n")
    as_root = sandbox_missing(said, euid=0)
    assert as_root.startswith("blocked: Chromium's sandbox is not available (Chromium: Running as root without")
    assert "corral runs as root" in as_root and "forbids --no-sandbox" in as_root
    as_user = sandbox_missing("Chromium sandboxing failed!", euid=1000)
    assert "user namespaces" in as_user and "chrome-sandbox" in as_user and "root" not in as_user


def test_the_model_cannot_name_the_preview(daemon: Daemon) -> None:
    """The seed (V1.1 §3): "工具不接受 URL…Runtime 只验证当前项目 PreviewRegistry 中的精确 loopback URL":
    a process id, a port, a path or a URL is refused by the tool's schema, checking nothing."""
    named = [{"process_id": "proc-00000000000000000000"}, {"port": 8000}, {"path": "/admin"},
             {"url": "http://127.0.0.1:8000/"}]
    steps = [{"actions": [{"tool": "preview.validate", "input": one}]} for one in named] + [{"final": "refused"}]
    run_id = daemon.call("run", agent_id="writer", task="no preview", script=json.dumps({"steps": steps}))["run_id"]
    wait_run(daemon, run_id, {"completed"}, timeout=60)
    rows = ledger_rows(daemon.home, "SELECT action_id, phase, error FROM actions WHERE run_id = ?"
                       " ORDER BY loop_index, action_index", run_id)
    assert [row["phase"] for row in rows] == ["failed"] * 4
    for row, one in zip(rows, named, strict=True):
        assert next(iter(one)) in (row["error"] or ""), row["error"]
    assert not (daemon.home / "evidence" / "writer" / run_id).exists()


#: A dev server listening on ``argv[1]`` loopback ports (one line: a command argument
#: holds no control character); it prints them once they listen.
LISTEN = ("import socket, sys, time; socks = [socket.socket() for _ in range(int(sys.argv[1]))];"
          " [(s.bind(('127.0.0.1', 0)), s.listen()) for s in socks];"
          " print(' '.join(str(s.getsockname()[1]) for s in socks), flush=True); time.sleep(600)")


def test_a_dev_servers_port_is_the_preview_and_two_are_none(daemon: Daemon) -> None:
    """The registry (seed 004 V1.1 §3's PreviewRegistry): the newest running session of
    the run that listens on one loopback port is the preview, before the spec's page;
    one listening on two ports is refused by name (which one is the preview is not
    known). The spec's page here is a port nobody serves, so a check that used it
    would end ``not-ready``."""
    port = _free_port()
    poll = {"tool": "process.poll", "input": {"process_id": "${running.process_id}", "wait_ms": 10000}}
    stop = {"tool": "process.terminate", "input": {"process_id": "${running.process_id}"}}
    steps = [
        {"actions": [{"tool": "process.start", "input": {"program": "python3", "args": ["-c", LISTEN, "2"],
                                                         "timeout_s": 120}}]},
        {"actions": [poll]},  # its output says both sockets listen
        {"actions": [{"tool": "preview.validate", "input": {}}]},
        {"actions": [stop]},
        {"actions": [_dev_server(port)]},
        {"actions": [poll]},  # "Serving HTTP on 127.0.0.1 port ..."
        {"actions": [{"tool": "preview.validate", "input": {}}]},
        {"actions": [stop]},
        {"final": "checked"},
        {"final": "checked, really"},
    ]
    run_id = daemon.call("run", agent_id="writer", task="two servers", script=json.dumps({"steps": steps}))["run_id"]
    wait_run(daemon, run_id, {"completed", "failed", "needs-input"}, timeout=120)
    rows = _actions(daemon, run_id)
    polls = [json.loads(row["result"])["output"] for row in rows if row["tool"] == "process.poll"]
    assert "Serving HTTP" in polls[1]["chunk"] and polls[1]["listening"] == [port], polls[1]
    two, one = (json.loads(row["result"])["output"] for row in rows if row["tool"] == "preview.validate")
    assert two["code"] == "not-a-preview" and "listens on several loopback ports" in two["error"], two
    if one.get("code") == "blocked":  # no Chromium sandbox here: the registry answered first
        assert "Chromium's sandbox is not available" in one["error"], one
    else:
        assert one["url"] == f"http://127.0.0.1:{port}/" and one["preview"].endswith(f" on port {port}"), one


def test_a_url_is_made_on_loopback_and_judged_after_parsing() -> None:
    assert preview_url(8080, "/a/b.html?x=1") == "http://127.0.0.1:8080/a/b.html?x=1"
    for bad in ("//evil.example/", "@evil.example/", "x", "/\\evil", "/a#b", "/\x00"):
        with pytest.raises(ToolError):
            preview_url(8080, bad)
    # Exactly 127.0.0.1 (seed 004 V1.1 §3: "仅允许精确 http://127.0.0.1:<port>"), not another loopback address.
    from corral.core.loopback_url import NotLoopback, loopback_page

    assert loopback_page("http://127.0.0.1:8080/") == "http://127.0.0.1:8080/"
    for other in ("http://127.0.0.2:8080/", "http://[::1]:8080/", "http://localhost:8080/"):
        with pytest.raises(NotLoopback):
            loopback_page(other)


def test_one_viewport_only_or_a_uniform_canvas_fails() -> None:
    good = {"present": True, "visible_area": 100, "opaque": 50, "colors": 3}
    loaded = {"ready_state": "complete", "body_elements": 1, "text": "Level 1"}
    assert viewport_problems(ViewportReport("desktop", 200, canvas=good, sha256="x", **loaded)) == []
    solid = {**good, "colors": 1}
    assert "blank" in viewport_problems(ViewportReport("desktop", 200, canvas=solid, sha256="x", **loaded))[0]
    assert viewport_problems(ViewportReport("desktop", 200, canvas={"present": False}, sha256="x", **loaded)) == [
        "no canvas"]
    assert "no screenshot" in viewport_problems(ViewportReport("mobile", 200, canvas=good, **loaded))
    # The document's facts (seed 004 V1.1 §3): not complete, an empty body, a text not shown.
    loading = ViewportReport("desktop", 200, canvas=good, sha256="x", **{**loaded, "ready_state": "loading"})
    assert viewport_problems(loading) == ["the document is loading, not complete"]
    empty = ViewportReport("desktop", 200, canvas=good, sha256="x", ready_state="complete")
    assert viewport_problems(empty) == ["the body is empty"]
    wanted = ViewportReport("desktop", 200, canvas=good, sha256="x", options=CheckOptions(expected_text=("Level 2",)),
                            **loaded)
    assert viewport_problems(wanted) == ["the expected text 'Level 2' is not visible"]
    noisy = {"canvas": good, "sha256": "x", "console_errors": ["boom"], **loaded}
    assert viewport_problems(ViewportReport("desktop", 200, **noisy)) == ["1 console error(s)"]
    tolerant = ViewportReport("desktop", 200, options=CheckOptions(fail_on_console_error=False), **noisy)
    assert viewport_problems(tolerant) == [] and tolerant.as_dict()["console_errors"] == 1


def test_the_acceptance_point_is_blocked_without_chromiums_sandbox(short_tmp: Path) -> None:
    """``corral acceptance``'s verify-preview point (seed 004 V1.1 §5.5) reports
    BLOCKED, naming the missing sandbox, before any model call (the provider named
    here does not even listen), and the points that judge its runs are BLOCKED with
    it: exit 2, never a pass, never a runtime failure."""
    if _sandbox_here():
        pytest.skip("Chromium has its sandbox as this user: the point would run a real model")
    report_path = short_tmp / "report.json"
    done = subprocess.run([*CORRAL, "acceptance", "--suite", "verify-preview", "--provider-url",
                           f"http://127.0.0.1:{_free_port()}/v1", "--provider-model", "none", "--json",
                           str(report_path)], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads(report_path.read_text())
    verdicts = {point["name"]: (point["verdict"], point["reason"]) for point in report["points"]}
    assert report["verdict"] == "BLOCKED" and list(verdicts) == ["verify-preview", "ledger-consistency",
                                                                 "secret-leaks"]
    verdict, reason = verdicts["verify-preview"]
    assert verdict == "BLOCKED" and reason.startswith("blocked: Chromium's sandbox is not available"), reason
    assert "forbids --no-sandbox" in reason and (os.geteuid() != 0 or "corral runs as root" in reason), reason
    assert reason.removeprefix("blocked: ") == sandbox_problem(), "the point says what the probe finds"
    assert {verdict for verdict, _ in verdicts.values()} == {"BLOCKED"}
