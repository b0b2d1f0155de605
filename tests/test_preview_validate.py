"""``preview.validate`` (seed 004 V1.1 §3) on three real preview pages served by a
process session of the run (``python3 -m http.server`` started by ``process.start``):
a canvas that renders passes, a blank canvas fails, a page that throws fails. The
screenshots are real files whose sha256 the receipt names; they are copied to
test-artifacts/ as the attached evidence. With ``[project] require_preview`` the
run's final reply after its change is blocked until a check passed. One supervisor
for the module.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.actors.tools.base import ToolError
from corral.actors.tools.preview import preview_url
from corral.actors.tools.preview_browser import ViewportReport, viewport_problems
from corral.sandbox.bwrap import bwrap_available
from tests.harness import Daemon, ledger_rows, module_daemon, show, wait_run

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

CANVAS = '<canvas id="c" width="240" height="120"></canvas>'
DRAW = ("const g = document.getElementById('c').getContext('2d');"
        " g.fillStyle = '#c33'; g.fillRect(10, 10, 80, 60); g.fillStyle = '#36c'; g.fillRect(120, 30, 60, 60);")
PAGES = {
    "game.html": f"<!doctype html><title>game</title>{CANVAS}<script>{DRAW}</script>",
    "blank.html": f"<!doctype html><title>blank</title>{CANVAS}",
    "throws.html": f"<!doctype html><title>throws</title>{CANVAS}<script>{DRAW}"
                   " throw new Error('level 1 failed to load');</script>",
}


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


def _validate(page: str, port: int) -> dict[str, Any]:
    return {"tool": "preview.validate",
            "input": {"process_id": "${running.process_id}", "port": port, "path": f"/{page}"}}


def _actions(daemon: Daemon, run_id: str) -> list[dict[str, Any]]:
    return ledger_rows(daemon.home, "SELECT action_id, tool, phase, result FROM actions WHERE run_id = ?"
                       " ORDER BY loop_index, action_index", run_id)


def test_three_preview_pages_get_their_verdicts_with_screenshots(daemon: Daemon) -> None:
    port = PORT
    server = {"tool": "process.start", "input": {
        "program": "python3", "args": ["-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", "site"],
        "timeout_s": 120}}
    steps = [
        # A change to the sources: the final reply now needs a passing preview.
        {"actions": [{"tool": "fs.write", "input": {"path": "site/notes.txt", "content": "level 1"}}]},
        {"final": "too early"},
        {"actions": [server]},
        {"actions": [_validate(page, port) for page in PAGES]},
        # No session named: the spec's preview_url (its page, or another path on its origin).
        {"actions": [{"tool": "preview.validate", "input": {}},
                     {"tool": "preview.validate", "input": {"path": "/blank.html"}},
                     {"tool": "preview.validate", "input": {"port": port}}]},
        {"actions": [{"tool": "process.terminate", "input": {"process_id": "${running.process_id}"}}]},
        {"final": "checked"},
    ]
    run_id = daemon.call("run", agent_id="writer", task="check the preview", script=json.dumps({"steps": steps}))[
        "run_id"]
    wait_run(daemon, run_id, {"completed"}, timeout=120)
    checks = [row for row in _actions(daemon, run_id) if row["tool"] == "preview.validate"]
    assert len(checks) == 6
    spec_page, spec_other, port_alone = (json.loads(row["result"])["output"] for row in checks[3:])
    assert (spec_page["url"], spec_page["passed"]) == (f"http://127.0.0.1:{port}/game.html", True)
    assert (spec_other["url"], spec_other["passed"]) == (f"http://127.0.0.1:{port}/blank.html", False)
    assert port_alone["code"] == "bad-input" and "goes with the process_id" in port_alone["error"], port_alone
    checks = checks[:3]
    verdicts = {}
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for page, row in zip(PAGES, checks, strict=True):
        output = json.loads(row["result"])["output"]
        assert output["url"] == f"http://127.0.0.1:{port}/{page}"
        verdicts[page] = (output["passed"], {name: view["passed"] for name, view in output["viewports"].items()})
        evidence = daemon.home / output["evidence_dir"]
        assert evidence.parent.name == run_id and evidence.name == row["action_id"]
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
    blocked = ledger_rows(daemon.home, "SELECT data FROM events WHERE kind = 'final-blocked' AND subject = ?", run_id)
    assert len(blocked) == 1 and "run preview.validate" in json.loads(blocked[0]["data"])["detail"]
    assert show(daemon, run_id)["final_reply"] == "checked"
    # No image bytes in the ledger: only names, sizes and hashes.
    ledger = b"".join(p.read_bytes() for p in daemon.home.glob("ledger.db*"))
    assert b"\x89PNG" not in ledger


def test_only_a_running_session_of_the_run_is_a_preview(daemon: Daemon) -> None:
    steps = [{"actions": [_validate("game.html", _free_port()) | {
        "input": {"process_id": "proc-00000000000000000000", "port": 8000}}]}, {"final": "refused"}]
    run_id = daemon.call("run", agent_id="writer", task="no preview", script=json.dumps({"steps": steps}))["run_id"]
    wait_run(daemon, run_id, {"completed"}, timeout=60)
    (row,) = _actions(daemon, run_id)
    assert row["phase"] == "failed"
    assert json.loads(row["result"])["output"]["code"] == "not-a-preview"


def test_a_url_is_made_on_loopback_and_judged_after_parsing() -> None:
    assert preview_url(8080, "/a/b.html?x=1") == "http://127.0.0.1:8080/a/b.html?x=1"
    for bad in ("//evil.example/", "@evil.example/", "x", "/\\evil", "/a#b", "/\x00"):
        with pytest.raises(ToolError):
            preview_url(8080, bad)


def test_one_viewport_only_or_a_uniform_canvas_fails() -> None:
    good = {"present": True, "visible_area": 100, "opaque": 50, "colors": 3}
    assert viewport_problems(ViewportReport("desktop", 200, canvas=good, sha256="x")) == []
    solid = {**good, "colors": 1}
    assert "blank" in viewport_problems(ViewportReport("desktop", 200, canvas=solid, sha256="x"))[0]
    assert viewport_problems(ViewportReport("desktop", 200, canvas={"present": False}, sha256="x")) == ["no canvas"]
    assert "no screenshot" in viewport_problems(ViewportReport("mobile", 200, canvas=good))
