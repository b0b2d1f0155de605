"""The retry flow's victims and its forwarding gate (seed 004 V1.29, V1.42), chosen by
the fault proxy's selector from the request's sequence number only. What it decides
from is the ledger: a provider request's row is committed (``provider.begin``) before
the actor sends it, so the rows that appeared since the last call name the request
that just arrived (or one still on its way, not yet forwarded: every request passes
its own selector call before it is forwarded).

Three jobs, in order:

1. V1.29's victim: a specialist's first provider request (a delegation run, loop 0,
   no retry suffix). When several rows appeared at once and all are such requests,
   whichever this one is qualifies; the ledger names the slot that failed.
2. V1.29's forwarding gate: the victim's retry (``<slot>-transient-1``) is not
   forwarded before the checker has read the ledger: the victim run's actions,
   receipts, revisions and deliveries, and the root's replies, all still 0.
3. V1.42's victim: the root's base final reply. A base slot of the root (no retry,
   repair or interrupted suffix) that arrives once every delivery of the root is
   claimed, no delegated or isolated run is live and no reply exists, and only
   after a trusted host check in the project (``verify_e2e.py``) printed its marker.
   Whether it really was the final reply is judged afterwards from the ledger (the
   model might plan another tool call instead): the oracle says which.

Ambiguity never falls back to "the first request": no fault."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from corral.acceptance.fault_proxy import Fault
from corral.supervisor.ledger.ledger_spec import open_for_reading
from corral.supervisor.ledger.port import Ledger

#: The project's own end-to-end check the host runs before the final-reply drop.
HOST_CHECK = "verify_e2e.py"
HOST_PASSED = "real-e2e-command=passed"
HOST_FAILED = "real-e2e-command=failed"
HOST_CHECK_TIMEOUT_S = 60.0
#: A run in any other status is live.
ENDED = ("completed", "failed", "cancelled")


@dataclass
class Gate:
    """What the checker read while the victim's retry waited before the upstream."""

    retry_slot: str
    victim_actions: int
    victim_receipts: int
    victim_revisions: int
    victim_deliveries: int
    root_replies: int

    def drift(self) -> int:
        return (self.victim_actions + self.victim_receipts + self.victim_revisions + self.victim_deliveries
                + self.root_replies)


@dataclass
class FinalDrop:
    """The ledger when the root's candidate final reply was dropped."""

    slot: str
    loop_index: int
    claimed: int
    repairs_claimed: int
    replies: int
    tool_plans: int
    host_marker: bool


def base_slot(slot: str) -> bool:
    return not any(mark in slot for mark in ("-transient-", ":repair-", "-interrupted-"))


def host_check(project: Path) -> bool:
    """The project's own check, run by the host (never by an agent): passed only on
    a clean exit with the pass marker and without the fail marker."""
    try:
        done = subprocess.run([sys.executable, HOST_CHECK], cwd=project, capture_output=True, text=True,
                              timeout=HOST_CHECK_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    said = done.stdout + done.stderr
    return done.returncode == 0 and HOST_PASSED in done.stdout and HOST_FAILED not in said


class RetryVictims:
    def __init__(self, home: Path, project: Path) -> None:
        self.home = home
        self.project = project
        self.run_id = ""
        self._lock = threading.Lock()
        self._seen: set[str] = set()
        #: The proxy sequence number of the specialist's dropped request.
        self.first_seq = 0
        #: The slots the first drop may have hit (the ledger says which failed).
        self.first_candidates: set[str] = set()
        self.gate: Gate | None = None
        self.final: FinalDrop | None = None
        #: Times the host check ran and did not pass (no drop then).
        self.host_refusals = 0
        #: The first exception a selector call met ("": none).
        self.error = ""

    def __call__(self, seq: int) -> Fault | None:
        with self._lock:
            try:
                with contextlib.closing(open_for_reading(self.home)) as ledger:
                    return self._decide(ledger, seq)
            except Exception as exc:  # reported as the flow's error (FAIL-runtime), never hidden
                self.error = self.error or f"the selector failed at request {seq}: {type(exc).__name__}: {exc}"
                return None

    def _decide(self, ledger: Ledger, seq: int) -> Fault | None:
        # Every row of the home (the flow's one tree): a request may arrive before the
        # suite learnt the root's run id from `corral run`, and it must be seen then.
        rows = ledger.all("SELECT p.slot, p.run_id, p.loop_index, r.kind FROM provider_requests p JOIN runs r"
                          " ON p.run_id = r.run_id")
        if not self.run_id:
            roots = ledger.all("SELECT run_id FROM runs WHERE kind = 'root'")
            self.run_id = str(roots[0][0]) if len(roots) == 1 else ""
        new = [row for row in rows if str(row[0]) not in self._seen]
        self._seen.update(str(row[0]) for row in new)
        if not new:
            return None
        if not self.first_seq:
            if all(row[3] == "delegation" and int(row[2]) == 0 and base_slot(str(row[0])) for row in new):
                self.first_seq = seq
                self.first_candidates = {str(row[0]) for row in new}
                return Fault.drop()
            return None
        if self.gate is None:
            self._check_gate(ledger, [str(row[0]) for row in new])
        if (self.final is None and self.run_id and len(new) == 1 and str(new[0][1]) == self.run_id
                and base_slot(str(new[0][0]))):
            return self._final_reply(ledger, str(new[0][0]), int(new[0][2]))
        return None

    def _check_gate(self, ledger: Ledger, new_slots: list[str]) -> None:
        """The victim's retry appeared: it has not been forwarded yet (its own
        selector call, which precedes forwarding, is this one or a later one)."""
        failed = ledger.all("SELECT slot, run_id FROM provider_requests WHERE status = 'failed' AND slot IN"
                            f" ({', '.join('?' * len(self.first_candidates))})", *sorted(self.first_candidates))
        if len(failed) != 1:
            return
        victim_slot, victim_run = str(failed[0][0]), str(failed[0][1])
        retry = next((s for s in new_slots if s.startswith(victim_slot + "-transient-")), None)
        if retry is None:
            return

        def count(sql: str, *args: object) -> int:
            return len(ledger.all(sql, *args))

        self.gate = Gate(
            retry_slot=retry,
            victim_actions=count("SELECT 1 FROM actions WHERE run_id = ?", victim_run),
            victim_receipts=count("SELECT 1 FROM receipts WHERE run_id = ?", victim_run),
            victim_revisions=count("SELECT 1 FROM project_revisions WHERE run_id = ?", victim_run),
            victim_deliveries=count("SELECT 1 FROM deliveries d JOIN delegations g ON d.source_id ="
                                    " g.delegation_id WHERE g.run_id = ?", victim_run),
            root_replies=count("SELECT 1 FROM replies WHERE run_id = ?", self.run_id),
        )

    def _final_reply(self, ledger: Ledger, slot: str, loop_index: int) -> Fault | None:
        deliveries = ledger.all("SELECT d.status, g.repair_of FROM deliveries d LEFT JOIN delegations g ON"
                                " d.source_id = g.delegation_id WHERE d.parent_run_id = ?", self.run_id)
        claimed = [row for row in deliveries if row[0] == "claimed-by-parent"]
        live = ledger.all("SELECT 1 FROM runs WHERE parent_run_id = ? AND status NOT IN"
                          f" ({', '.join('?' * len(ENDED))})", self.run_id, *ENDED)
        replies = ledger.all("SELECT 1 FROM replies WHERE run_id = ?", self.run_id)
        if not claimed or len(claimed) != len(deliveries) or live or replies:
            return None
        if not host_check(self.project):
            self.host_refusals += 1
            return None
        plans = ledger.all("SELECT 1 FROM provider_requests WHERE run_id = ? AND slot != ?", self.run_id, slot)
        self.final = FinalDrop(slot=slot, loop_index=loop_index, claimed=len(claimed),
                               repairs_claimed=sum(1 for row in claimed if row[1] is not None), replies=0,
                               tool_plans=len(plans), host_marker=True)
        return Fault.drop()
