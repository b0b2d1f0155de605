"""What ``corral run --wait`` says while it waits, on stderr (stdout stays the result,
so ``--json`` output stays clean).

Without a terminal there is no status line (corral/cli/progress.py), and a run
that waits on something (a delegated child's approval, say) used to just sit. So:
the run id at once, then one line per state change of any run in the run's tree
(the run and the children and delegates it starts, found through ``show`` as the
``delegated``/``group-spawned`` events name them). On a terminal too, whenever
anything in that tree waits for a person, a line names the command that answers
it (``corral approve ACTION``, ``corral reconcile``, ``corral answer``).

``TreeNotices`` turns events into those lines (it asks ``show`` only to learn a
parent's new children); ``follow_run`` is the plain loop around it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TextIO

from corral.client import Client
from corral.client_types import DONE, PARKED, Event, RunResult
from corral.core.errors import RunTimeout
from corral.supervisor.runs.run_state import RunStatus

#: How long one events poll waits for news.
POLL_MS = 500
#: Even with no event about it, the run's state is asked this often (a safety net).
RECHECK_S = 10.0
_RUN_STATES = frozenset(status.value for status in RunStatus)
_CHILD_KINDS = frozenset({"delegated", "group-spawned"})
_WHAT_WAITS = "`corral pending` shows everything that waits"


@dataclass(frozen=True)
class Notice:
    text: str
    #: It names what a person must do (said even where state changes are not).
    for_a_person: bool


@dataclass
class TreeNotices:
    """The runs of one run's tree, and what their events mean for a person."""

    client: Client
    root: str
    #: run id -> how a line names it.
    labels: dict[str, str] = field(default_factory=dict)
    #: run id -> its newest state.
    states: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.labels.setdefault(self.root, self.root)

    @property
    def root_state(self) -> str:
        return self.states.get(self.root, "pending")

    def notices(self, events: Iterable[Event]) -> list[Notice]:
        found: list[Notice] = []
        for event in events:
            found += self._notices(event)
        return found

    def _notices(self, event: Event) -> list[Notice]:
        kind, data = event.kind, event.data
        if kind in _CHILD_KINDS and data.get("parent_run") in self.labels:
            self._learn_children(str(data["parent_run"]))
            return []
        if kind.startswith("run-") and kind[4:] in _RUN_STATES and event.subject in self.labels:
            return self._run_state(event.subject, kind[4:])
        run = data.get("run")
        if not (kind.startswith("action-") and isinstance(run, str) and run in self.labels):
            return []
        action, tool, label = event.subject, data.get("tool", "?"), self.labels[run]
        if kind == "action-waiting-confirmation":
            return [Notice(f"action {action} ({tool}) of {label} waits for your approval: corral approve {action}"
                           f" (or corral deny {action}); {_WHAT_WAITS}", True)]
        if kind == "action-needs-reconciliation":
            return [Notice(f"action {action} ({tool}) of {label} may or may not have happened: check, then"
                           f" corral reconcile {action} --as ok|failed; {_WHAT_WAITS}", True)]
        return []

    def _run_state(self, run_id: str, state: str) -> list[Notice]:
        if self.states.get(run_id) == state:
            return []
        self.states[run_id] = state
        said = [Notice(f"{self.labels[run_id]} {state}", False)]
        if state == RunStatus.NEEDS_INPUT:
            said.append(Notice(f"{self.labels[run_id]} asks you a question: corral answer {run_id} TEXT;"
                               f" {_WHAT_WAITS} (and the question)", True))
        return said

    def _learn_children(self, parent: str) -> None:
        swarm: dict[str, Any] = self.client.show(parent).raw.get("swarm") or {}
        for delegation in swarm.get("delegations", []):
            run_id = delegation.get("run_id")
            if isinstance(run_id, str) and run_id and run_id not in self.labels:
                self.labels[run_id] = f"{run_id} (delegated to {delegation.get('target_agent')})"
        for group in swarm.get("groups", []):
            for child in group.get("children", []):
                run_id = child.get("run_id")
                if isinstance(run_id, str) and run_id and run_id not in self.labels:
                    self.labels[run_id] = f"{run_id} (child {child.get('template')})"


def settled(state: str) -> bool:
    return state in DONE or state in PARKED


def follow_run(client: Client, run_id: str, since: int, timeout: float, out: TextIO, *, states: bool = True
               ) -> RunResult:
    """Follow ``run_id`` from event cursor ``since`` until it ends or parks (as
    ``Client.wait``: ``RunTimeout`` after ``timeout`` seconds), saying on ``out``
    each state change (``states``) and whatever waits for a person (always)."""
    tree = TreeNotices(client, run_id)
    cursor = since
    deadline = time.monotonic() + timeout
    checked = time.monotonic()
    while True:
        reply = client.call("events", timeout=POLL_MS / 1000 + 15, since=cursor, wait_ms=POLL_MS)
        cursor = int(reply["cursor"])
        for notice in tree.notices(Event.from_row(row) for row in reply["events"]):
            if states or notice.for_a_person:
                print(f"corral run: {notice.text}", file=out, flush=True)
        if settled(tree.root_state) or time.monotonic() - checked >= RECHECK_S:
            checked = time.monotonic()
            if client.call("wait", run_ids=[run_id], until="settled", wait_ms=0)["reached"]:
                return client.show(run_id)
        if time.monotonic() >= deadline:
            raise RunTimeout(run_id, tree.root_state, timeout)
