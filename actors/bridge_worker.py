"""The ``bridge_worker`` template: a corral swarm working for an agent-task bridge.

It discovers tasks it may claim, and for each one drives a job through the
ledger (supervisor/bridge/bridge_service.py): claim, start, an ordinary durable corral
run of ``[bridge] agent``, lease renewals while that run lives, and the run's
final reply submitted as the task's Submission.

Every bridge command that changes a fact is an external effect under the same
rule as a tool's: its phase (``claiming``, ``starting``, ``submitting``), with the
exact parameters it will send, is committed in corral's ledger *before* the call,
and the call carries an idempotency key derived from the job. A worker killed
between sending a command and recording its answer sends the very same call
again after its restart, and the bridge returns the committed receipt: never a
second claim or a second Submission.
"""

from __future__ import annotations

import fnmatch
import logging
import os
from typing import Any

import trio

from corral.actors.runtime import ActorContext, is_shutdown
from corral.bridge.client import BridgeCallError, Client
from corral.core import failpoints
from corral.mailbox.protocol import BridgeJobAdvance, BridgeJobOpen, BridgeJobs, BridgeReport, BridgeRunStatus

log = logging.getLogger("corral.bridge_worker")

#: The bridge answers these when our assignment is gone: the job is lost, not retried.
GONE = ("stale", "invalid-state", "forbidden", "not-found")


async def run(ctx: ActorContext) -> int:
    params = ctx.params
    token = os.environ.get(params["token_env"], "")
    if not token:
        await ctx.ask(BridgeReport(problem=f"${params['token_env']} is not set: no bridge token"))
        await ctx.shutdown.wait()
        return 0
    worker = Worker(ctx, Client(params["url"], token, timeout=30.0))

    async def listen() -> None:
        async for envelope in ctx.channel.inbox:
            if is_shutdown(envelope):
                ctx.shutdown.set()
                return

    async with trio.open_nursery() as nursery:
        nursery.start_soon(listen)
        with trio.CancelScope() as scope:
            nursery.start_soon(_cancel_on_shutdown, ctx, scope)
            await worker.loop()
        nursery.cancel_scope.cancel()
    return 0


async def _cancel_on_shutdown(ctx: ActorContext, scope: trio.CancelScope) -> None:
    await ctx.shutdown.wait()
    scope.cancel()


class Worker:
    def __init__(self, ctx: ActorContext, client: Client) -> None:
        self.ctx = ctx
        self.client = client
        self.titles: list[str] = list(ctx.params["titles"])
        self.lease_ms = int(ctx.params["lease_ms"])
        self.poll_s = float(ctx.params["poll_s"])

    async def bridge(self, method: str, **params: Any) -> dict[str, Any]:
        return await trio.to_thread.run_sync(lambda: self.client.call(method, **params))

    async def loop(self) -> None:
        while True:
            jobs = (await self.ctx.ask(BridgeJobs())).jobs
            for job in jobs:  # unfinished after a restart: the same calls, the same keys
                await self.drive(job)
            try:
                task = await self.next_task()
                # The attempt at the task (its submissions so far) names its corral
                # run: another node that claims it later gets the same run.
                attempt = None if task is None else len(
                    (await self.bridge("task.get", task_id=task["task_id"]))["submissions"])
            except (BridgeCallError, OSError) as exc:
                log.warning("bridge unreachable or refusing: %s", exc)
                task = None
            if task is None:
                await trio.sleep(self.poll_s)
                continue
            opened = BridgeJobOpen(
                task_id=task["task_id"], title=task["title"], revision=task["revision"], attempt=attempt
            )
            await self.drive((await self.ctx.ask(opened)).job)

    async def next_task(self) -> dict[str, Any] | None:
        for task in (await self.bridge("task.discover"))["tasks"]:
            if any(fnmatch.fnmatchcase(task["title"], pattern) for pattern in self.titles):
                return dict(task)
        return None

    async def advance(
        self,
        job: dict[str, Any],
        phase: str,
        *,
        assignment_id: str | None = None,
        binding_id: str | None = None,
        bridge_run_id: str | None = None,
        submission_id: str | None = None,
        reply: str | None = None,
        reason: str | None = None,
        revision: int | None = None,
    ) -> dict[str, Any]:
        """The job's next phase, committed with the facts its bridge call will send."""
        change = BridgeJobAdvance(
            job_id=job["job_id"],
            phase=phase,
            assignment_id=assignment_id,
            binding_id=binding_id,
            bridge_run_id=bridge_run_id,
            submission_id=submission_id,
            reply=reply,
            reason=reason,
            revision=revision,
        )
        answer = await self.ctx.ask(change)
        return dict(answer.job)

    async def drive(self, job: dict[str, Any]) -> None:
        key = job["job_id"]
        try:
            if job["phase"] == "claiming":
                binding = await self.bridge("binding.enable", idempotency_key=f"{key}.binding")
                claimed = await self.bridge("assignment.claim", idempotency_key=f"{key}.claim",
                                            task_id=job["task_id"], expected_revision=job["revision"],
                                            binding_id=binding["binding"]["binding_id"], lease_ms=self.lease_ms)
                job = await self.advance(job, "claimed", assignment_id=claimed["assignment"]["assignment_id"],
                                         binding_id=binding["binding"]["binding_id"], revision=claimed["revision"])
            if job["phase"] == "claimed":
                job = await self.advance(job, "starting")
            if job["phase"] == "starting":
                started = await self.bridge("run.start", idempotency_key=f"{key}.start", task_id=job["task_id"],
                                            expected_revision=job["revision"], assignment_id=job["assignment_id"])
                # The supervisor starts the corral run in the same step.
                job = await self.advance(job, "running", bridge_run_id=started["run"]["run_id"],
                                         revision=started["revision"])
            if job["phase"] == "running":
                job = await self.run_to_end(job)
            if job["phase"] == "submitting":
                submitted = await self.bridge("run.submit", idempotency_key=f"{key}.submit", task_id=job["task_id"],
                                              expected_revision=job["revision"], run_id=job["bridge_run_id"],
                                              result={"summary": job["reply"]})
                failpoints.hit("bridge.after-submit-sent")
                await self.advance(job, "submitted", submission_id=submitted["submission"]["submission_id"],
                                   revision=submitted["revision"])
            elif job["phase"] == "releasing":
                await self.bridge("assignment.release", idempotency_key=f"{key}.release", task_id=job["task_id"],
                                  expected_revision=job["revision"], assignment_id=job["assignment_id"],
                                  reason=job["reason"] or "the corral run did not complete")
                await self.advance(job, "released")
        except BridgeCallError as exc:
            if exc.reason in GONE or exc.reason == "revision-conflict":
                await self.advance(job, "lost", reason=f"{exc.reason}: {exc.message}"[:500])
            else:
                raise

    async def run_to_end(self, job: dict[str, Any]) -> dict[str, Any]:
        """Wait for the corral run, renewing the lease at a third of it; then record
        what is to be submitted (or released), with the revision it will name."""
        renew_every = self.lease_ms / 3000
        renewals = 0
        while True:
            status = await self.ctx.ask(BridgeRunStatus(job_id=job["job_id"], wait_s=renew_every))
            if status.done:
                break
            renewals += 1
            task = (await self.bridge("task.get", task_id=job["task_id"]))["task"]
            renewed = await self.bridge("assignment.renew", idempotency_key=f"{job['job_id']}.renew.{renewals}",
                                        task_id=job["task_id"], expected_revision=task["revision"],
                                        assignment_id=job["assignment_id"], lease_ms=self.lease_ms)
            job = await self.advance(job, "running", revision=renewed["revision"])
        current = (await self.bridge("task.get", task_id=job["task_id"]))["task"]["revision"]
        if status.status == "completed":
            return await self.advance(job, "submitting", reply=status.final_reply or "", revision=current)
        return await self.advance(job, "releasing", reason=f"the corral run ended {status.status}",
                                  revision=current)
