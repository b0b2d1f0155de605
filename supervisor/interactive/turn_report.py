"""One chat turn's report (seed 004 V1.15): ``[turn.report]``, schema ``swarm-turn-report.v1``.

A turn is the conversation's latest run and every run under it (its delegations
and isolated children: the runs whose ``root_run_id`` is it). ``build`` is a pure
function over those rows, the tree's open actions and the run's final reply; it
says what the report is and whether the turn is settled: no run of the tree
still moves (pending, running, waiting for a join or a provider retry) unless a
person is what it waits for, and no action is on its way (prepared, approved,
executing). The chat prints the report once a settled state has held across a
quiet window of the event stream (corral/cli/chat_turns.py), so the chat and the
tests read the same numbers through one control method,
``conversation.turn_report``.

The report holds identities and counts only (the schema,
docs/schemas/swarm-turn-report.v1.json, allows nothing else): no path, no task,
reply or observation text, no prompt, provider payload or credential.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from corral.supervisor.errors import NotFound
from corral.supervisor.interactive import interactive_store as interactive
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.runs.run_state import TERMINAL, RunStatus

SCHEMA = "swarm-turn-report.v1"
#: Statuses in which a run still moves by itself (the turn is not over).
MOVING = frozenset(
    {RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING_FOR_JOIN, RunStatus.WAITING_FOR_PROVIDER_RETRY}
)
#: Statuses in which a run waits for the person at the keyboard.
FOR_PERSON = frozenset({RunStatus.WAITING_CONFIRMATION, RunStatus.NEEDS_INPUT})
#: Action phases on their way to a receipt without a person.
ON_THE_WAY = frozenset({"prepared", "approved", "executing"})


@dataclass(frozen=True)
class TurnReport:
    report: dict[str, Any]
    settled: bool


def build(
    conversation_id: str,
    root: Mapping[str, Any],
    tree: Iterable[Mapping[str, Any]],
    action_phases: Iterable[tuple[str, str, str]],
    reply: str | None,
) -> TurnReport:
    """The report of the turn whose run is ``root``: ``tree`` is every run of the
    turn (``root`` too), ``action_phases`` (agent, phase, its run's status) of its
    actions that have no receipt yet, ``reply`` the run's final reply (None: none yet)."""
    runs = list(tree)
    children = [run for run in runs if run["run_id"] != root["run_id"]]
    statuses = [str(run["status"]) for run in runs]
    phases = list(action_phases)
    moving_agents = {str(run["agent_id"]) for run in runs if run["status"] in MOVING}
    agents = {str(run["agent_id"]) for run in runs}
    reconciling = {str(run["agent_id"]) for run in runs if run["status"] == RunStatus.NEEDS_RECONCILIATION}
    reconciling |= {agent for agent, phase, _ in phases if phase == "needs-reconciliation"}
    for_person = any(status in FOR_PERSON for status in statuses)
    # A question's own action executes while its run waits for the answer.
    on_the_way = any(phase in ON_THE_WAY and status not in FOR_PERSON for _, phase, status in phases)
    moving = bool(moving_agents)
    # An approval is part of the turn (seed 004 V1.15: a turn settles only when no
    # runtime is "pending / running / waiting-for-confirmation / cancelling"): the
    # person decides it in the chat, and the turn goes on to its one report. A
    # question is where a turn may end (the answer is the next line).
    confirming = any(status == RunStatus.WAITING_CONFIRMATION for status in statuses)
    # A run waiting for its children is still for a person when one of them asks.
    settled = not on_the_way and not confirming and (not moving or for_person or bool(reconciling))
    if reconciling:
        outcome = "needs-reconciliation"
    elif for_person:
        outcome = "waiting-for-person"
    else:
        outcome = "settled"
    report = {
        "schema": SCHEMA,
        "outcome": outcome,
        "conversation_id": conversation_id,
        "agent_id": str(root["agent_id"]),
        "run_id": str(root["run_id"]),
        "run_status": str(root["status"]),
        "runtimes": {"busy": len(moving_agents), "idle": len(agents - moving_agents)},
        "tasks": {
            "pending": statuses.count(RunStatus.PENDING),
            "running": sum(status in MOVING and status != RunStatus.PENDING for status in statuses),
            "waiting_for_person": sum(status in FOR_PERSON for status in statuses),
            "needs_reconciliation": statuses.count(RunStatus.NEEDS_RECONCILIATION),
        },
        "children": {"total": len(children), "live": sum(run["status"] not in TERMINAL for run in children)},
        "new_assistant_messages": 0 if reply is None else 1,
        "final_reply_chars": 0 if reply is None else len(reply),
        "reconciliation_agents": len(reconciling),
    }
    return TurnReport(report, settled)


def load(ledger: Ledger, conversation_id: Any) -> TurnReport:
    """The report of the conversation's latest turn, from the ledger."""
    conversation = interactive.get_conversation(ledger, conversation_id)
    root = ledger.one(
        "SELECT run_id, agent_id, status FROM runs WHERE conversation_id = ? ORDER BY created_at DESC LIMIT 1",
        conversation["conversation_id"],
    )
    if root is None:
        raise NotFound(f"conversation {conversation['conversation_id']} has no turn yet")
    tree = ledger.all("SELECT run_id, agent_id, status FROM runs WHERE root_run_id = ? OR run_id = ?",
                      root["run_id"], root["run_id"])
    phases = ledger.all(
        "SELECT a.agent_id, a.phase, r.status FROM actions a JOIN runs r ON r.run_id = a.run_id"
        " WHERE (r.root_run_id = ? OR r.run_id = ?) AND a.phase NOT IN ('ok', 'failed', 'denied')",
        root["run_id"], root["run_id"],
    )
    reply = ledger.one("SELECT text FROM replies WHERE run_id = ?", root["run_id"])
    return build(
        str(conversation["conversation_id"]),
        dict(root),
        [dict(run) for run in tree],
        [(str(row["agent_id"]), str(row["phase"]), str(row["status"])) for row in phases],
        None if reply is None else str(reply["text"]),
    )


class TurnReports:
    """``conversation.turn_report``: the latest turn's report, whether it is settled,
    and the event cursor it was read at (a quiet window is measured from there)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    async def turn_report(self, params: dict[str, Any]) -> dict[str, Any]:
        cursor = self.ledger.last_cursor()
        turn = load(self.ledger, params.get("conversation_id"))
        return {"report": turn.report, "settled": turn.settled, "cursor": cursor}
