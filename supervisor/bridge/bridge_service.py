"""Jobs taken from an agent-task bridge (``[bridge]``, actors/bridge_worker.py).

A job's phase is committed before the bridge call it leads to, with what that
call will send (the revision it names, the reply it submits): the durable action
lifecycle applied to the bridge's commands, whose idempotency keys make a
re-sent call safe. One transition table; an illegal move is refused.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import trio

from corral.mailbox.protocol import (
    Ack,
    BridgeJob,
    BridgeJobAdvance,
    BridgeJobList,
    BridgeJobOpen,
    BridgeJobs,
    BridgeReport,
    BridgeRunState,
    BridgeRunStatus,
)
from corral.supervisor.bridge.bridge_spec import BridgeSpec
from corral.supervisor.errors import BadRequest, NotFound, Refused
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.runs.run_service import RunService
from corral.supervisor.runs.run_state import TERMINAL
from corral.supervisor.runs.run_views import ELSEWHERE_POLL_S
from corral.supervisor.service_part import ServicePart

if TYPE_CHECKING:
    from corral.supervisor.daemon import Supervisor
    from corral.supervisor.tree.supervision_tree import ActorSlot

log = logging.getLogger("corral.bridge")

PHASES: dict[str, frozenset[str]] = {
    "claiming": frozenset({"claimed", "lost"}),
    "claimed": frozenset({"starting", "lost"}),
    "starting": frozenset({"running", "lost"}),
    "running": frozenset({"running", "submitting", "releasing", "lost"}),  # running -> running: a renewal
    "submitting": frozenset({"submitted", "lost"}),
    "releasing": frozenset({"released", "lost"}),
    "submitted": frozenset(),
    "released": frozenset(),
    "lost": frozenset(),
}
FINISHED = frozenset(phase for phase, onward in PHASES.items() if not onward)


class BridgeService:
    def __init__(
        self,
        ledger: Ledger,
        runs: RunService,
        next_commit: Callable[[], Awaitable[None]],
        bridge: BridgeSpec | None,
    ) -> None:
        self.ledger = ledger
        #: Starts a job's corral run.
        self.runs = runs
        #: Returns after the ledger's next commit: what a wait for a run's end re-reads on.
        self.next_commit = next_commit
        #: ``[bridge]`` of the spec (None: no bridge is configured).
        self.bridge = bridge

    def _check_worker(self, slot: ActorSlot) -> None:
        if slot.spec.template != "bridge_worker":
            raise Refused("only the bridge worker may drive bridge jobs")

    def _job(self, job_id: str) -> dict[str, Any]:
        row = self.ledger.one("SELECT * FROM bridge_jobs WHERE job_id = ?", job_id)
        if row is None:
            raise NotFound(f"no bridge job {job_id!r}")
        return dict(row)

    async def jobs(self, slot: ActorSlot, request: BridgeJobs) -> BridgeJobList:
        self._check_worker(slot)
        marks = ",".join("?" * len(FINISHED))
        rows = self.ledger.all(
            f"SELECT * FROM bridge_jobs WHERE phase NOT IN ({marks}) ORDER BY created_at", *sorted(FINISHED)
        )
        return BridgeJobList(jobs=[dict(row) for row in rows])

    async def job_open(self, slot: ActorSlot, request: BridgeJobOpen) -> BridgeJob:
        """A job for a task the worker is about to claim (its unfinished one, if any)."""
        self._check_worker(slot)
        task_id, title, revision = request.task_id, request.title, request.revision
        # Which attempt at the task this is (its submissions so far: a rejection
        # opens a redo, which is a new run); None from a worker that does not say.
        attempt = request.attempt
        marks = ",".join("?" * len(FINISHED))
        row = self.ledger.one(
            f"SELECT * FROM bridge_jobs WHERE task_id = ? AND phase NOT IN ({marks})", task_id, *sorted(FINISHED)
        )
        if row is not None:
            return BridgeJob(job=dict(row))
        job_id = "job-" + secrets.token_hex(8)
        now = time.time()
        assert self.bridge is not None
        run_id = None if attempt is None else task_run_id(self.bridge.url, task_id, attempt)
        with self.ledger.tx() as db:
            db.execute(
                "INSERT INTO bridge_jobs (job_id, task_id, title, phase, revision, run_id, created_at, updated_at)"
                " VALUES (?, ?, ?, 'claiming', ?, ?, ?, ?)",
                (job_id, task_id, title, revision, run_id, now, now),
            )
            self.ledger.event("bridge-job-claiming", job_id, task=task_id)
        return BridgeJob(job=self._job(job_id))

    async def job_advance(self, slot: ActorSlot, request: BridgeJobAdvance) -> BridgeJob:
        self._check_worker(slot)
        job = self._job(request.job_id)
        phase = request.phase
        if phase not in PHASES[job["phase"]]:
            raise BadRequest(f"bridge job {job['job_id']} cannot go from {job['phase']} to {phase!r}")
        sets: dict[str, Any] = request.facts()
        if phase == "running" and job["phase"] == "starting":
            sets["run_id"] = await self._start_run(job)
        assignments = ", ".join(f"{name} = ?" for name in sets)
        with self.ledger.tx() as db:
            db.execute(
                f"UPDATE bridge_jobs SET phase = ?, updated_at = ?{', ' + assignments if sets else ''}"
                " WHERE job_id = ?",
                (phase, time.time(), *sets.values(), job["job_id"]),
            )
            if phase != job["phase"]:
                self.ledger.event(f"bridge-job-{phase}", job["job_id"], task=job["task_id"],
                                  reason=str(sets.get("reason", "")))
        return BridgeJob(job=self._job(job["job_id"]))

    async def _start_run(self, job: dict[str, Any]) -> str:
        """The task as an ordinary durable corral run. Its id follows from the task
        and the attempt (``task_run_id``), so a repeated step finds the same run,
        and so does another node of a cluster that claims the same task later (its
        run id is claimed cluster-wide): never a second run for one attempt. A job
        opened without its attempt keeps an id of its own, as before."""
        bridge = self.bridge
        assert bridge is not None
        run_id = job["run_id"] or "run-" + job["job_id"][4:]
        created = await self.runs.create({"agent_id": bridge.agent, "task": job["title"], "run_id": run_id})
        return str(created["run_id"])

    async def run_status(self, slot: ActorSlot, request: BridgeRunStatus) -> BridgeRunState:
        """The job's corral run: done or not, waiting up to ``wait_s`` for it to end."""
        self._check_worker(slot)
        job = self._job(request.job_id)
        with trio.move_on_after(request.wait_s):
            while True:
                row = self.ledger.one("SELECT status FROM runs WHERE run_id = ?", job["run_id"])
                if row is not None and row["status"] not in TERMINAL:
                    await self.next_commit()
                    continue
                # A cluster node may have queued it, and another node runs it: no
                # commit here tells when it moves, so it is read again a while later.
                away = self.ledger.run_elsewhere(job["run_id"]) if row is None else None
                if away is None or away["status"] in TERMINAL:
                    break
                await trio.sleep(ELSEWHERE_POLL_S)
        row = self.ledger.one("SELECT status FROM runs WHERE run_id = ?", job["run_id"])
        if row is None:
            away = self.ledger.run_elsewhere(job["run_id"])
            if away is not None:
                return BridgeRunState(done=away["status"] in TERMINAL, status=away["status"],
                                      final_reply=away.get("final_reply"))
        reply = self.ledger.one("SELECT text FROM replies WHERE run_id = ?", job["run_id"])
        status = row["status"] if row is not None else "missing"
        return BridgeRunState(done=status in TERMINAL or row is None, status=status,
                              final_reply=reply["text"] if reply else None)

    async def report(self, slot: ActorSlot, request: BridgeReport) -> Ack:
        self._check_worker(slot)
        problem = request.problem
        log.warning("bridge worker: %s", problem)
        self.ledger.event("bridge-problem", slot.id, problem=problem)
        return Ack()

    def status_section(self) -> dict[str, Any]:
        rows = self.ledger.all("SELECT phase, COUNT(*) AS n FROM bridge_jobs GROUP BY phase")
        return {row["phase"]: int(row["n"]) for row in rows}


def task_run_id(bridge_url: str, task_id: str, attempt: int) -> str:
    """The corral run of attempt ``attempt`` at a bridge's task: the same on every
    node (and after any restart), another for a redo after a rejection."""
    digest = hashlib.sha256(f"{bridge_url}\n{task_id}\n{attempt}".encode()).hexdigest()[:24]
    return f"run-bt-{digest}"


class BridgePart(ServicePart):
    """The bridge's section of ``corral status``, when the spec has one."""

    status_name = "bridge"

    def __init__(self, service: BridgeService) -> None:
        self.service = service

    def status(self) -> Any:
        return self.service.status_section()


def install(sup: Supervisor) -> BridgeService:
    service = BridgeService(sup.ledger, sup.runs, sup.next_commit, sup.spec.bridge)
    sup.methods.bridge = service
    return service
