"""The transient-retry flow (seed 004 V1.29, V1.42): a fault proxy in front of a real
OpenAI-compatible server drops a specialist's first provider call, holds its retry at
a forwarding gate until the ledger was read, and drops the supervisor's base final
reply once every delivery is claimed and the host's own check passed
(retry_selector.py). Each drop is a transient provider error with one retry and a
``retry_at`` in the ledger; the suite SIGKILLs the supervisor inside each backoff,
checks the attempt and ``retry_at`` survived, restarts it, and expects exactly one
retry per drop and exactly one final reply. The facts of the two specialists (same
batch, overlap in time) and of the repair are read from the ledger afterwards."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from corral.acceptance import specs
from corral.acceptance.fault_proxy import FaultProxy
from corral.acceptance.host import DONE, Host, HostError
from corral.acceptance.llama_server import ServerFailed, llama_server
from corral.acceptance.loopback_http import serve_in_thread
from corral.acceptance.overlap import intervals_of, max_concurrent
from corral.acceptance.provider import LocalModel, Provider, ServerModel, has_llama_server
from corral.acceptance.retry_selector import HOST_CHECK, HOST_FAILED, HOST_PASSED, RetryVictims
from corral.acceptance.workspace import Workspace
from corral.core.errors import CorralError
from corral.supervisor.home import home_dir as homes
from corral.supervisor.ledger.ledger_spec import open_for_reading

RUN_TIMEOUT_S = 1800.0
#: A hang guard, not a speed check: three agents share one CPU model server, a
#: provider call can take minutes, and the final reply comes after a dozen of them.
WAIT_S = 1800.0


@dataclass
class Backoff:
    """One dropped request's failed attempt, before the kill and after the restart."""

    slot: str
    attempt: int
    retry_at: float
    survived: bool = False
    #: The SIGKILL landed before retry_at (the ledger's clock is the wall clock).
    killed_in_backoff: bool = False


@dataclass
class RetryFacts:
    home: Path
    blocked: str = ""
    run_id: str = ""
    error: str = ""
    final_status: str = ""
    #: The specialist's dropped first call (V1.29) and the root's final reply (V1.42).
    plan: Backoff | None = None
    final: Backoff | None = None
    #: Whether the root ever claimed a delivery (the final-reply drop needs one).
    claimed: bool = False
    #: Transient successors per base slot, every run of the tree.
    retries: dict[str, int] = field(default_factory=dict)
    failed: int = 0
    replies: int = 0
    injected: int = 0
    # -- V1.29 ------------------------------------------------------------------------
    #: The dropped first call's slot and run, and whether that run is a delegated specialist's.
    first_victim_slot: str = ""
    first_victim_run: str = ""
    first_victim_specialist: bool = False
    #: The victim's retry waited before the upstream while the ledger was read.
    gate_held: bool = False
    gate_checked: bool = False
    #: What that read found that must be 0 (the victim's actions, receipts, revisions,
    #: deliveries, the root's replies) plus 1 if the dropped request reached the upstream.
    gate_drift: int = 0
    #: Distinct specialists delegated (not repairs), in one provider batch, and the
    #: most of them with a provider request in flight at one instant.
    specialists: int = 0
    specialists_same_batch: bool = False
    specialists_overlap: int = 0
    repairs: int = 0
    #: POSTs the proxy saw, and provider lifecycles in the ledger: a POST no lifecycle
    #: accounts for was sent without its durable record (fewer POSTs can happen: a
    #: kill between a lifecycle's commit and its send).
    proxy_posts: int = 0
    lifecycles: int = 0
    #: Deliveries of the root claimed (the seed: 2 initial + 1 repair), the claims
    #: that took them, and targeted contract reads (agent.run_status with a delegation_id).
    deliveries_claimed: int = 0
    claims: int = 0
    contract_reads: int = 0
    # -- V1.42 ------------------------------------------------------------------------
    final_victim_root: bool = False
    #: The victim's slot is ``<run>:<loop>``: no retry, repair or interrupted suffix.
    final_victim_base: bool = False
    final_victim_loop: int = -1
    #: The loop whose plan is the root's final reply (-1: none).
    reply_loop: int = -1
    claimed_at_injection: int = 0
    repairs_claimed_at_injection: int = 0
    replies_at_injection: int = 0
    host_marker: bool = False
    #: Times the host's check did not pass when a final reply was due (no drop then).
    host_refusals: int = 0
    #: The root's tool-plan lifecycles before the drop and, at the end, those of loops
    #: other than the reply's: equal when the drop added no tool plan.
    tool_plans_at_injection: int = 0
    tool_plans_at_end: int = 0


def missing(provider: Provider) -> str:
    if isinstance(provider, LocalModel) and not has_llama_server():
        return "no llama_cpp.server (pip install 'corral[local-server]'): the fault proxy needs an HTTP route"
    return ""


@contextlib.contextmanager
def _route(provider: Provider, log: Path) -> Iterator[ServerModel]:
    """The OpenAI-compatible server the proxy fronts: the user's, or llama_cpp.server
    on the local model's GGUF for as long as the flow lasts."""
    if isinstance(provider, ServerModel):
        yield provider
        return
    with llama_server(provider.file, log) as url:
        yield ServerModel(url, provider.name, structured="json_object")


def retry_flow(workspace: Workspace, host: Host, provider: Provider) -> RetryFacts:
    facts = RetryFacts(workspace.home("retry"), blocked=missing(provider))
    if facts.blocked:
        return facts
    project = workspace.project("retry-project")
    (project / HOST_CHECK).write_text(HOST_CHECK_SOURCE)
    selector = RetryVictims(facts.home, project)
    try:
        with _route(provider, workspace.log("llama-server.log")) as route:
            proxy = FaultProxy(route.url, selector=selector)
            with serve_in_thread(proxy) as proxy_url:
                spec = workspace.root / "retry.toml"
                spec.write_text(specs.retry_spec(route.through(proxy_url), str(project)))
                _drive(host, facts, spec, selector)
            facts.injected = sum(1 for record in proxy.requests if record.fault)
            facts.proxy_posts = sum(1 for record in proxy.requests if record.method == "POST")
            dropped_forwarded = any(r.seq == selector.first_seq and r.forwarded for r in proxy.requests)
            _selected(facts, selector, dropped_forwarded)
            if selector.error:
                raise HostError(selector.error)
        if facts.run_id:
            _gather(facts)
    except (HostError, CorralError, ServerFailed, OSError, ValueError, KeyError) as exc:
        facts.error = f"{type(exc).__name__}: {exc}"[:500]
    with contextlib.suppress(HostError):
        host.down(facts.home)
    return facts


#: The project's end-to-end check (the seed's ``node verify-e2e.mjs``): both
#: specialists' files are there and not empty.
HOST_CHECK_SOURCE = f"""import pathlib
wanted = [pathlib.Path("research/facts.md"), pathlib.Path("review/check.md")]
ok = all(p.is_file() and p.read_text().strip() for p in wanted)
print("{HOST_PASSED}" if ok else "{HOST_FAILED}")
"""


def _drive(host: Host, facts: RetryFacts, spec: Path, selector: RetryVictims) -> None:
    home = facts.home
    host.up(home, spec)
    ran = host.cli(home, "run", "--agent", "project-supervisor", "--task", specs.RETRY_TASK, "--json")
    if ran.returncode != 0:
        raise HostError(f"`corral run` exited {ran.returncode}: {ran.stderr.strip()[-300:]}")
    facts.run_id = json.loads(ran.stdout)["run_id"]
    facts.plan = _kill_in_backoff(host, home, facts.run_id, after=0.0, tree=True)
    # The final-reply drop comes only once every delivery was claimed; else the run just ends.
    facts.final = _kill_in_backoff(host, home, facts.run_id, after=facts.plan.retry_at if facts.plan else 0.0,
                                   tree=False)
    facts.final_status = host.wait_run(home, facts.run_id, DONE, RUN_TIMEOUT_S)["run"]["status"]


def _failed_attempt(home: Path, run_id: str, after: float, tree: bool) -> Backoff | None:
    """The first failed attempt with a retry after ``after``, of any run of the tree
    (``tree``) or of the root run alone."""
    whose = "r.root_run_id" if tree else "r.run_id"
    with contextlib.closing(open_for_reading(home)) as ledger:
        rows = ledger.all("SELECT p.slot, p.attempt, p.retry_at FROM provider_requests p JOIN runs r ON p.run_id ="
                          f" r.run_id WHERE {whose} = ? AND p.status = 'failed' AND p.retry_at IS NOT NULL AND"
                          " p.retry_at > ? ORDER BY p.started_at", run_id, after)
    return Backoff(rows[0][0], int(rows[0][1]), float(rows[0][2])) if rows else None


def _kill_in_backoff(host: Host, home: Path, run_id: str, after: float, tree: bool) -> Backoff | None:
    """Wait (on the event stream) for a failed attempt with a retry_at, or for the run
    to end; on the attempt, SIGKILL the supervisor, restart it, and check the attempt
    and its retry_at are what they were."""
    from corral import client

    with client.Client.connect(home) as connected:
        cursor = 0
        for _ in range(int(WAIT_S / 5)):
            backoff = _failed_attempt(home, run_id, after, tree)
            if backoff is not None:
                break
            if connected.call("show", run_id=run_id)["run"]["status"] in DONE:
                return None
            cursor = connected.call("events", timeout=15, since=cursor, wait_ms=5000)["cursor"]
        else:
            raise HostError(f"no provider retry was scheduled within {WAIT_S:.0f} s")
    pid = homes.read_endpoint(home).pid
    os.kill(pid, signal.SIGKILL)
    backoff.killed_in_backoff = time.time() < backoff.retry_at
    from corral.core.procs import wait_exit

    if not wait_exit(pid, 30):
        raise HostError("the supervisor outlived its SIGKILL")
    host.up(home, None)
    again = _failed_attempt(home, run_id, after, tree)
    backoff.survived = again is not None and (again.slot, again.attempt, again.retry_at) == (
        backoff.slot, backoff.attempt, backoff.retry_at)
    return backoff


def _selected(facts: RetryFacts, selector: RetryVictims, dropped_forwarded: bool) -> None:
    """What the selector saw when it chose and gated (retry_selector.py)."""
    if selector.gate is not None:
        facts.gate_held = facts.gate_checked = True
        facts.gate_drift = selector.gate.drift()
    facts.gate_drift += int(dropped_forwarded)
    facts.host_refusals = selector.host_refusals
    final = selector.final
    if final is not None:
        # The selector drops only the root's requests; the retry scheduled must be that one.
        facts.final_victim_root = facts.final is not None and facts.final.slot == final.slot
        facts.final_victim_base = final.slot == f"{facts.run_id}:{final.loop_index}"
        facts.final_victim_loop = final.loop_index
        facts.claimed_at_injection = final.claimed
        facts.repairs_claimed_at_injection = final.repairs_claimed
        facts.replies_at_injection = final.replies
        facts.host_marker = final.host_marker
        facts.tool_plans_at_injection = final.tool_plans
    if facts.plan is not None and facts.plan.slot.split("-transient-")[0] in selector.first_candidates:
        facts.first_victim_slot = facts.plan.slot.split("-transient-")[0]


def _gather(facts: RetryFacts) -> None:
    root = facts.run_id
    with contextlib.closing(open_for_reading(facts.home)) as ledger:
        rows = ledger.all("SELECT p.slot, p.status, p.run_id, p.loop_index, p.started_at, p.finished_at FROM"
                          " provider_requests p JOIN runs r ON p.run_id = r.run_id WHERE r.root_run_id = ?", root)
        facts.replies = len(ledger.all("SELECT run_id FROM replies WHERE run_id = ?", root))
        facts.claimed = bool(ledger.all("SELECT 1 FROM deliveries WHERE parent_run_id = ? AND status ="
                                        " 'claimed-by-parent'", root))
        delegations = ledger.all("SELECT g.target_agent, g.run_id, g.repair_of, a.loop_index FROM delegations g"
                                 " JOIN actions a ON g.parent_action_id = a.action_id WHERE g.parent_run_id = ?",
                                 root)
        plans = ledger.all("SELECT loop_index, plan FROM plans WHERE run_id = ?", root)
        kinds = dict(ledger.all("SELECT run_id, kind FROM runs WHERE root_run_id = ?", root))
        facts.deliveries_claimed = len(ledger.all("SELECT 1 FROM deliveries WHERE parent_run_id = ? AND status ="
                                                  " 'claimed-by-parent'", root))
        facts.claims = len(ledger.all("SELECT 1 FROM claim_journal WHERE parent_run_id = ?", root))
        status_reads = ledger.all("SELECT input FROM actions WHERE run_id = ? AND tool = 'agent.run_status' AND"
                                  " phase = 'ok'", root)
    facts.contract_reads = sum(1 for row in status_reads if '"delegation_id"' in str(row[0]))
    facts.failed = sum(1 for row in rows if row[1] == "failed")
    facts.lifecycles = len(rows)
    for row in rows:
        if "-transient-" in str(row[0]):
            base = str(row[0]).split("-transient-")[0]
            facts.retries[base] = facts.retries.get(base, 0) + 1
    originals = [row for row in delegations if row[2] is None]
    facts.specialists = len({row[0] for row in originals})
    facts.specialists_same_batch = len({row[3] for row in originals}) == 1 and facts.specialists >= 2
    specialist_runs = {str(row[1]) for row in originals}
    spans = intervals_of([(str(row[2]), float(row[4]), row[5]) for row in rows])
    facts.specialists_overlap = max_concurrent({k: v for k, v in spans.items() if k in specialist_runs})
    facts.repairs = sum(1 for row in delegations if row[2] is not None)
    facts.first_victim_run = next((str(row[2]) for row in rows if row[0] == facts.first_victim_slot), "")
    facts.first_victim_specialist = kinds.get(facts.first_victim_run) == "delegation"
    finals = [int(row[0]) for row in plans if json.loads(row[1]).get("final") is not None]
    facts.reply_loop = max(finals, default=-1)
    facts.tool_plans_at_end = sum(1 for row in rows if row[2] == root and int(row[3]) != facts.reply_loop)
