"""The autonomous chat flow (seed 004 V1.30, V1.31): one business-only task typed into
``corral chat --json`` (a separate process, as a person runs it), read until its one
``[turn.report]`` settles the turn; then the ledger and the project's files.

Delegating and spawning wait for a person (policy ``confirm``): the flow answers each
approval prompt with ``y`` in the same chat, except at a repair's prompt, where it
first SIGKILLs the supervisor, restarts it and compares what the ledger holds
(deliveries, claims, groups, the waiting action, the provider requests) before and
after (V1.31: "repair 待确认动作持久化后执行 … 强杀")."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral.acceptance import specs
from corral.acceptance.host import Host, HostError
from corral.acceptance.overlap import any_pair_overlaps, intervals_of, max_concurrent
from corral.acceptance.provider import Provider
from corral.acceptance.workspace import Workspace
from corral.core.child_python import python_argv, python_env
from corral.core.errors import CorralError
from corral.core.procs import wait_exit
from corral.supervisor.home import home_dir as homes
from corral.supervisor.ledger.ledger_spec import open_for_reading

TURN_TIMEOUT_S = 1200.0
#: How long the flow waits for the chat's "reconnected" before it answers anyway.
RECONNECT_GRACE_S = 60.0


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
    # -- V1.31 ------------------------------------------------------------------------
    #: The first provider batch holding a delegate or a spawn: its delegates and spawns.
    batch_delegates: int = 0
    batch_spawns: int = 0
    #: That batch stopped for approval at its action 0 before any of it executed.
    batch_parked_first: bool = False
    #: Approvals given to that batch's actions (the seed: exactly one).
    batch_approvals: int = 0
    #: The most static specialists with a provider request in flight at one instant,
    #: and whether a static and an isolated run ever did at once.
    static_overlap: int = 0
    mixed_overlap: bool = False
    #: The supervisor was SIGKILLed at a repair's approval prompt and restarted; the
    #: ledger's identities were the same after the restart.
    killed_at_repair: bool = False
    identity_stable: bool = False
    boots: int = 1


def chat_flow(workspace: Workspace, host: Host, provider: Provider) -> ChatFacts:
    project = workspace.project("chat-project")
    facts = ChatFacts(workspace.home("chat"), project)
    spec = workspace.root / "chat.toml"
    spec.write_text(specs.chat_spec(provider, str(project)))
    try:
        host.up(facts.home, spec)
        lines = _converse(host, facts, workspace.log("chat.jsonl"))
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


def _converse(host: Host, facts: ChatFacts, log: Path) -> list[dict[str, Any]]:
    """Type the task, read JSON lines until a settled turn report (or the deadline),
    answering approval prompts, then /quit. The chat process is reaped here whatever
    happens."""
    argv = python_argv("-m", "corral", "--home", str(facts.home), "chat", "--json")
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
        _say(chat, specs.CHAT_TASK)
        deadline = time.monotonic() + TURN_TIMEOUT_S
        #: After the kill: answer once the chat says it reconnected (or after a grace,
        #: should it not have noticed the supervisor was gone).
        answer_at: float | None = None
        while time.monotonic() < deadline:
            wait = deadline - time.monotonic() if answer_at is None else answer_at - time.monotonic()
            try:
                line = lines.get(timeout=max(0.1, wait))
            except queue.Empty:
                if answer_at is None:
                    break
                line = '{"event": "reconnected"}'
            if line is None:
                break
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if isinstance(event, dict):
                    seen.append(event)
                    if event.get("event") == "turn.report":  # printed once, when the turn settled
                        break
                    if event.get("event") == "reconnected" and answer_at is not None:
                        answer_at = None
                        _say(chat, "y")
                    elif event.get("event") == "approval":
                        if _kill_first(host, facts, str(event.get("action", ""))):
                            answer_at = time.monotonic() + RECONNECT_GRACE_S
                        else:
                            _say(chat, "y")
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


def _say(chat: subprocess.Popen[str], text: str) -> None:
    assert chat.stdin is not None
    chat.stdin.write(text + "\n")
    chat.stdin.flush()


def _kill_first(host: Host, facts: ChatFacts, action_id: str) -> bool:
    """At the first repair's prompt: SIGKILL the supervisor, restart it, and compare
    the ledger's identities before and after; True when it did (the chat reconnects
    by itself, and ``y`` then approves the action whose view it showed)."""
    with contextlib.closing(open_for_reading(facts.home)) as ledger:
        rows = ledger.all("SELECT run_id, tool, input FROM actions WHERE action_id = ?", action_id)
    is_repair = bool(rows) and rows[0][1] == "agent.delegate" and bool(_object(rows[0][2]).get("repair_of"))
    if not is_repair or facts.killed_at_repair:
        return False
    run_id = str(rows[0][0])
    before = _identity(facts.home, run_id)
    pid = homes.read_endpoint(facts.home).pid
    os.kill(pid, signal.SIGKILL)
    if not wait_exit(pid, 30):
        raise HostError("the supervisor outlived its SIGKILL")
    host.up(facts.home, None)
    facts.boots += 1
    facts.killed_at_repair = True
    after = _identity(facts.home, run_id)
    facts.identity_stable = before[:-1] == after[:-1] and before[-1] <= after[-1]
    return True


def _object(text: object) -> dict[str, Any]:
    with contextlib.suppress(ValueError, TypeError):
        value = json.loads(str(text))
        if isinstance(value, dict):
            return value
    return {}


Identity = tuple[frozenset[str], frozenset[str], frozenset[str], frozenset[str], frozenset[str]]


def _identity(home: Path, run_id: str) -> Identity:
    """What must not drift across the kill: delegations, groups, deliveries with
    their status, the waiting actions; and the provider requests (the last: none
    may be lost, none replayed under a new slot while the run is parked)."""
    with contextlib.closing(open_for_reading(home)) as ledger:
        def ids(sql: str) -> frozenset[str]:
            return frozenset(":".join(str(v) for v in row) for row in ledger.all(sql, run_id))

        return (ids("SELECT delegation_id FROM delegations WHERE parent_run_id = ?"),
                ids("SELECT group_id FROM isolated_groups WHERE parent_run_id = ?"),
                ids("SELECT delivery_id, status FROM deliveries WHERE parent_run_id = ?"),
                ids("SELECT action_id FROM actions WHERE run_id = ? AND phase = 'waiting-confirmation'"),
                ids("SELECT p.slot FROM provider_requests p JOIN runs r ON p.run_id = r.run_id WHERE"
                    " r.root_run_id = ?"))


def _gather(facts: ChatFacts) -> None:
    run = facts.run_id
    with contextlib.closing(open_for_reading(facts.home)) as ledger:
        facts.final_status = str(ledger.all("SELECT status FROM runs WHERE run_id = ?", run)[0][0])
        delegations = ledger.all("SELECT target_agent, repair_of, run_id, parent_action_id FROM delegations"
                                 " WHERE parent_run_id = ?", run)
        facts.groups = len(ledger.all("SELECT group_id FROM isolated_groups WHERE parent_run_id = ?", run))
        children = ledger.all("SELECT c.run_id FROM children c JOIN isolated_groups g ON c.group_id ="
                              " g.group_id WHERE g.parent_run_id = ?", run)
        facts.joins_claimed = len(ledger.all("SELECT 1 FROM deliveries WHERE parent_run_id = ? AND kind = 'join'"
                                             " AND status = 'claimed-by-parent'", run))
        facts.replies = len(ledger.all("SELECT run_id FROM replies WHERE run_id = ?", run))
        actions = ledger.all("SELECT action_id, tool, loop_index, action_index FROM actions WHERE run_id = ?"
                             " ORDER BY loop_index, action_index", run)
        requests = ledger.all("SELECT p.run_id, p.started_at, p.finished_at FROM provider_requests p JOIN runs r"
                              " ON p.run_id = r.run_id WHERE r.parent_run_id = ?", run)
        batch = first_batch(actions, {str(row[3]) for row in delegations if row[1] is not None})
        marks = ", ".join("?" * len(batch)) or "''"
        events = ledger.all(f"SELECT kind, subject FROM events WHERE subject IN ({marks}) ORDER BY cursor",
                            *[str(row[0]) for row in batch])
    facts.children = len(children)
    originals = [row for row in delegations if row[1] is None]
    facts.delegates = len(originals)
    facts.delegate_agents = len({row[0] for row in originals})
    for row in delegations:
        if row[1] is not None:
            facts.repairs[str(row[1])] = facts.repairs.get(str(row[1]), 0) + 1
    facts.batch_delegates = sum(1 for row in batch if row[1] == "agent.delegate")
    facts.batch_spawns = sum(1 for row in batch if row[1] == "agent.spawn_isolated")
    read_batch_approvals(facts, batch, [(str(e[0]), str(e[1])) for e in events])
    spans = intervals_of([(str(r[0]), float(r[1]), r[2]) for r in requests])
    static = {k: v for k, v in spans.items() if k in {str(row[2]) for row in originals}}
    isolated = {k: v for k, v in spans.items() if k in {str(row[0]) for row in children}}
    facts.static_overlap = max_concurrent(static)
    facts.mixed_overlap = any_pair_overlaps(static, isolated)
    for scope in ("research", "review"):
        folder = facts.project / scope
        facts.artifacts[scope] = sum(1 for p in folder.rglob("*") if p.is_file() and p.stat().st_size) \
            if folder.is_dir() else 0


COLLABORATION = ("agent.delegate", "agent.spawn_isolated")


def first_batch(actions: list[Any], repair_actions: set[str]) -> list[Any]:
    """The actions of the first provider batch (loop) that delegates or spawns, not
    counting repairs."""
    loops = [row[2] for row in actions if row[1] in COLLABORATION and str(row[0]) not in repair_actions]
    if not loops:
        return []
    return [row for row in actions if row[2] == loops[0]]


def read_batch_approvals(facts: ChatFacts, batch: list[Any], events: list[tuple[str, str]]) -> None:
    """From the batch's action events in commit order: did action 0 wait for
    approval before any of the batch executed, and how many approvals it took."""
    if not batch:
        return
    first = str(batch[0][0])
    gates = [(kind, subject) for kind, subject in events if kind in ("action-waiting-confirmation", "action-executing")]
    facts.batch_parked_first = bool(gates) and gates[0] == ("action-waiting-confirmation", first)
    facts.batch_approvals = sum(1 for kind, _ in events if kind == "action-approved")
