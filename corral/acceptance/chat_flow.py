"""The autonomous chat flow (seed 004 V1.30, V1.31): one business-only task typed into
``corral chat --json`` (a separate process, as a person runs it), read until its one
``[turn.report]`` settles the turn; then the ledger and the project's files."""

from __future__ import annotations

import contextlib
import json
import queue
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral.acceptance import specs
from corral.acceptance.host import Host, HostError
from corral.acceptance.provider import Provider
from corral.acceptance.workspace import Workspace
from corral.core.child_python import python_argv, python_env
from corral.core.errors import CorralError
from corral.supervisor.ledger.ledger_spec import open_for_reading

TURN_TIMEOUT_S = 1200.0


@dataclass
class ChatFacts:
    home: Path
    project: Path
    error: str = ""
    reports: list[dict[str, Any]] = field(default_factory=list)
    run_id: str = ""
    final_status: str = ""
    delegate_agents: int = 0
    delegates: int = 0
    #: Repairs per repaired delivery (seed: a weak delivery gets exactly one).
    repairs: dict[str, int] = field(default_factory=dict)
    groups: int = 0
    children: int = 0
    joins_claimed: int = 0
    replies: int = 0
    #: Non-empty files the specialists wrote, by scope (the host oracle's evidence).
    artifacts: dict[str, int] = field(default_factory=dict)
    transcript: Path | None = None


def chat_flow(workspace: Workspace, host: Host, provider: Provider) -> ChatFacts:
    project = workspace.project("chat-project")
    facts = ChatFacts(workspace.home("chat"), project)
    spec = workspace.root / "chat.toml"
    spec.write_text(specs.chat_spec(provider, str(project)))
    try:
        host.up(facts.home, spec)
        lines = _converse(host, facts.home, workspace.log("chat.jsonl"))
        facts.transcript = workspace.log("chat.jsonl")
        facts.reports = [line["report"] for line in lines if line.get("event") == "turn.report"]
        if facts.reports:
            facts.run_id = str(facts.reports[-1].get("run_id", ""))
        if facts.run_id:
            _gather(facts)
    except (HostError, CorralError, OSError, ValueError, KeyError) as exc:
        facts.error = f"{type(exc).__name__}: {exc}"[:500]
    with contextlib.suppress(HostError):
        host.down(facts.home)
    return facts


def _converse(host: Host, home: Path, log: Path) -> list[dict[str, Any]]:
    """Type the task, read JSON lines until a settled turn report (or the deadline),
    then /quit. The chat process is reaped here whatever happens."""
    argv = python_argv("-m", "corral", "--home", str(home), "chat", "--json")
    chat = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, env=python_env(host.env))
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert chat.stdout is not None
        for line in chat.stdout:
            lines.put(line)
        lines.put(None)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    seen: list[dict[str, Any]] = []
    try:
        assert chat.stdin is not None
        chat.stdin.write(specs.CHAT_TASK + "\n")
        chat.stdin.flush()
        deadline = time.monotonic() + TURN_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if isinstance(event, dict):
                    seen.append(event)
                    if event.get("event") == "turn.report":  # printed once, when the turn settled
                        break
        with contextlib.suppress(OSError, ValueError):
            chat.stdin.write("/quit\n")
            chat.stdin.close()
        try:
            chat.wait(30)
        except subprocess.TimeoutExpired:
            chat.kill()
            chat.wait()
    finally:
        if chat.poll() is None:
            chat.kill()
            chat.wait()
        log.write_text("".join(json.dumps(event, sort_keys=True) + "\n" for event in seen))
    return seen


def _gather(facts: ChatFacts) -> None:
    run = facts.run_id
    with contextlib.closing(open_for_reading(facts.home)) as ledger:
        facts.final_status = str(ledger.all("SELECT status FROM runs WHERE run_id = ?", run)[0][0])
        delegations = ledger.all("SELECT target_agent, repair_of FROM delegations WHERE parent_run_id = ?", run)
        facts.groups = len(ledger.all("SELECT group_id FROM isolated_groups WHERE parent_run_id = ?", run))
        facts.children = len(ledger.all("SELECT c.run_id FROM children c JOIN isolated_groups g ON c.group_id ="
                                        " g.group_id WHERE g.parent_run_id = ?", run))
        facts.joins_claimed = len(ledger.all("SELECT 1 FROM deliveries WHERE parent_run_id = ? AND kind = 'join'"
                                             " AND status = 'claimed-by-parent'", run))
        facts.replies = len(ledger.all("SELECT run_id FROM replies WHERE run_id = ?", run))
    originals = [row for row in delegations if row[1] is None]
    facts.delegates = len(originals)
    facts.delegate_agents = len({row[0] for row in originals})
    for row in delegations:
        if row[1] is not None:
            facts.repairs[str(row[1])] = facts.repairs.get(str(row[1]), 0) + 1
    for scope in ("research", "review"):
        folder = facts.project / scope
        facts.artifacts[scope] = sum(1 for p in folder.rglob("*") if p.is_file() and p.stat().st_size) \
            if folder.is_dir() else 0
