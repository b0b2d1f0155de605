"""The task bridge for tests: one ``corral bridge serve`` process with six
registered principals (the ``bridge`` fixture in conftest.py starts one)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from corral.bridge import BridgeCallError, Client
from tests.harness import CORRAL

PRINCIPALS = ("owner", "A", "B", "R", "D", "X")


class Bridge:
    """One ``corral bridge serve`` process on an ephemeral port."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.db = tmp / "bridge.db"
        self.tokens = {name: f"token-{name}-" + "x" * 16 for name in PRINCIPALS}
        registration = tmp / "principals.json"
        registration.write_text(json.dumps({"principals": {n: {"token": t} for n, t in self.tokens.items()}}))
        registration.chmod(0o600)
        self.registration = registration
        self.process: subprocess.Popen[str] | None = None
        self.url = ""

    def start(self, env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(
            [*CORRAL, "bridge", "serve", "--db", str(self.db), "--listen", "127.0.0.1:0", "--principals",
             str(self.registration), "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})},
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line, f"the bridge did not start: {self.process.stderr.read() if self.process.stderr else ''}"
        self.url = json.loads(line)["url"]

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        if self.process is not None:
            self.process.wait(timeout=20)

    def client(self, name: str) -> Client:
        return Client(self.url, self.tokens[name])


def refusal(reason: str, call: Callable[[], Any]) -> BridgeCallError:
    with pytest.raises(BridgeCallError) as caught:
        call()
    assert caught.value.reason == reason, caught.value
    return caught.value


def task_of(client: Client, task_id: str) -> dict[str, Any]:
    task: dict[str, Any] = client.call("task.get", task_id=task_id)["task"]
    return task


def published(owner: Client, *grants: tuple[str, list[str]], lease_ms: int = 60_000) -> str:
    task_id = owner.call("task.create", title="P", body={"description": "the parent"}, lease_ms=lease_ms,
                         decider="D", publish=True)["task"]["task_id"]
    for principal, permissions in grants:
        owner.call("grant.create", task_id=task_id, expected_revision=task_of(owner, task_id)["revision"],
                   principal=principal, permissions=permissions)
    return str(task_id)


def claim_and_start(client: Client, task_id: str, **claim: Any) -> tuple[str, str, int]:
    binding = client.call("binding.enable")["binding"]["binding_id"]
    revision = task_of(client, task_id)["revision"]
    assignment = client.call("assignment.claim", task_id=task_id, expected_revision=revision, binding_id=binding,
                             **claim)
    run = client.call("run.start", task_id=task_id, expected_revision=assignment["revision"],
                      assignment_id=assignment["assignment"]["assignment_id"])
    return assignment["assignment"]["assignment_id"], run["run"]["run_id"], int(run["revision"])
