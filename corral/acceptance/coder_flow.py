"""The coder flow (seed 004 V1.1 §5 points 1-4 and 7; all I/O, ``oracle`` judges): one
agent reads a file and changes it with ``project.changeset`` (which takes a
checkpoint first) under a confirm policy, through separate CLI processes
as a person runs them, with the supervisor SIGKILLed at a named failpoint; then what
the ledger and the project hold afterwards."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral import client
from corral.acceptance import specs
from corral.acceptance.host import DONE, Host, HostError
from corral.acceptance.provider import Provider
from corral.acceptance.workspace import Workspace
from corral.actors.tools import project_checkpoints
from corral.core.errors import CorralError
from corral.supervisor.ledger.ledger_spec import open_for_reading

#: The supervisor kill of the coder flow: after the final reply's finalization is
#: prepared, before the reply is appended (every run that ends passes it once).
KILL_POINT = "finalize.after-prepared"
RUN_TIMEOUT_S = 600.0


@dataclass
class CoderFacts:
    """What the coder flow left behind (seed 004 V1.1 §5 points 1-4 and 7)."""

    home: Path
    project: Path
    #: AGENTS.md's token (``Workspace.marker``).
    marker: str
    run_id: str = ""
    error: str = ""
    run_cli_exit: int | None = None
    #: The run's status when the `corral run --wait` CLI returned.
    status_at_cli_exit: str = ""
    waiting_tool: str = ""
    approve_exit: int | None = None
    killed_at_failpoint: bool = False
    boots: int = 0
    final_status: str = ""
    first_system_prompt: str = ""
    notes_after: str = ""
    actions: list[dict[str, Any]] = field(default_factory=list)
    replies: int = 0
    boots_in_ledger: int = 0
    #: Checkpoints the run's changesets kept in the home (project_checkpoints.py).
    checkpoints: int = 0


def coder_flow(workspace: Workspace, host: Host, provider: Provider) -> CoderFacts:
    project = workspace.project("coder-project")
    home = workspace.home("coder")
    spec = workspace.root / "coder.toml"
    spec.write_text(specs.coder_spec(provider, str(project)))
    facts = CoderFacts(home, project, workspace.marker)
    try:
        _drive_coder(host, facts, spec)
    except (HostError, CorralError, OSError, ValueError, KeyError) as exc:
        facts.error = f"{type(exc).__name__}: {exc}"[:500]
    with contextlib.suppress(HostError, CorralError, OSError):
        _gather(facts)
    if facts.run_id:  # what `corral transcript` shows is scanned for secrets too (it lands in the logs)
        with contextlib.suppress(HostError):
            host.cli(home, "transcript", facts.run_id, "--json")
    host.down(home)
    return facts


def _drive_coder(host: Host, facts: CoderFacts, spec: Path) -> None:
    home = facts.home
    supervisor = host.up(home, spec, failpoint=f"{KILL_POINT}=kill@once")
    facts.boots = 1
    # The person's CLI: starts the run and waits until it ends or parks, then exits.
    ran = host.cli(home, "run", "--agent", "coder", "--task", specs.CODER_TASK, "--wait", "--json",
                   "--timeout", str(RUN_TIMEOUT_S), timeout=RUN_TIMEOUT_S + 30)
    facts.run_cli_exit = ran.returncode
    shown = json.loads(ran.stdout) if ran.stdout.strip().startswith("{") else {}
    fired = home / "failpoints" / f"{KILL_POINT}.fired"
    if shown:
        facts.run_id = shown["run"]["run_id"]
        facts.status_at_cli_exit = shown["run"]["status"]
    elif fired.exists():
        # The run never parked: it went straight to its final reply, where the suite's
        # own failpoint killed the supervisor under the waiting CLI. The ledger has the run.
        facts.run_id = _only_run(home)
        facts.status_at_cli_exit = "supervisor-killed"
    else:
        raise HostError(f"`corral run` printed no run (exit {ran.returncode}): {ran.stderr.strip()[-300:]}")
    if facts.status_at_cli_exit == "waiting-confirmation":
        waiting = [a for a in shown["actions"] if a["phase"] == "waiting-confirmation"]
        facts.waiting_tool = waiting[0]["tool"] if waiting else ""
        if waiting:
            # Another person, another process, after the run's CLI has exited.
            approved = host.cli(home, "approve", waiting[0]["action_id"], "--fingerprint", waiting[0]["fingerprint"])
            facts.approve_exit = approved.returncode
    if facts.status_at_cli_exit not in DONE and not fired.exists():
        # Until the run ends, or the failpoint kills the supervisor under this wait.
        with contextlib.suppress(HostError, CorralError, OSError):
            host.wait_run(home, facts.run_id, DONE, RUN_TIMEOUT_S)
    if fired.exists():
        if not host.wait_dead(supervisor, 30):
            raise HostError(f"the failpoint {KILL_POINT} fired but the supervisor did not die")
        facts.killed_at_failpoint = True
        host.up(home, None)
        facts.boots += 1
        host.wait_run(home, facts.run_id, DONE, RUN_TIMEOUT_S)


def _only_run(home: Path) -> str:
    with contextlib.closing(open_for_reading(home)) as ledger:
        rows = ledger.all("SELECT run_id FROM runs WHERE kind = 'root'")
    if len(rows) != 1:
        raise HostError(f"expected the one run of the coder flow, found {len(rows)}")
    return str(rows[0][0])


def _gather(facts: CoderFacts) -> None:
    facts.notes_after = (facts.project / "notes.txt").read_text(errors="replace")
    if not facts.run_id:
        return
    with client.Client.connect(facts.home) as connected:
        shown = connected.call("show", run_id=facts.run_id)
        facts.final_status = shown["run"]["status"]
        transcript = connected.transcript(facts.run_id, 1)
    turns = transcript.get("turns") or []
    system = (turns[0].get("system") or {}) if turns else {}
    facts.first_system_prompt = str(system.get("text") or "")
    with contextlib.closing(open_for_reading(facts.home)) as ledger:
        facts.actions = [dict(row) for row in ledger.all(
            "SELECT action_id, tool, phase, input, policy FROM actions WHERE run_id = ? ORDER BY loop_index,"
            " action_index", facts.run_id)]
        facts.replies = len(ledger.all("SELECT run_id FROM replies WHERE run_id = ?", facts.run_id))
        facts.boots_in_ledger = len(ledger.all("SELECT boot_id FROM boots"))
    changed = {str(a["action_id"]) for a in facts.actions if a["tool"] == "project.changeset"}
    facts.checkpoints = sum(1 for cp in project_checkpoints.of_run(facts.home, facts.run_id) if cp.action_id in changed)
