"""What a model is sent of a page, end to end (seed 004 V1.3, V1.8, V1.10).

A strict re-audit (aud1, 2026-12-07) found, live, that the provider request cut
every observation at 8,000 characters: a default ``command.output_read`` page lost
``nextLine``/``totalLines`` and its last 30 lines, a ``process.poll`` page of 16,000
characters lost ``next_cursor``/``status``/``more``, and a 20,726-character content
diff lost its second file. Here a real supervisor drives an ``openai`` agent against
a loopback server that keeps the request bodies, and the "model" is a responder
that acts only on what it was sent: it pages a 400-line command through
``command.output_read`` by the ``nextLine`` it reads, pages a process's output
through ``process.poll`` by the ``next_cursor`` it reads, then makes two files with
``project.changeset`` and reviews them with ``project.diff`` by the checkpoint it
reads. What it gathered must be the whole output and both files, their absolute
paths scrubbed ("进入 LLM observation 前统一做路径和凭据清洗").
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from corral.sandbox.bwrap import bwrap_available
from fake_openai import FakeOpenAIServer, Reply, completion, tool_call
from loopback_http import serve_in_thread
from tests.harness import Daemon, ledger_rows, running, wait_run

SANDBOX_TABLE = "" if bwrap_available() else '[sandbox]\nmode = "allow-unsandboxed"\n'
LINES = 400
#: 79-digit lines: a default page of 160 of them is about 13,400 characters.
SEQ = {"program": "seq", "args": ["-f", "%079g", "1", str(LINES)]}
EXPECTED = [f"{n:079d}" for n in range(1, LINES + 1)]
#: Polls wait for a person, given once the process has ended: each page is then full.
SPEC = f"""
[project]
root = "ws"
{SANDBOX_TABLE}
[[agents]]
id = "coder"
provider = "openai"
[agents.openai]
base_url = "URL"
model = "fake-model"
timeout_s = 30
structured = "tools"
[agents.policy]
"command.exec" = "auto"
"process.start" = "auto"
"process.poll" = "confirm"
"project.changeset" = "auto"
"""
STOPPED = {"exited", "terminated", "failed", "timed-out", "output-limit-exceeded", "needs-reconciliation"}


def _latest_observation(body: bytes) -> dict[str, Any]:
    """The tool output of the newest observation the request carries, as a model
    would read it; ValueError when it is not whole JSON (it was cut)."""
    messages = json.loads(body)["messages"]
    (content,) = [m["content"] for m in messages if str(m["content"]).startswith("Observation for action")][-1:]
    text = str(content).split("\n", 1)[1]
    if text.startswith("sourceActionId "):
        text = text.split("; ", 1)[1]
    try:
        decoded: dict[str, Any] = json.loads(text)
    except json.JSONDecodeError:
        raise ValueError(f"the observation is no whole JSON (cut?): {text[:200]!r} … {text[-200:]!r}") from None
    return decoded


@dataclass
class Model:
    """A scripted model that reads its observations and acts on them."""

    workspace: str
    stage: str = "exec"
    lines: list[str] = field(default_factory=list)
    chunks: list[str] = field(default_factory=list)
    diff: dict[str, Any] | None = None
    source: str = ""
    process: str = ""
    #: What it could not read (a field that did not reach it), else empty.
    missing: list[str] = field(default_factory=list)

    def __call__(self, body: bytes) -> Reply:
        try:
            return self._next(body)
        except (KeyError, TypeError, ValueError) as exc:
            self.missing.append(f"{self.stage}: {exc!r}")
            return self._skip()

    def _skip(self) -> Reply:
        """The next stage's first call, after a stage that could not go on (so each
        finding is seen on its own)."""
        if self.stage == "read":
            self.stage = "start"
            return self._call("process_start", SEQ)
        if self.stage == "poll":
            self.stage = "change"
            return self._call("project_changeset", {"changes": _changes(self.workspace)})
        if self.stage == "change":
            self.stage = "review"
            return self._call("project_diff", {"include_content": True})
        return Reply(body=completion("gave up"))

    @staticmethod
    def _call(name: str, arguments: dict[str, Any]) -> Reply:
        return Reply(body=completion(tool_calls=[tool_call(name, arguments)]))

    def _next(self, body: bytes) -> Reply:
        seen = _latest_observation(body) if self.stage != "exec" else {}
        if self.stage == "exec":
            self.stage = "read"
            return self._call("command_exec", SEQ)
        if self.stage == "read":
            if "lines" in seen:
                self.lines += seen["lines"]
                if not seen["hasMore"]:
                    self.stage = "start"
                    return self._call("process_start", SEQ)
                start = seen["nextLine"]
            else:
                self.source = seen["sourceActionId"]
                start = 1
            return self._call("command_output_read", {"action_id": self.source, "start_line": start})
        if self.stage == "poll":
            if "chunk" in seen:
                self.chunks.append(seen["chunk"])
                if seen["status"] in STOPPED and not seen["more"]:
                    self.stage = "change"
                    return self._call("project_changeset", {"changes": _changes(self.workspace)})
                cursor = seen["next_cursor"]
            else:
                self.process, cursor = seen["process_id"], seen["cursor"]
            poll = {"process_id": self.process, "cursor": cursor, "max_chars": 16_000, "wait_ms": 0}
            return self._call("process_poll", poll)
        if self.stage == "start":
            self.stage = "poll"
            return self._next(body)
        if self.stage == "change":
            self.stage = "review"
            return self._call("project_diff", {"since_checkpoint": seen["checkpoint"], "include_content": True})
        self.diff = seen
        return Reply(body=completion("done"))


def _file(name: str, lines: int, workspace: str) -> str:
    body = "".join(f'const {name}{i} = "{name}-value-{i}";\n' for i in range(lines))
    return f"// built at {workspace}/build/out.js from /etc/hosts\n{body}"


def _changes(workspace: str) -> list[dict[str, str]]:
    return [
        {"operation": "create", "path": "src/big.js", "content": _file("big", 300, workspace)},
        {"operation": "create", "path": "src/small.js", "content": _file("small", 250, workspace)},
    ]


def _session_state(daemon: Daemon, run_id: str) -> str:
    (row,) = ledger_rows(daemon.home, "SELECT state FROM sessions WHERE run_id = ?", run_id)
    return str(row["state"])


@pytest.fixture
def swarm(short_tmp: Path) -> Iterator[tuple[Daemon, FakeOpenAIServer, Model]]:
    (short_tmp / "ws").mkdir()
    workspace = str((short_tmp / "ws").resolve())
    model = Model(workspace)
    server = FakeOpenAIServer([model] * 40, keep_bodies=True)
    with serve_in_thread(server) as url, running(short_tmp / "home", SPEC.replace("URL", url)) as daemon:
        yield daemon, server, model


def test_the_model_pages_whole_outputs_and_sees_the_whole_diff(swarm: tuple[Daemon, FakeOpenAIServer, Model]) -> None:
    daemon, server, model = swarm
    run_id = daemon.call("run", agent_id="coder", task="find the failure")["run_id"]
    while True:
        shown = wait_run(daemon, run_id, {"waiting-confirmation", "completed", "failed"})
        if shown["run"]["status"] != "waiting-confirmation":
            break
        # The poll waits until the process has ended: every page is then a full one.
        daemon.wait_until(lambda _: _session_state(daemon, run_id) in STOPPED, what="the process to end")
        for pending in daemon.call("pending")["actions"]:
            daemon.call("continue_action", action_id=pending["action_id"], decision="approve")
    assert model.missing == [], model.missing
    assert shown["run"]["status"] == "completed" and shown["final_reply"] == "done", shown["run"]

    # V1.8: three default pages (160, 160, 80 lines), each line with its number.
    assert model.lines == [f"{n}: {line}" for n, line in enumerate(EXPECTED, start=1)]
    # V1.10: the pages of 16,000 characters came whole, cursor to cursor.
    assert max(len(chunk) for chunk in model.chunks) == 16_000
    assert [line.strip("\r") for line in "".join(model.chunks).splitlines()] == EXPECTED
    # V1.3: both files' hunks, whole, their paths scrubbed.
    assert model.diff is not None and model.diff["truncated"] is False
    diffs = {f["path"]: f["diff"] for f in model.diff["files"]}
    assert set(diffs) == {"src/big.js", "src/small.js"} and 16_000 < sum(map(len, diffs.values())) < 24_000
    for name, lines in (("big", 300), ("small", 250)):
        text = diffs[f"src/{name}.js"]
        assert f'+const {name}{lines - 1} = "{name}-value-{lines - 1}";' in text
        assert "// built at <project>/build/out.js from <absolute-path>" in text
    bodies = b"".join(record.body or b"" for record in server.requests)
    assert model.workspace.encode() not in bodies and b"/etc/hosts" not in bodies
