"""The swarm flow (seed 004 V1.1 §5.6): a supervisor agent with two specialists and
two templates, asked in business terms to delegate twice and spawn one isolated
group; the evidence is what the ledger holds about that run afterwards."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from corral.acceptance import specs
from corral.acceptance.host import Host, HostError
from corral.acceptance.overlap import intervals_of, max_concurrent
from corral.acceptance.provider import Provider
from corral.acceptance.workspace import Workspace
from corral.core.errors import CorralError
from corral.supervisor.ledger.ledger_spec import open_for_reading

RUN_TIMEOUT_S = 900.0


@dataclass
class SwarmFacts:
    home: Path
    project: Path
    run_id: str = ""
    error: str = ""
    final_status: str = ""
    delegates: int = 0
    delegate_agents: int = 0
    groups: int = 0
    children: int = 0
    child_templates: int = 0
    joins: int = 0
    joins_claimed: int = 0
    replies: int = 0
    #: Instances per template (the seed: two of one template, one of another).
    templates: dict[str, int] = field(default_factory=dict)
    #: The most children with a provider request in flight at one instant.
    children_overlap: int = 0
    #: The same for the delegated specialists.
    delegates_overlap: int = 0


def swarm_flow(workspace: Workspace, host: Host, provider: Provider) -> SwarmFacts:
    project = workspace.project("swarm-project")
    home = workspace.home("swarm")
    spec = workspace.root / "swarm.toml"
    spec.write_text(specs.swarm_spec(provider, str(project)))
    facts = SwarmFacts(home, project)
    try:
        host.up(home, spec)
        ran = host.cli(home, "run", "--agent", "project-supervisor", "--task", specs.SWARM_TASK, "--wait", "--json",
                       "--timeout", str(RUN_TIMEOUT_S), timeout=RUN_TIMEOUT_S + 30)
        shown = json.loads(ran.stdout) if ran.stdout.strip().startswith("{") else {}
        if not shown:
            raise HostError(f"`corral run` printed no run (exit {ran.returncode}): {ran.stderr.strip()[-300:]}")
        facts.run_id = shown["run"]["run_id"]
        facts.final_status = shown["run"]["status"]
        _gather(facts)
    except (HostError, CorralError, OSError, ValueError, KeyError) as exc:
        facts.error = f"{type(exc).__name__}: {exc}"[:500]
    with contextlib.suppress(HostError):
        host.down(home)
    return facts


def _gather(facts: SwarmFacts) -> None:
    run = facts.run_id
    with contextlib.closing(open_for_reading(facts.home)) as ledger:
        delegations = ledger.all("SELECT target_agent, run_id FROM delegations WHERE parent_run_id = ?", run)
        groups = ledger.all("SELECT group_id FROM isolated_groups WHERE parent_run_id = ?", run)
        children = ledger.all("SELECT c.template, c.run_id FROM children c JOIN isolated_groups g ON c.group_id ="
                              " g.group_id WHERE g.parent_run_id = ?", run)
        requests = ledger.all("SELECT p.run_id, p.started_at, p.finished_at FROM provider_requests p JOIN runs r"
                              " ON p.run_id = r.run_id WHERE r.parent_run_id = ?", run)
        joins = ledger.all("SELECT status FROM deliveries WHERE parent_run_id = ? AND kind = 'join'", run)
        facts.replies = len(ledger.all("SELECT run_id FROM replies WHERE run_id = ?", run))
    facts.delegates = len(delegations)
    facts.delegate_agents = len({row[0] for row in delegations})
    facts.groups = len(groups)
    facts.children = len(children)
    facts.child_templates = len({row[0] for row in children})
    for row in children:
        facts.templates[str(row[0])] = facts.templates.get(str(row[0]), 0) + 1
    spans = intervals_of([(str(r[0]), float(r[1]), r[2]) for r in requests])
    child_runs = {str(row[1]) for row in children}
    delegate_runs = {str(row[1]) for row in delegations}
    facts.children_overlap = max_concurrent({k: v for k, v in spans.items() if k in child_runs})
    facts.delegates_overlap = max_concurrent({k: v for k, v in spans.items() if k in delegate_runs})
    facts.joins = len(joins)
    facts.joins_claimed = sum(1 for row in joins if row[0] == "claimed-by-parent")
